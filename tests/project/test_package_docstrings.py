"""Every package of the launcher says what it holds: its ``__init__.py`` docstring names each of its
modules and sub-packages, so that a package docstring never leaves a new module out, and a module
renamed or moved away shows up as one its new package does not name.

A module is named by its file name (``name.py``) or a reference to it (:mod:`.name`, ``~.name.Thing``
or its dotted path); a sub-package by ``name/`` or a reference to it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.project

LAUNCHER = Path(__file__).resolve().parents[2] / "launcher"


def unnamed(package: Path) -> list[str]:
    """The modules and sub-packages of ``package`` its docstring does not name."""
    docstring = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    modules = [(path.stem, f"{path.name}") for path in package.glob("*.py") if path.name != "__init__.py"]
    packages = [(path.name, f"{path.name}/") for path in package.iterdir() if (path / "__init__.py").is_file()]

    def named(stem: str, file_name: str) -> bool:
        return file_name in docstring or re.search(rf"[`~]\.{stem}\b|\b{package.name}\.{stem}\b", docstring) is not None

    return sorted(file_name for stem, file_name in modules + packages if not named(stem, file_name))


PACKAGES = sorted(init.parent for init in LAUNCHER.rglob("__init__.py"))


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: str(p.relative_to(LAUNCHER.parent)))
def test_a_package_docstring_names_every_module_of_its_package(package):
    missing = unnamed(package)
    assert not missing, f"{package.relative_to(LAUNCHER.parent)}/__init__.py's docstring does not name: {', '.join(missing)}"


def test_a_module_left_out_is_named(tmp_path):
    (tmp_path / "__init__.py").write_text('"""The parts: a.py holds A; sub/ the rest."""\n')
    (tmp_path / "a.py").write_text("")
    (tmp_path / "b.py").write_text("")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "__init__.py").write_text("")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "__init__.py").write_text("")
    assert unnamed(tmp_path) == ["b.py", "other/"]
