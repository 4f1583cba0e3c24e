"""What tasks write is shown, never obeyed: ``runs``, ``logs`` and ``report`` print every terminal
control character of task-controlled text escaped (``\\x1b``), colour codes in a log excepted."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

# A clipboard write (OSC 52), a window title, a screen clear and a bell, beside a colour code.
HOSTILE = "\x1b]52;c;ZXZpbA==\x07\x1b]0;title\x07\x1b[2J\x07"
# An epoch metric with a key of its own (shown as a column of the report), then the hostile line.
METRIC = 'TFLAUNCH_METRIC {"kind": "epoch", "epoch": 1, "loss": 0.5, "\\u001b]0;key\\u0007": 1}'
TASK = (f"import sys; print({METRIC!r}); print({HOSTILE + 'owned'!r} + ' \\x1b[31mred\\x1b[0m', flush=True); "
        f"sys.exit(3)")


def tflaunch(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher", *args], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)


@pytest.mark.slow
def test_runs_logs_and_report_print_task_text_escaped(tmp_path):
    cluster = tmp_path / "evil\x1b]0;x\x07.yaml"
    cluster.write_text("worker: [localhost:auto]\nisolate_network: false\n")
    ran = tflaunch(tmp_path, "run", str(cluster), "--", "python", "-c", TASK)
    assert ran.returncode == 3, ran.stderr
    outputs = {command: tflaunch(tmp_path, *command.split()) for command in ("runs", "logs", "logs --task worker-0",
                                                                             "report")}
    for command, done in outputs.items():
        assert done.returncode == 0, (command, done.stderr)
        assert "\x07" not in done.stdout and "\x1b]" not in done.stdout and "\x1b[2J" not in done.stdout, command
    assert "\\x1b]0;x\\x07.yaml" in outputs["runs"].stdout
    assert "\\x1b]52;c;ZXZpbA==\\x07" in outputs["logs"].stdout
    assert "\\x1b]52;c;ZXZpbA==\\x07" in outputs["logs --task worker-0"].stdout
    assert "\\x1b]0;KEY\\x07" in outputs["report"].stdout  # a metric key the task chose, as a column


@pytest.mark.unit
def test_a_logs_colour_codes_pass_and_every_other_control_is_escaped():
    from launcher.records.control import escaped

    line = "\x1b[1;31mred\x1b[0m \x1b]0;t\x07\x1b[2J\r\x9b\tend"
    assert escaped(line, colours=True) == "\x1b[1;31mred\x1b[0m \\x1b]0;t\\x07\\x1b[2J\\x0d\\x9b\tend"
    assert escaped(line) == "\\x1b[1;31mred\\x1b[0m \\x1b]0;t\\x07\\x1b[2J\\x0d\\x9b\tend"
