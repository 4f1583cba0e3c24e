"""No two modules of the launcher import each other: a fact two modules share has one owner, which the
other imports. Read from the source with ast, so a lazy import inside a function and a TYPE_CHECKING
import count like any other.

The one exception is a set of objects that live on one I/O thread and must refer to each other; each
pair is listed in ALLOWED with the reason, and its module's docstring says so.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.project

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = ROOT / "launcher"

ALLOWED = {
    # A link, the one thread that serves every link, and the processes started through a link are
    # that thread's objects (launcher/transports/hostlink.py says so).
    ("launcher.transports.hostlink", "launcher.transports.linkhub"),
    ("launcher.transports.hostlink", "launcher.transports.proxies"),
}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, name: str, modules: set[str]) -> set[str]:
    """The launcher's modules ``path`` (module ``name``) imports anywhere in its code: ``from . import x``
    counts as module ``x`` when there is one, else as the package."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                found.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {module for module in found if module in modules and module != name}


def mutual_pairs(root: Path) -> set[tuple[str, str]]:
    """Every pair (a, b), a < b, of modules under ``root``/launcher that import each other."""
    paths = {module_name(path, root): path for path in (root / "launcher").rglob("*.py")}
    graph = {name: imports(path, name, set(paths)) for name, path in paths.items()}
    return {(a, b) for a, targets in graph.items() for b in targets if a < b and a in graph[b]}


def test_no_two_modules_import_each_other():
    found = mutual_pairs(ROOT) - ALLOWED
    assert not found, ("these modules import each other; move what they share to one owner:\n"
                       + "\n".join(f"{a} <-> {b}" for a, b in sorted(found)))


def test_every_allowed_pair_still_imports_each_other():
    # An entry that no longer holds would let a new pair of the same modules in unnoticed.
    assert ALLOWED <= mutual_pairs(ROOT)


def test_a_lazy_or_type_checking_import_back_is_found(tmp_path):
    package = tmp_path / "launcher" / "part"
    package.mkdir(parents=True)
    (tmp_path / "launcher" / "__init__.py").write_text("")
    (package / "__init__.py").write_text('"""part: a.py, b.py, c.py"""\n')
    (package / "a.py").write_text("from .b import B\n")
    (package / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import A\n")
    (package / "c.py").write_text("def f():\n    from . import a\n")
    (tmp_path / "launcher" / "d.py").write_text("from .part import c\n")
    (package / "e.py").write_text("from ..d import x\n")
    assert mutual_pairs(tmp_path) == {("launcher.part.a", "launcher.part.b")}
    (package / "a.py").write_text("from .b import B\nfrom . import c\n")
    assert mutual_pairs(tmp_path) == {("launcher.part.a", "launcher.part.b"), ("launcher.part.a", "launcher.part.c")}
