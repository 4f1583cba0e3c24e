"""tflaunch's own trace: --debug and TFLAUNCH_DEBUG write debug.log in the run folder; off, nothing is written
and the ``tflaunch`` loggers cost a level check."""

from __future__ import annotations

import stat
import subprocess
import sys
import threading

import pytest

from launcher.records.folder import DEBUG_LOG
from polling import wait_for
from launcher.records.trace import RunTrace, tracer, wanted

pytestmark = pytest.mark.timeout(120)

# worker-1 fails in attempt 1 and succeeds in attempt 2; worker-0 succeeds in both.
FLAKY = ("import os, sys; sys.exit(3 if os.environ['TFLAUNCH_ATTEMPT'] == '1' and "
         "os.environ['TFLAUNCH_RANK'] == '1' else 0)")
RESTART = ("--local", "2", "--max-restarts", "1", "--restart-delay", "0.1")


def trace_of(done) -> str:
    assert done.returncode == 0, done.stderr[-3000:]
    path = done.run_dir / DEBUG_LOG
    assert path.exists(), sorted(p.name for p in done.run_dir.iterdir())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    return path.read_text()


def assert_traced(text: str) -> None:
    """The decisions of a run whose attempt 1 failed on worker-1 and attempt 2 succeeded."""
    assert "tflaunch.hostlink: this machine: link over agent made" in text
    assert "this machine: its agent started" in text
    assert "tflaunch.session: attempt 1: 2 tasks on hosts ['localhost']" in text
    assert "tflaunch.supervisor: worker-1: running -> failed (exit code 3)" in text
    assert "attempt 1 ended: failed, exit code 3, root cause worker-1" in text
    assert "tflaunch.session: attempt 2: 2 tasks" in text
    assert "worker-0: pending -> running\n" in text
    assert "attempt 2 ended: succeeded, exit code 0" in text
    # The link's end, with its frames by kind (each task's start and end are two status frames).
    assert "this machine: link closed by tflaunch; frames read: {" in text and "'status': 8" in text
    first = text.splitlines()[0]
    assert first[:4].isdigit() and first[19] == "." and first[20:23].isdigit(), first  # the time, to the ms
    assert " MainThread tflaunch." in text and " tflaunch-agents tflaunch." in text  # the thread's name


@pytest.mark.slow
def test_debug_writes_the_runs_decisions_to_debug_log(tflaunch):
    done = tflaunch.run(*RESTART, "--debug", "--", "python", "-c", FLAKY, env={"TFLAUNCH_DEBUG": "0"})
    assert_traced(trace_of(done))
    assert "tflaunch." not in done.stdout + done.stderr  # nothing of it on the console
    # but where it is, once
    assert [line for line in done.stderr.splitlines() if DEBUG_LOG in line] == [
        f"tflaunch: tflaunch's own trace of this run: {done.run_dir / DEBUG_LOG}"]


@pytest.mark.slow
def test_tflaunch_debug_in_the_environment_does_the_same(tflaunch):
    done = tflaunch.run(*RESTART, "--", "python", "-c", FLAKY, env={"TFLAUNCH_DEBUG": "1"})
    assert_traced(trace_of(done))


