"""The run's end is written whatever its cleanups do: a cleanup that raises leaves run.json final
(not ``running``), the cleanups after it still run, and the error goes on to the caller."""

from __future__ import annotations

import json
import sys

import pytest

from conftest import TASK
from launcher import launch
from launcher.run.faults import stacks_server

pytestmark = pytest.mark.timeout(120)


def test_a_cleanup_that_raises_leaves_the_record_final_and_the_other_cleanups_run(tmp_path, monkeypatch):
    closing = stacks_server.ControlServer.close

    def close_then_fail(self) -> None:  # the control socket's cleanup, the first of the run's, fails
        closing(self)
        raise RuntimeError("the control socket could not be closed")

    monkeypatch.setattr(stacks_server.ControlServer, "close", close_then_fail)
    lines: list[str] = []
    with pytest.raises(RuntimeError, match="the control socket could not be closed"):
        launch(local=2, command=[sys.executable, TASK, "print:hello", "sleep:0.3"], log_dir=tmp_path / "logs",
               on_line=lines.append)
    (run_dir,) = (tmp_path / "logs").iterdir()
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "failed" and record["exit_code"] == 1 and record["ended_at"], record
    assert record["error"] == "tflaunch's own error: RuntimeError: the control socket could not be closed"
    assert [(t["name"], t["state"]) for t in record["tasks"]] == [("worker-0", "succeeded"), ("worker-1", "succeeded")]
    # The cleanups after it ran: the resource sampler wrote its figures, the pump its last message.
    assert (run_dir / "resources.json").exists()
    assert not (run_dir / "control.sock").exists()
