"""The output pump's sweeps read the logs that were written to, not every log it follows."""

from __future__ import annotations

import io
import threading

import pytest

from launcher.records.boundedlog import WRITING
from launcher.run.output import pump as pump_module
from launcher.run.console.writer import Console
from launcher.run.output.pump import OutputPump
from launcher.options import LOG_MAX_SIZE
from polling import wait_for

pytestmark = pytest.mark.unit


def test_a_sweep_reads_the_logs_written_to_and_leaves_the_others_for_their_look(tmp_path, monkeypatch):
    monkeypatch.setattr(pump_module, "IDLE_CHECK", 3600.0)  # the look at every log: once, at the first sweep
    console = Console(io.StringIO(), messages=io.StringIO())
    pump = OutputPump(tmp_path / "merged.log", tmp_path / "metrics.jsonl", console, log_max_size=LOG_MAX_SIZE)
    paths = [tmp_path / f"worker-{i}.log" for i in range(200)]
    for i, path in enumerate(paths):
        pump.follow(f"worker-{i}", path)
    try:
        pump._sweep()  # the first look at every log: nothing there yet
        WRITING.get(str(paths[150].resolve())).write(b"relayed\n")  # as the transports append a task's output
        with open(paths[7], "ab") as handle:  # another writer: no one tells the pump
            handle.write(b"appended directly\n")
        pump._sweep()
        pump.files.flush()
        merged = (tmp_path / "merged.log").read_bytes()
        assert merged.endswith(b" [1] worker-150 | relayed\n") and merged.count(b"\n") == 1
    finally:
        pump.close()  # reads every log to its end
        console.close()
    assert b" [1] worker-7 | appended directly\n" in (tmp_path / "merged.log").read_bytes()


def _pump(tmp_path, count):
    console = Console(io.StringIO(), messages=io.StringIO())
    pump = OutputPump(tmp_path / "merged.log", tmp_path / "metrics.jsonl", console, log_max_size=LOG_MAX_SIZE)
    paths = [tmp_path / f"worker-{i}.log" for i in range(count)]
    for i, path in enumerate(paths):
        pump.follow(f"worker-{i}", path)
    return pump, console, paths


def test_a_relayed_log_is_looked_at_for_other_writers_only_every_relayed_check(tmp_path, monkeypatch):
    monkeypatch.setattr(pump_module, "IDLE_CHECK", 0.0)  # a log that is not relayed: looked at every sweep
    monkeypatch.setattr(pump_module, "RELAYED_CHECK", 3600.0)
    pump, console, paths = _pump(tmp_path, 2)
    try:
        pump._sweep()
        WRITING.get(str(paths[0].resolve())).write(b"relayed\n")
        pump._sweep()  # worker-0 is relayed from now on
        for path in paths:
            with open(path, "ab") as handle:
                handle.write(b"appended directly\n")
        pump._sweep()
        pump.files.flush()
        merged = (tmp_path / "merged.log").read_bytes()
        assert b"worker-1 | appended directly\n" in merged  # its look came
        assert b"worker-0 | appended directly\n" not in merged  # its next look is an hour away
    finally:
        pump.close()
        console.close()
    assert b"worker-0 | appended directly\n" in (tmp_path / "merged.log").read_bytes()  # read at the end


def test_the_pump_keeps_at_most_open_files_descriptors_however_many_logs_write(tmp_path):
    pump, console, paths = _pump(tmp_path, pump_module.OPEN_FILES * 3)
    try:
        for path in paths:
            WRITING.get(str(path.resolve())).write(b"a line\n")
            pump._sweep()
        assert len(pump._open) <= pump_module.OPEN_FILES
        assert sum(1 for s in pump._sources if s.reader.is_open) <= pump_module.OPEN_FILES
        pump.files.flush()
        assert (tmp_path / "merged.log").read_bytes().count(b"| a line\n") == len(paths)
    finally:
        pump.close()
        console.close()


def test_a_quiet_pump_sleeps_until_a_write_or_a_look_is_due(tmp_path):
    pump, console, paths = _pump(tmp_path, 50)
    sweeps = []
    sweep = pump._sweep
    pump._sweep = lambda: (sweeps.append(1), sweep())[1]
    pump.start()
    try:
        threading.Event().wait(1.0)
        # One sweep per look (every IDLE_CHECK = 0.25 s) and the first: not one per 0.02 s interval.
        assert len(sweeps) <= 1 + 1.0 / pump_module.IDLE_CHECK + 2, len(sweeps)
        WRITING.get(str(paths[3].resolve())).write(b"heard at once\n")
        assert wait_for(lambda: b"worker-3 | heard at once" in (tmp_path / "merged.log").read_bytes(), timeout=30)
    finally:
        pump.close()
        console.close()


