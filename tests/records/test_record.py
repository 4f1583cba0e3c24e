"""The run record: a round trip through run.json, and run folders written before it was typed."""

from __future__ import annotations

import json
import os
import re
import signal

import pytest

from launcher.records.folder import RunFolder, part_of
from launcher.records.record import FORMAT_VERSION, AttemptRecord, LauncherRecord, RootCause, RunRecord, TaskRecord
from launcher.records.states import AllFinal, Outcome, RunStatus, TaskState
from launcher.run.lifecycle.signals import Interrupted, Signals

pytestmark = pytest.mark.unit


def full_record() -> RunRecord:
    return RunRecord(
        run_id="20261123-101500-ab12", source="--local 2 --chief --ps 1", status=RunStatus.FAILED,
        tflaunch_version="0.1.0", exit_code=137, max_restarts=2, started_at="2026-11-23T10:15:00.000+00:00",
        ended_at="2026-11-23T10:16:00.000+00:00", duration_seconds=60.0,
        launcher=LauncherRecord(pid=4242, host="vm", cwd="/work", argv=["tflaunch", "--local", "2"]),
        cluster={"chief": ["localhost:1"], "worker": ["localhost:2"], "ps": ["localhost:3"]},
        command="python -m trainer", notes=["a note"],
        tasks=[TaskRecord(name="worker-0", role="worker", index=0, host="localhost", address="localhost:2",
                          argv=["python", "-m", "trainer"], workdir="/work", gpus=[0], env={"A": "1"},
                          state=TaskState.FAILED, pid=99, exit_code=137, signal=9, attempt=2, restarts=1,
                          leftovers=["sleep (pid 4711)"])],
        root_cause=RootCause(task="worker-0", host="localhost", exit_code=137, signal=9, tail=["Killed"],
                             diagnosis={"rule": "oom"}),
        attempts=[AttemptRecord(attempt=1, outcome=Outcome.FAILED, exit_code=137, failed_task="worker-0",
                                blamed_tasks=["worker-0"], diagnosis="oom")],
        error="/x/merged.log: No space left on device")


def test_asking_after_every_end_whether_all_ended_looks_at_each_task_about_once():
    # A thousand tasks ending one by one, in an order the check cannot know: the question after
    # each end must not scan every task again (a million looks at the end of a large attempt).
    states = [TaskState.RUNNING] * 1000
    looks = 0

    def ended(i: int) -> bool:
        nonlocal looks
        looks += 1
        return states[i].ended

    all_ended = AllFinal(range(1000), ended)
    order = [(i * 7919) % 1000 for i in range(1000)]  # a permutation: 7919 is prime to 1000
    answers = []
    for i in order:
        states[i] = TaskState.SUCCEEDED
        answers.append(all_ended())
    assert answers == [False] * 999 + [True]
    assert looks <= 2 * 1000
    assert AllFinal([], ended)()  # nothing to wait for


def test_a_record_survives_a_round_trip_through_run_json(tmp_path):
    folder = RunFolder(tmp_path)
    record = full_record()
    folder.write_record(record, final=True)
    data = json.loads(folder.record_path.read_text())
    assert data["format_version"] == FORMAT_VERSION and data["status"] == "failed"
    assert folder.read_record() == record


def test_live_rewrites_are_compact_and_the_final_one_indented(tmp_path):
    folder = RunFolder(tmp_path)
    folder.write_record(full_record())
    assert "\n" not in folder.record_path.read_text().rstrip("\n")
    folder.write_record(full_record(), final=True)
    assert folder.record_path.read_text().startswith("{\n  ")


