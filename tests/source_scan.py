"""Reading the launcher's own source, for the tests that hold a fact to its one owner: which modules
are the launcher's (the programs shipped to hosts apart) and which strings their code holds."""

from __future__ import annotations

import ast
from pathlib import Path

LAUNCHER = Path(__file__).resolve().parent.parent / "launcher"
# Programs shipped to hosts as standalone source, which import nothing of the launcher.
SHIPPED = frozenset({*(LAUNCHER / "agent").glob("*.py"), LAUNCHER / "cluster" / "probe.py",
                     LAUNCHER / "cluster" / "mesh_probe.py"})


def launcher_modules() -> list[Path]:
    """Every module of the launcher but the shipped programs, in a stable order."""
    return sorted(p for p in LAUNCHER.rglob("*.py") if p not in SHIPPED)


def code_strings(tree: ast.AST) -> list[ast.Constant]:
    """Every string constant of a module's code, f-string parts included, docstrings left out."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return [node for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]
