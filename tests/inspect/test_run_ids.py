"""A run is named by its id, a unique prefix of it (its start time) or a unique suffix (its random
part), in every command that takes RUN; an ambiguous part lists the runs it matches."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.errors import RunNotFoundError
from launcher.inspect.runs import resolve_run

ROOT = Path(__file__).resolve().parents[2]
IDS = ("20261125-101500-ab12", "20261125-101500-cd34", "20261126-090000-ef12")


def finished_runs(log_dir: Path) -> Path:
    for number, run_id in enumerate(IDS):
        (log_dir / run_id).mkdir(parents=True)
        record = {"format_version": 2, "run_id": run_id, "source": "--local 1", "status": "succeeded",
                  "exit_code": 0, "started_at": f"2026-11-2{5 + number}T10:15:0{number}+00:00"}
        (log_dir / run_id / "run.json").write_text(json.dumps(record))
    return log_dir


@pytest.mark.unit
def test_a_unique_suffix_names_a_run_as_a_unique_prefix_does(tmp_path):
    logs = finished_runs(tmp_path / "logs")
    assert resolve_run(logs, "cd34").run_id == "20261125-101500-cd34"
    assert resolve_run(logs, "-ef12").run_id == "20261126-090000-ef12"
    assert resolve_run(logs, "20261126").run_id == "20261126-090000-ef12"
    with pytest.raises(RunNotFoundError, match="run id '12' is ambiguous in .*: it matches "
                                               "20261126-090000-ef12, 20261125-101500-ab12; give more of it"):
        resolve_run(logs, "12")


@pytest.mark.parametrize("args", [["status", "ab12", "--json"], ["report", "ab12", "--json"], ["compare", "ab12", "ef12"],
                                  ["logs", "ab12"]])
def test_every_command_taking_a_run_takes_its_suffix(tmp_path, args):
    logs = finished_runs(tmp_path / "logs")
    (logs / IDS[0] / "merged.log").write_text("worker-0 | one\n")
    done = subprocess.run([sys.executable, "-m", "launcher", *args, "--log-dir", str(logs)], capture_output=True,
                          text=True, timeout=60, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert "no run" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    # report and compare find the run, then say it has no metrics: its id in their message shows which
    assert ("one" in done.stdout) if args[0] == "logs" else (IDS[0] in done.stdout + done.stderr), done.stderr