def test_live_rewrites_reuse_a_task_s_text_only_while_its_values_stay_the_same(tmp_path):
    import dataclasses

    from launcher.records import livejson

    def plain(record: RunRecord) -> str:
        return json.dumps(record.to_json(), separators=(",", ":")) + "\n"

    record = full_record()
    template = record.tasks[0]
    # an env whose text holds what a task's own state key looks like
    record.tasks = [dataclasses.replace(template, name=f"worker-{i}", index=i, env={"A": str(i), "state": ',"state":1'},
                                        state=TaskState.PENDING, pid=None, exit_code=None, signal=None, leftovers=[])
                    for i in range(4)]
    folder = RunFolder(tmp_path)
    encoded = []
    real_dumps = livejson._dumps
    livejson._dumps = lambda value: encoded.append(value) or real_dumps(value)
    try:
        folder.write_record(record)
        assert folder.record_path.read_text() == plain(record)
        encoded.clear()
        folder.write_record(record)  # nothing changed: no task encoded again
        assert folder.record_path.read_text() == plain(record)
        assert not [v for v in encoded if "name" in v or "state" in v]
        # A new state, a value changed in place, a task gone and one new: the text follows each.
        record.tasks[0].state, record.tasks[0].pid = TaskState.RUNNING, 7
        record.tasks[1].env["A"] = "changed in place"
        record.tasks[2].leftovers.append("sleep (pid 1)")
        record.tasks = record.tasks[:3] + [dataclasses.replace(template, name="ps-0", role="ps")]
        record.status = RunStatus.RUNNING
        encoded.clear()
        folder.write_record(record)
        assert folder.record_path.read_text() == plain(record)
        # worker-1 (its env) and ps-0 encoded whole; worker-0 (started) and worker-2 (a leftover):
        # their state and what came of it only; worker-3 is gone
        assert sorted(v.get("name") or v.get("state") for v in encoded if "name" in v or "state" in v) == \
            ["pending", "ps-0", "running", "worker-1"]
    finally:
        livejson._dumps = real_dumps
    assert folder.read_record() == record


def test_a_large_final_record_has_one_line_per_task(tmp_path):
    import dataclasses

    from launcher.records.folder import READABLE_TASKS

    record = full_record()
    task = record.tasks[0]
    record.tasks = [dataclasses.replace(task, name=f"worker-{i}", index=i) for i in range(READABLE_TASKS + 1)]
    folder = RunFolder(tmp_path)
    folder.write_record(record, final=True)
    text = folder.record_path.read_text()
    assert folder.read_record() == record
    lines = text.splitlines()
    assert lines[0] == "{" and lines[-1] == "}" and '  "tasks": [' in lines
    task_lines = [line for line in lines if line.startswith('    {"name": "worker-')]
    assert len(task_lines) == READABLE_TASKS + 1  # each task whole on its own line, for grep
    assert len(lines) < 2 * (READABLE_TASKS + 1)


def test_a_new_attempt_moves_each_tasks_log_and_its_unstitched_parts_into_the_last_attempts_folder(tmp_path):
    folder = RunFolder(tmp_path)
    names = ["worker-0", "worker-1", "a.part-x"]  # a name that holds the part infix is no part file
    for name in names:
        with open(folder.create_task_log(name, 1), "a") as log:
            log.write(f"{name} attempt 1\n")
    assert not (tmp_path / "attempt-1").exists()  # a first attempt makes no attempt folder
    (tmp_path / "worker-0.log.part-4096").write_text("kept from a stitch a full disk stopped\n")
    (tmp_path / "merged.log.part-8192").write_text("the run's own\n")
    assert folder.create_task_log("worker-0", 1) == str(tmp_path.resolve() / "worker-0.log")  # in place: kept
    for name in names:
        folder.create_task_log(name, 2)
    moved = tmp_path / "attempt-1"
    assert sorted(p.name for p in moved.iterdir()) == ["a.part-x.log", "worker-0.log", "worker-0.log.part-4096",
                                                      "worker-1.log"]
    for name in names:
        assert (moved / f"{name}.log").read_text() == f"{name} attempt 1\n"
        assert folder.task_log(name, 1) == moved / f"{name}.log"
        assert folder.task_log(name, 2) == folder.latest_task_log(name) == tmp_path / f"{name}.log"
        assert (tmp_path / f"{name}.log").read_text() == ""
    assert (tmp_path / "merged.log.part-8192").exists()


