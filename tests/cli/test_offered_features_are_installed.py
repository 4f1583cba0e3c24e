"""What every run's closing lines and the README offer works after the README's install (`pip install .`):
the packages behind `report --plot` and `--tensorboard` are tflaunch's own dependencies, not extras."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
# A feature offered to every user, and the distribution it needs.
OFFERED = {"tflaunch report --plot (the closing summary's hint)": "matplotlib",
           "tflaunch --local 2 --tensorboard (README)": "tensorboard"}


def test_what_is_offered_is_installed_by_the_readme_command():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {re.split(r"[<>=!~\[; ]", requirement, 1)[0].lower() for requirement in project["dependencies"]}
    for feature, needed in OFFERED.items():
        assert needed in core, f"{feature} needs {needed}, which 'pip install .' does not install"
    readme = (ROOT / "README.md").read_text()
    assert "--tensorboard" in readme and ".venv/bin/pip install . &&" in readme
    # No extra left that names what the core already installs, nor a hint at one.
    extras = project.get("optional-dependencies", {})
    assert not {"plot", "tensorboard"} & set(extras), extras
    for name, requirements in extras.items():
        assert not {r.split(">")[0].lower() for r in requirements} & set(OFFERED.values()), name
