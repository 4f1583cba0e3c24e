"""Every name a test imports from launcher/ or trainer/ exists, in tests that cannot run here too.

A test skipped on this machine (``gpu``) or an import inside a test function is not imported when
the suite runs, so a module moved or renamed under it would show only on the host that runs it.
This reads every test file's imports of the project's packages and resolves each one.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

pytestmark = pytest.mark.project
TESTS = Path(__file__).resolve().parents[1]
PACKAGES = ("launcher", "trainer")
HEAVY = ("trainer",)  # importing the trainer's modules loads TensorFlow: checked as files, not imported


def project_imports(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, module, name or None) for each import of the project's packages in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] in PACKAGES:
            found += [(node.lineno, node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, None) for alias in node.names if alias.name.split(".")[0] in PACKAGES]
    return found


def module_file(module: str) -> Path | None:
    base = TESTS.parent.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def defined_names(path: Path) -> set[str]:
    """The names a module binds anywhere: assignments, functions, classes and imports."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Assign):
            names |= {target.id for target in node.targets if isinstance(target, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {alias.asname or alias.name for alias in node.names}
    return names


def missing(module: str, name: str | None) -> str | None:
    """Why ``from module import name`` (or ``import module``) would fail, or None."""
    if module.split(".")[0] in HEAVY:
        path = module_file(module)
        if path is None:
            return f"no module {module}"
        if name is None or module_file(f"{module}.{name}") is not None:
            return None
        return None if name in defined_names(path) else f"{module} has no {name}"
    try:
        imported = importlib.import_module(module)
    except ImportError as exc:
        return f"no module {module} ({exc})"
    if name is None or hasattr(imported, name):
        return None
    try:
        importlib.import_module(f"{module}.{name}")
    except ImportError:
        return f"{module} has no {name}"
    return None


def test_every_project_name_a_test_imports_exists():
    problems = []
    for path in sorted(TESTS.rglob("*.py")):
        for line, module, name in project_imports(path):
            why = missing(module, name)
            if why:
                problems.append(f"{path.relative_to(TESTS.parent)}:{line}: {why}")
    assert not problems, "\n".join(problems)
