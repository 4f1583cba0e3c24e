"""The run's end is written whatever its cleanups do: a cleanup that raises leaves run.json final
(not ``running``), the cleanups after it still run, and the error goes on to the caller."""

from __future__ import annotations

import errno
import json
import logging
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


def test_a_failed_close_of_the_agents_still_ends_the_record_and_the_trace(tmp_path, monkeypatch):
    from launcher.records.trace import ROOT, RunTrace
    from launcher.transports import TransportSet

    closing = TransportSet.close

    def close_then_fail(self) -> None:  # closed, then a descriptor already gone
        closing(self)
        raise OSError(errno.EBADF, "Bad file descriptor")

    monkeypatch.setattr(TransportSet, "close", close_then_fail)
    with pytest.raises(OSError, match="Bad file descriptor"):
        launch(local=1, command=[sys.executable, TASK, "print:hello"], log_dir=tmp_path / "logs", debug=True,
               on_line=lambda line: None)
    (run_dir,) = (tmp_path / "logs").iterdir()
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "failed" and record["ended_at"], record
    assert record["error"] == "tflaunch's own error: OSError: [Errno 9] Bad file descriptor"
    # The launch's cleanups after it ran too: the trace ended, with the session's last lines in it.
    assert not [h for h in logging.getLogger(ROOT).handlers if isinstance(h, RunTrace)]
    assert "attempt 1 ended: succeeded" in (run_dir / "debug.log").read_text()