def test_a_task_log_followed_as_relayed_waits_for_its_quiet_look_from_the_first(tmp_path, monkeypatch):
    monkeypatch.setattr(pump_module, "IDLE_CHECK", 0.0)  # a log not known to be relayed: looked at every sweep
    monkeypatch.setattr(pump_module, "RELAYED_CHECK", 3600.0)
    console = Console(io.StringIO(), messages=io.StringIO())
    pump = OutputPump(tmp_path / "merged.log", tmp_path / "metrics.jsonl", console, log_max_size=LOG_MAX_SIZE)
    relayed, plain = tmp_path / "worker-0.log", tmp_path / "worker-1.log"
    pump.follow("worker-0", relayed, created=False, relayed=True)
    pump.follow("worker-1", plain)
    try:
        pump._sweep()  # the first look at each
        for path in (relayed, plain):
            with open(path, "ab") as handle:
                handle.write(b"appended directly\n")
        pump._sweep()
        pump.files.flush()
        merged = (tmp_path / "merged.log").read_bytes()
        assert b"worker-1 | appended directly\n" in merged
        assert b"worker-0 | appended directly\n" not in merged  # an hour away: its writes are announced
        WRITING.get(str(relayed.resolve())).write(b"relayed\n")
        pump._sweep()
        pump.files.flush()
        merged = (tmp_path / "merged.log").read_bytes()  # an announced write reads what came before it too
        assert merged.index(b"worker-0 | appended directly\n") < merged.index(b"worker-0 | relayed\n")
    finally:
        pump.close()
        console.close()


def test_the_looks_for_other_writers_space_out_with_the_number_of_logs(tmp_path, monkeypatch):
    import time

    monkeypatch.setattr(pump_module, "LOOKS_PER_SECOND", 8)
    for count, spacing in ((4, pump_module.RELAYED_CHECK), (400, 50.0)):  # 400 logs at 8 looks a second: 50 s
        folder = tmp_path / str(count)
        folder.mkdir()
        console = Console(io.StringIO(), messages=io.StringIO())
        pump = OutputPump(folder / "merged.log", folder / "metrics.jsonl", console, log_max_size=LOG_MAX_SIZE)
        for i in range(count):
            pump.follow(f"worker-{i}", folder / f"worker-{i}.log", relayed=True)
        try:
            before = time.monotonic()
            pump._sweep()
            after = time.monotonic()
            looks = sorted(at for at, _, _ in pump._looks)
            assert len(looks) == count
            assert before + spacing <= looks[0] and looks[-1] <= after + spacing
        finally:
            pump.close()
            console.close()


def test_a_message_is_never_held_up_by_a_sweep_and_lands_in_merged_log(tmp_path):
    pump, console, paths = _pump(tmp_path, 1)
    pump.start()
    said = threading.Event()
    try:
        with pump._lock:  # a sweep that takes long: a flood being read
            threading.Thread(target=lambda: (pump.message("worker-1 failed: stopping the cluster"), said.set()),
                             daemon=True).start()
            assert said.wait(10), "the message waited for the sweep"
        assert wait_for(lambda: b"] tflaunch | worker-1 failed: stopping the cluster\n"
                        in (tmp_path / "merged.log").read_bytes(), timeout=30)
    finally:
        pump.close()
        console.close()


def test_a_message_said_while_no_pump_thread_runs_is_written_at_once(tmp_path):
    pump, console, _ = _pump(tmp_path, 1)
    try:
        pump.message("before the start")
        assert (tmp_path / "merged.log").read_bytes().endswith(b"] tflaunch | before the start\n")
    finally:
        pump.close()
        console.close()


FLOOD_LINE = b"%063d\n"  # 64 bytes, numbered


def _limited_pump(tmp_path, monkeypatch, count: int, per_log: int, per_sweep: int):
    """A pump over ``count`` logs that reads at most ``per_log`` of one and ``per_sweep`` in all per sweep."""
    monkeypatch.setattr(pump_module, "_READ_PER_SWEEP", per_log)
    monkeypatch.setattr(pump_module, "_SWEEP_AT_MOST", per_sweep)
    # The timed looks (for writes no one was told of) read apart from the budget: an idle log's
    # comes every 0.25 s, which a sweep of a flood outlasts on a loaded machine. An hour apart here.
    monkeypatch.setattr(pump_module, "IDLE_CHECK", 3600.0)
    pump, console, paths = _pump(tmp_path, count)
    pump._sweep()  # the first look at each
    return pump, console, paths