def test_a_part_file_is_a_log_name_the_infix_and_a_number_and_nothing_else():
    assert part_of("worker-0.log.part-4096") == ("worker-0.log", 4096)
    assert part_of("a.part-x.log.part-7") == ("a.part-x.log", 7)  # the last infix counts
    for name in ("worker-0.log", "a.part-x.log", "worker-0.log.part-", "worker-0.log.part-12a",
                 "worker-0.log.part-\u00b2"):  # a superscript two is a digit to str.isdigit, not to int
        assert part_of(name) is None, name


def test_a_format_1_record_reads_with_defaults_and_the_attempt_from_the_task_env():
    old = {"tflaunch_version": "0.1.0", "run_id": "r", "source": "--local 2", "status": "running",
           "exit_code": None, "launcher": {"pid": 1, "host": "h", "cwd": "/", "argv": ["tflaunch"]},
           "tasks": [{"name": "worker-0", "role": "worker", "index": 0, "host": "localhost",
                      "env": {"TFLAUNCH_ATTEMPT": "3"}, "state": "running", "pid": 5}],
           "attempts": [{"attempt": 1, "outcome": "failed"}, {"attempt": 2, "outcome": "failed"}],
           "root_cause": None, "some_future_key": {"x": 1}}
    record = RunRecord.from_json(old)
    assert record.format_version == 1 and record.status is RunStatus.RUNNING
    assert record.tasks[0].attempt == 3 and record.attempt == 3
    assert record.tasks[0].state is TaskState.RUNNING and record.attempts[0].outcome is Outcome.FAILED
    assert record.tasks[0].restarts == 0 and record.tasks[0].leftovers == []
    assert record.error is None and record.launcher.pid == 1


def test_the_old_spelling_of_a_lost_launcher_and_unknown_statuses_read_as_statuses():
    assert RunStatus.parse("died") is RunStatus.LAUNCHER_LOST
    assert RunStatus.parse("exploded") is RunStatus.FAILED
    assert RunStatus.LAUNCHER_LOST.describe() == "launcher lost" and not RunStatus.LAUNCHER_LOST.ended
    assert TaskState.parse("vanished") is TaskState.FAILED and Outcome.parse(None) is Outcome.FAILED


@pytest.mark.parametrize("text, shown", [("[]", "a list"), ('"run"', "'run'"), ("3", "3")])
def test_run_json_that_is_not_an_object_is_refused(tmp_path, text, shown):
    folder = RunFolder(tmp_path)
    folder.record_path.write_text(text)
    with pytest.raises(ValueError, match=rf"^run\.json: expected an object, got {re.escape(shown)}$"):
        folder.read_record()


def test_signals_before_a_run_raise_interrupted_and_during_a_run_only_record(signal_handlers):
    signals = Signals()
    with pytest.raises(Interrupted) as raised:
        signals._handle(signal.SIGHUP, None)
    assert raised.value.exit_code == 129
    with signals.armed_for_run():
        signals._handle(signal.SIGTERM, None)  # no exception: the run's waits see it
        assert signals.wait(5.0) == signal.SIGHUP  # the first signal decides; the wait returns at once
    assert signals.count == 2


def test_a_signal_wakes_a_wait_on_the_pipe_at_once():
    import threading
    import time

    signals = Signals()
    signals.armed = True
    timer = threading.Timer(0.05, lambda: signals._handle(signal.SIGINT, None))
    timer.start()
    started = time.monotonic()
    assert signals.wait(30.0) == signal.SIGINT
    assert time.monotonic() - started < 10.0
    timer.join()


def test_signal_pipe_is_private_to_each_instance():
    a, b = Signals(), Signals()
    a.armed = True
    a._handle(signal.SIGINT, None)
    assert b.wait(0.0) is None and a.wait(0.0) == signal.SIGINT
    assert os.get_blocking(a._read_fd) is False


def test_a_watched_extra_signal_takes_the_same_path(signal_handlers):
    signals = Signals()
    previous = signal.getsignal(signal.SIGUSR2)
    try:
        signals.watch(signal.SIGUSR2)
        with signals.armed_for_run():
            os.kill(os.getpid(), signal.SIGUSR2)
            assert signals.wait(5.0) == signal.SIGUSR2
    finally:
        signal.signal(signal.SIGUSR2, previous)


