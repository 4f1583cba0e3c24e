"""The launcher's layers hold: ``lint-imports`` checks the contracts in .importlinter against the code.

The contracts (layers, the run's own packages, the read side, the run and its transports, the standalone
agent and its protocol module, the pure cluster core, no TensorFlow) are described in docs/architecture.md. The second test breaks a copy of the launcher
on purpose, so that a contract that stopped checking anything would be noticed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.project

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / ".importlinter"


def lint_imports(cwd: Path, python_path: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` on the launcher found on ``python_path``, with the project's contracts."""
    program = Path(sys.executable).with_name("lint-imports")
    if not program.exists():
        found = shutil.which("lint-imports")
        if found is None:
            pytest.fail("lint-imports is not installed: install the test extra (pip install -e '.[test]')")
        program = Path(found)
    env = {**os.environ, "PYTHONPATH": str(python_path), "NO_COLOR": "1", "COLUMNS": "200"}
    return subprocess.run([str(program), "--no-cache", "--no-logo", str(CONFIG)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_every_import_contract_is_kept():
    done = lint_imports(ROOT, ROOT)
    assert done.returncode == 0, f"lint-imports found broken contracts:\n{done.stdout}{done.stderr}"
    assert "0 broken" in done.stdout, done.stdout


@pytest.mark.parametrize("module, line, contract", [
    ("records/folder.py", "from ..run import launch", "Records are the bottom"),
    ("inspect/report.py", "from ..transports import base", "The read side"),
    ("cluster/spec.py", "import socket", "The cluster's spec and plan are pure"),
    ("transports/srun.py", "from . import ssh", "The named transports are independent"),
    ("run/lifecycle/limits.py", "from ...transports import ssh", "never a named transport"),
    ("run/lifecycle/session.py", "from ...transports.linkhub import HUB", "never a named transport"),
    ("export/shell.py", "import tensorflow", "never imports TensorFlow"),
    ("cluster/plan.py", "from ..sources import choose", "Each package imports only the packages below it"),
    ("agent/trees.py", "import psutil", "The agent is standalone"),
    ("agent/ports.py", "from .. import options", "The agent is standalone"),
    ("run/lifecycle/session.py", "from ...agent.loop import Agent", "reaches the agent through its protocol module only"),
    ("transports/local.py", "from ..agent import trees", "reaches the agent through its protocol module only"),
    ("run/output/pump.py", "from ..faults import watchdog", "The run's packages import only the ones below them"),
    ("run/faults/watchdog.py", "from ..lifecycle import session", "The run's packages import only the ones below them"),
    ("run/console/terminal.py", "from ...cluster import spec", "The console shows records only"),
    ("run/checks/preflight.py", "from ..console import chatter", "The checks stand alone"),
    ("run/faults/stragglers.py", "from ..output import pump", "never the pump or the resource sampler"),
    ("run/lifecycle/launch.py", "from ...cluster.ports import reserve_ports", "takes no step of a plan itself"),
])
def test_an_import_that_breaks_a_contract_is_named(tmp_path, module, line, contract):
    copy = tmp_path / "launcher"
    shutil.copytree(ROOT / "launcher", copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / module
    target.write_text(target.read_text() + f"\n{line}  # breaks a contract on purpose\n")
    done = lint_imports(tmp_path, tmp_path)
    assert done.returncode != 0, done.stdout
    broken = [row for row in done.stdout.splitlines() if row.endswith("BROKEN") or "BROKEN (" in row]
    assert any(contract in row for row in broken), done.stdout