@pytest.mark.slow
def test_without_debug_no_debug_log_is_written(tflaunch):
    done = tflaunch.run("--local", "2", "--", "python", "-c", "pass", env={"TFLAUNCH_DEBUG": "0"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert not (done.run_dir / DEBUG_LOG).exists()


@pytest.mark.slow
def test_a_secret_given_with_env_never_reaches_debug_log(tflaunch):
    secret = "tr4ce-s3cret-value"
    done = tflaunch.run("--local", "2", "--debug", "--env", f"MY_API_TOKEN={secret}", "--",
                        "python", "-c", "import os; print(len(os.environ['MY_API_TOKEN']))")
    text = trace_of(done)
    assert "attempt 1 ended: succeeded" in text
    assert secret not in text
    assert (done.run_dir / "worker-0.log").read_text().strip() == str(len(secret))  # the task did get it


@pytest.mark.unit
def test_off_the_tflaunch_logger_has_no_handler_and_takes_no_debug_record():
    # In a fresh interpreter with the tracing modules loaded: pytest attaches its own handlers to
    # every logger that does not propagate.
    code = ("import logging; import launcher.run.lifecycle.session, launcher.transports.linkhub\n"
            "from launcher.records.trace import ROOT, RunTrace, tracer\n"
            "root, log = logging.getLogger(ROOT), tracer('session')\n"
            "print(root.handlers, root.propagate, log.isEnabledFor(logging.DEBUG))\n"
            "trace = RunTrace.begin(); print(log.isEnabledFor(logging.DEBUG)); trace.end()\n"
            "print(root.handlers, log.isEnabledFor(logging.DEBUG))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[] False False", "True", "[] False"]


@pytest.mark.unit
def test_a_programs_own_logging_neither_turns_the_trace_on_nor_shows_it():
    # A program that logs everything at DEBUG to its stderr, then traces: nothing of tflaunch's shows.
    code = ("import logging; logging.basicConfig(level=logging.DEBUG)\n"
            "from launcher.records.trace import tracer\n"
            "log = tracer('session'); log.debug('attempt %d', 1); log.warning('x'); "
            "print(log.isEnabledFor(logging.DEBUG))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False" and "attempt" not in done.stderr and "x" not in done.stderr


@pytest.mark.unit
def test_the_trace_holds_what_comes_before_the_file_and_writes_it_first(tmp_path):
    trace = RunTrace.begin()
    try:
        tracer("hostlink").debug("before %s", "the folder")
        trace.open(tmp_path / DEBUG_LOG, 1 << 20)
        tracer("session").debug("after")
    finally:
        trace.end()
    tracer("session").debug("once it ended")
    lines = (tmp_path / DEBUG_LOG).read_text().splitlines()
    assert [line.split(" ", 3)[3] for line in lines] == ["tflaunch.hostlink: before the folder",
                                                         "tflaunch.session: after"]


@pytest.mark.unit
@pytest.mark.parametrize("option, variable, expected", [
    (False, None, False), (True, None, True), (False, "1", True), (False, "yes", True),
    (False, "0", False), (False, "", False), (False, "off", False), (False, "False", False), (True, "0", True)])
def test_wanted_by_the_option_or_the_variable(option, variable, expected):
    assert wanted(option, {} if variable is None else {"TFLAUNCH_DEBUG": variable}) is expected


@pytest.mark.unit
def test_each_straggler_judgement_traces_every_tasks_share(tmp_path):
    from launcher.options import STRAGGLER_WARM_UP
    from launcher.run.faults.stragglers import StragglerWatch

    watch = StragglerWatch(1, {"worker-0": "node1", "worker-1": "node2", "worker-2": "node3"}, lambda text: None,
                           lambda records: None, clock=lambda: 0.0, warm_up=STRAGGLER_WARM_UP)
    trace = RunTrace.begin()
    try:
        trace.open(tmp_path / DEBUG_LOG, 1 << 20)
        watch.judge({"worker-0": (0.02, "cpu"), "worker-1": (0.45, "stall"), "worker-2": (0.01, "cpu")}, 5.0)
    finally:
        trace.end()
    text = (tmp_path / DEBUG_LOG).read_text()
    assert ("tflaunch.stragglers: attempt 1: shares {'worker-0': (0.02, 'cpu'), 'worker-1': (0.45, 'stall'), "
            "'worker-2': (0.01, 'cpu')}; standing out ['worker-1']; suspects ['worker-1']; stragglers []") in text


@pytest.mark.unit
def test_a_flood_of_trace_lines_keeps_debug_log_within_its_size_limit(tmp_path):
    limit = 64 << 10
    path = tmp_path / DEBUG_LOG
    trace = RunTrace.begin()
    try:
        trace.open(path, limit)
        log = tracer("session")
        for number in range(20_000):  # about 2.2 MB of lines
            log.debug("line %06d %s", number, "x" * 80)
        parts = [p for p in tmp_path.iterdir() if p.name != DEBUG_LOG]
        assert parts and {stat.S_IMODE(p.stat().st_mode) for p in parts} == {0o600}  # the latest lines
    finally:
        trace.end()
    assert sorted(p.name for p in tmp_path.iterdir()) == [DEBUG_LOG]  # stitched: head, marker, tail
    assert path.stat().st_size <= limit + 200 and stat.S_IMODE(path.stat().st_mode) == 0o600
    lines = path.read_text().splitlines()
    assert lines[0].endswith(f"tflaunch.session: line 000000 {'x' * 80}")
    assert lines[-1].endswith(f"tflaunch.session: line 019999 {'x' * 80}")
    (marker,) = [line for line in lines if line.startswith("[... tflaunch: ")]
    assert "left out here" in marker, marker


@pytest.mark.slow
def test_two_launch_calls_at_once_each_trace_to_their_own_debug_log(tmp_path):
    from launcher import launch

    gate = tmp_path / "both-running"
    wait = f"import os, time\nwhile not os.path.exists({str(gate)!r}):\n    time.sleep(0.05)"
    lines: dict[int, list[str]] = {2: [], 3: []}
    results: dict[int, object] = {}

    def call(count: int) -> None:
        try:
            results[count] = launch(local=count, command=[sys.executable, "-c", wait], log_dir=tmp_path / f"logs{count}",
                                    debug=True, on_line=lines[count].append)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            results[count] = exc

    threads = [threading.Thread(target=call, args=(count,)) for count in lines]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: all(any(" tasks from launch(local=" in line for line in said) for said in lines.values()),
                 timeout=60, message="both runs to start")
    finally:
        gate.touch()
        for thread in threads:
            thread.join(60)
    runs = {count: result.run_id for count, result in results.items()}
    for count, result in results.items():
        assert result.ok, result
        path = result.run_dir / DEBUG_LOG
        text = path.read_text()
        other = 5 - count
        assert f"run {runs[count]}: tflaunch" in text and runs[other] not in text
        assert f"attempt 1: {count} tasks on hosts" in text and f"attempt 1: {other} tasks" not in text
        assert ("worker-2: pending -> running" in text) is (count == 3)
        # The links' thread serves both runs' links: each run has its own link's lines, once.
        assert text.count("this machine: its agent started") == 1
        (closed,) = [line for line in text.splitlines() if "this machine: link closed by tflaunch" in line]
        assert f"'status': {2 * count}" in closed and " tflaunch-agents tflaunch.hostlink: " in text
        # The console said where the trace is, once.
        assert [line for line in lines[count] if DEBUG_LOG in line] == [
            f"tflaunch: tflaunch's own trace of this run: {path}"]