def _flood(path, lines: int) -> None:
    WRITING.get(str(path.resolve())).write(b"".join(FLOOD_LINE % i for i in range(lines)))


def _sweep_until_read(pump) -> int:
    """Sweep until no log waits to be read; returns how many sweeps that took."""
    sweeps = 0
    while pump._changed or pump._queue:
        pump._sweep()
        sweeps += 1
    pump.files.flush()
    return sweeps


def test_a_sweep_reads_a_flood_in_part_so_the_other_logs_and_the_messages_get_their_turn(tmp_path, monkeypatch):
    pump, console, paths = _limited_pump(tmp_path, monkeypatch, 2, per_log=64 << 10, per_sweep=2 * (64 << 10))
    try:
        _flood(paths[0], 16_384)  # 1 MiB
        WRITING.get(str(paths[1].resolve())).write(b"the other task's line\n")
        pump.message("said during the flood")
        pump._sweep()
        pump._write_messages()
        pump.files.flush()
        merged = (tmp_path / "merged.log").read_bytes()
        assert b"worker-1 | the other task's line\n" in merged and b"tflaunch | said during the flood\n" in merged
        assert 0 < merged.count(b"worker-0 | ") <= 2 * (64 << 10) // 64  # a part of the flood: its share
        assert _sweep_until_read(pump) >= 7  # the rest waits in line for the next sweeps
        merged = (tmp_path / "merged.log").read_bytes()
        assert merged.count(b"worker-0 | ") == 16_384 and (FLOOD_LINE % 16_383) in merged
    finally:
        pump.close()
        console.close()


def test_floods_in_many_logs_take_turns_and_no_sweep_reads_more_than_its_limit(tmp_path, monkeypatch):
    pump, console, paths = _limited_pump(tmp_path, monkeypatch, 8, per_log=64 << 10, per_sweep=4 * (64 << 10))
    try:
        for path in paths:
            _flood(path, 8_192)  # 512 KiB each
        seen: list[set[bytes]] = []
        for _ in range(2):
            before = (tmp_path / "merged.log").read_bytes()
            pump._sweep()
            pump.files.flush()
            new = (tmp_path / "merged.log").read_bytes()[len(before):]
            assert len(new) <= 4 * (64 << 10) * 2  # the limit, and the prefixes of its lines
            seen.append({piece.split(b" | ")[0].rsplit(b" ", 1)[1] for piece in new.splitlines()})
        assert len(seen[0]) == 4 and len(seen[1]) == 4 and seen[0] | seen[1] == {b"worker-%d" % i for i in range(8)}
        _sweep_until_read(pump)
        merged = (tmp_path / "merged.log").read_bytes()
        for i in range(8):
            assert merged.count(b"worker-%d | " % i) == 8_192
    finally:
        pump.close()
        console.close()


def test_an_ended_tasks_output_reaches_the_console_before_its_end_does(tmp_path):
    """The console holds a worker's epoch record for the chief's; the chief ended with its own record
    in its log but not yet read: it must be read first, not the worker's shown in its place."""
    from launcher.records.states import TaskState

    out = io.StringIO()
    console = Console(out, messages=io.StringIO(), colour=False, status=False)
    pump = OutputPump(tmp_path / "merged.log", tmp_path / "metrics.jsonl", console, log_max_size=LOG_MAX_SIZE)
    chief, worker = tmp_path / "chief-0.log", tmp_path / "worker-0.log"
    pump.follow("chief-0", chief)
    pump.follow("worker-0", worker)
    record = b'TFLAUNCH_METRIC {"kind": "epoch", "epoch": 1, "epochs": 1, "loss": 0.5}\n'
    try:
        pump._sweep()
        WRITING.get(str(worker.resolve())).write(record)
        pump._sweep()  # the worker's record: held for the chief's
        WRITING.get(str(chief.resolve())).write(record)  # written, the pump not yet round to it
        pump.read_out(["chief-0"], 1)
        console.task_states({"chief-0": TaskState.SUCCEEDED, "worker-0": TaskState.RUNNING}, 1)
    finally:
        console.close()
        pump.close()
    epoch_lines = [line for line in out.getvalue().splitlines() if "epoch 1" in line]
    assert len(epoch_lines) == 1 and epoch_lines[0].lstrip().startswith("chief-0"), out.getvalue()
