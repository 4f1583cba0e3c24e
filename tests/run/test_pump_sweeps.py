"""The output pump's sweeps read the logs that were written to, not every log it follows."""

from __future__ import annotations

import io

import pytest

from launcher.records.boundedlog import WRITING
from launcher.run import pump as pump_module
from launcher.run.console import Console
from launcher.run.pump import OutputPump

pytestmark = pytest.mark.unit


def test_a_sweep_reads_the_logs_written_to_and_leaves_the_others_for_their_look(tmp_path, monkeypatch):
    monkeypatch.setattr(pump_module, "IDLE_CHECK", 3600.0)  # the look at every log: once, at the first sweep
    console = Console(io.StringIO(), messages=io.StringIO())
    pump = OutputPump(tmp_path / "merged.log", tmp_path / "metrics.jsonl", console)
    paths = [tmp_path / f"worker-{i}.log" for i in range(200)]
    for i, path in enumerate(paths):
        pump.follow(f"worker-{i}", path)
    try:
        pump._sweep()  # the first look at every log: nothing there yet
        WRITING.get(str(paths[150].resolve())).write(b"relayed\n")  # as the transports append a task's output
        with open(paths[7], "ab") as handle:  # another writer: no one tells the pump
            handle.write(b"appended directly\n")
        pump._sweep()
        pump._flush_files()
        merged = (tmp_path / "merged.log").read_bytes()
        assert merged.endswith(b" [1] worker-150 | relayed\n") and merged.count(b"\n") == 1
    finally:
        pump.close()  # reads every log to its end
        console.close()
    assert b" [1] worker-7 | appended directly\n" in (tmp_path / "merged.log").read_bytes()