# -- the numbers every view shows ---------------------------------------------------------------


def test_a_runs_duration_is_the_recorded_one_once_it_ended_and_runs_on_until_then():
    from datetime import datetime

    start = "2026-11-25T14:24:02.000+00:00"
    started = datetime.fromisoformat(start).timestamp()
    ended = RunRecord("r", "--local 2", started_at=start, duration_seconds=8.125)
    assert ended.seconds() == ended.seconds(started + 99) == 8.125
    running = RunRecord("r", "--local 2", started_at=start)
    assert running.seconds() is None and running.seconds(started + 12.5) == 12.5
    assert RunRecord("r", "x", started_at="not a time").seconds(started) is None


@pytest.mark.parametrize("seconds, text", [(None, "-"), (0, "0.0 s"), (8.14, "8.1 s"), (59.94, "59.9 s"),
                                           (125, "2m05s"), (3780, "1h03m"), (float("nan"), "nan")])
def test_durations_read_one_way(seconds, text):
    from launcher.records.states import duration_text

    assert duration_text(seconds) == text


def test_counts_are_plural_in_english():
    from launcher.records.states import plural

    assert [plural(n, "task") for n in (0, 1, 2, 1000)] == ["0 tasks", "1 task", "2 tasks", "1,000 tasks"]
    assert plural(1, "process", "processes") == "1 process" and plural(3, "process", "processes") == "3 processes"


def epoch(task, attempt, number, seconds):
    return {"kind": "epoch", "task": task, "attempt": attempt, "epoch": number, "epoch_seconds": seconds}


def final(task, attempt, seconds):
    return {"kind": "final", "task": task, "attempt": attempt, "total_seconds": seconds}


@pytest.mark.parametrize("records, trained", [
    ([], None),
    # the speaker's epochs; a final record's total counts the task's start-up too: not training
    ([epoch("worker-0", 1, 1, 2.0), epoch("worker-1", 1, 1, 2.5), final("worker-0", 1, 3.0)], 2.0),
    # every attempt's epochs: epoch 2 ran twice, and took its time twice
    ([epoch("worker-0", 1, 1, 2.0), epoch("worker-0", 1, 2, 1.5), epoch("worker-0", 2, 2, 1.0),
      final("worker-0", 2, 1.25)], 4.5),
    ([epoch("chief-0", 1, 1, 1.0), epoch("worker-0", 1, 1, 9.0), epoch("chief-0", 2, 1, "x")], 1.0),
    ([{"kind": "epoch", "task": "worker-0", "epoch": 1, "epoch_seconds": 0.5}], 0.5),  # no attempt: the first
])
def test_training_time_is_what_every_attempt_trained(records, trained):
    from launcher.records.metrics import trained_seconds

    assert trained_seconds(records) == trained


@pytest.mark.unit
def test_json_nested_deeper_than_python_reads_is_no_record_and_no_crash(tmp_path):
    from launcher.records.metrics import PREFIX, parse_line, read_metrics

    nested = b'{"a": ' + b"[" * 5000
    assert parse_line(PREFIX + nested) is None  # a task's line: stays a plain line
    folder = RunFolder(tmp_path)
    folder.metrics_path.write_bytes(b'{"loss": 1}\n' + nested + b"\n")
    (tmp_path / "resources.json").write_bytes(nested)
    assert read_metrics(folder.metrics_path) == [{"loss": 1}]
    assert folder.read_resources() == {}


@pytest.mark.unit
def test_a_moment_reads_the_same_from_the_clock_and_from_run_json():
    from datetime import datetime

    from launcher.records.folder import iso_time
    from launcher.records.states import clock_text

    now = 1796170000.25
    assert clock_text(now) == clock_text(iso_time(now)) == datetime.fromtimestamp(now).strftime("%Y-%m-%d %H:%M:%S")
    assert clock_text(None) == "-" and clock_text("not a time") == "not a time"
