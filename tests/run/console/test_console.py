"""The console in-process: TensorFlow chatter, metric lines for people, the writer thread that a
closed or stalled stream cannot stop, the status line, colour, and the closing summary's figures."""

from __future__ import annotations

import io
import json
import os
import threading
import time
from pathlib import Path

import pytest

from launcher.records.metrics import metric_lines
from launcher.records.states import TaskState
from launcher.run.console.writer import Console, wants_colour
from launcher.records.metrictext import epoch_text, final_text
from launcher.run.console.metricview import MetricBoard
from launcher.run.console.chatter import Chatter, may_hold_chatter
from launcher.run.lifecycle.summary import task_table, training_lines
from launcher.run.lifecycle.task import Task
from launcher.transports.base import ExitStatus
from polling import wait_for

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "console"


def feed(console: Console, task: str, block: bytes) -> None:
    """A block of a task's lines, with its metric lines parsed as the output pump hands them on."""
    console.task_block(task, block, 1, metric_lines(block)[1])


def metric(task: str, epoch: int | None = None, kind: str = "epoch", **values) -> bytes:
    record = {"kind": kind, "task": task, **({"epoch": epoch} if epoch is not None else {}), **values}
    return b"TFLAUNCH_METRIC " + json.dumps(record, separators=(",", ":")).encode() + b"\n"


EPOCH3 = {"loss": 0.262448, "accuracy": 0.919531, "val_loss": 0.242388, "val_accuracy": 0.911111,
          "epoch_seconds": 0.84, "samples_per_second": 2575.2, "epochs": 8}


# ---------------------------------------------------------------------------------------------
# TensorFlow's chatter (lines captured from real `tflaunch --local 2` runs here)


def captured(name: str) -> list[str]:
    return (FIXTURES / name).read_text().splitlines()


def test_every_start_up_line_of_a_real_cpu_run_is_chatter():
    chatter = Chatter()
    lines = captured("tf_startup_cpu.txt")
    assert len(lines) >= 5
    assert [line for line in lines if not chatter.hides("worker-0", line)] == []


def test_the_cuinit_error_is_hidden_only_after_the_task_said_it_has_no_cuda_driver():
    cuinit = next(line for line in captured("tf_startup_cpu.txt") if "cuInit" in line)
    driver = next(line for line in captured("tf_startup_cpu.txt") if "Could not find cuda drivers" in line)
    chatter = Chatter()
    assert not chatter.hides("worker-0", cuinit)  # on a GPU machine this error matters
    assert chatter.hides("worker-1", driver)
    assert not chatter.hides("worker-0", cuinit)
    assert chatter.hides("worker-1", cuinit)


@pytest.mark.parametrize("line", [
    "Traceback (most recent call last):",
    "UserWarning: the program's own warning",
    "WARNING:tensorflow:a warning through TensorFlow's Python logger",
    "E0000 00:00:1795426526.562170    8464 coordination_service_agent.cc:332] Coordination agent is in ERROR",
    "W0000 00:00:1795426527.357327    8464 collective_ops.cc:120] some other runtime warning",
    "F0000 00:00:1795426527.357327    8464 check.cc:1] a fatal check",
    "2024-01-01 12:00:00.123456: E tensorflow/core/x.cc:9] an error in the old format",
    "epoch 1 done",
])
def test_warnings_and_errors_are_never_chatter(line):
    chatter = Chatter()
    chatter.hides("worker-0", "I0000 00:00:1.0    1 cudart_stub.cc:31] Could not find cuda drivers on your machine, "
                              "GPU will not be used.")
    assert not chatter.hides("worker-0", line)


def test_old_timestamp_format_info_lines_are_chatter():
    line = ("2024-01-01 12:00:00.123456: I tensorflow/core/platform/cpu_feature_guard.cc:182] This TensorFlow "
            "binary is optimized to use available CPU instructions")
    assert Chatter().hides("worker-0", line)
    assert may_hold_chatter(line.encode() + b"\n")


def test_the_block_test_lets_ordinary_output_through_untouched():
    assert not may_hold_chatter(b"".join(b"%d the quick brown fox [1, 2]\n" % i for i in range(1000)))
    assert may_hold_chatter(b"x\n" + captured("tf_startup_cpu.txt")[0].encode() + b"\n")


# ---------------------------------------------------------------------------------------------
# Metric records for people


def test_epoch_and_final_lines():
    assert epoch_text({"epoch": 3, **EPOCH3}) == (
        "epoch 3/8  loss 0.262  acc 0.920  val_loss 0.242  val_acc 0.911  2,575 samples/s  0.84 s")
    assert epoch_text({"epoch": 1, "loss": None, "accuracy": 0.5, "samples_per_second": None}) == "epoch 1  acc 0.500"
    assert final_text({"test_loss": 0.109611, "test_accuracy": 0.962963, "total_seconds": 14.78, "epochs": 8}) == (
        "test  loss 0.110  acc 0.963  8 epochs in 14.78 s since the task started")
    assert final_text({"test_accuracy": 0.9, "total_seconds": 3.0, "epochs": 1}) == (
        "test  acc 0.900  1 epoch in 3.00 s since the task started")
    assert final_text({"test_accuracy": 0.9, "test_seconds": 0.8, "total_seconds": 30.0, "epochs": 1}) == (
        "test  acc 0.900  0.80 s")


def board(*tasks: str) -> MetricBoard:
    made = MetricBoard()
    made.register(tasks)
    return made


def record(epoch: int, **values) -> dict:
    return {"kind": "epoch", "epoch": epoch, **EPOCH3, **values}


def test_lock_step_records_are_shown_once_under_worker_0_whoever_comes_first():
    b = board("worker-0", "worker-1")
    assert b.add("worker-1", 1, record(3)) == []  # held until worker-0's arrives
    assert b.add("worker-0", 1, record(3)) == [("worker-0", epoch_text(record(3)))]
    assert b.add("worker-0", 1, record(4)) == [("worker-0", epoch_text(record(4)))]
    assert b.add("worker-1", 1, record(4)) == []
    assert (b.epoch, b.total) == (4, 8)


def test_the_chief_speaks_for_the_cluster_when_there_is_one():
    b = board("chief-0", "worker-0", "worker-1")
    assert b.add("worker-0", 1, record(1)) == []
    assert b.add("chief-0", 1, record(1)) == [("chief-0", epoch_text(record(1)))]


def test_a_disagreement_between_workers_is_pointed_out():
    b = board("worker-0", "worker-1")
    b.add("worker-0", 1, record(2))
    assert b.add("worker-1", 1, record(2, loss=0.3, accuracy=0.9)) == [
        ("worker-1", "epoch 2 differs from worker-0's: loss 0.3000 (0.2624), accuracy 0.9000 (0.9195)")]
    # Timings differ between workers all the time: they are no disagreement.
    assert b.add("worker-1", 1, record(3, epoch_seconds=9.0, samples_per_second=1.0)) == []
    held_first = board("worker-0", "worker-1")
    held_first.add("worker-1", 1, {"kind": "final", "test_accuracy": 0.5})
    assert held_first.add("worker-0", 1, {"kind": "final", "test_accuracy": 0.9}) == [
        ("worker-0", "test  acc 0.900"),
        ("worker-1", "the test result differs from worker-0's: test_accuracy 0.5000 (0.9000)")]


def test_held_records_are_shown_when_the_reporter_ends_without_its_own():
    b = board("worker-0", "worker-1")
    assert b.add("worker-1", 1, record(1)) == []
    assert b.release(["worker-1"]) == []
    assert b.release(["worker-0"]) == [("worker-1", epoch_text(record(1)))]
    assert b.add("worker-0", 1, record(2)) == [("worker-0", epoch_text(record(2)))]


def test_evaluator_and_other_kinds_are_shown_as_they_come():
    b = board("chief-0", "worker-0", "evaluator-0")
    assert b.add("evaluator-0", 1, {"kind": "epoch", "epoch": 2, "val_loss": 0.5}) == [
        ("evaluator-0", "epoch 2  val_loss 0.500")]
    assert b.add("worker-0", 1, {"kind": "custom", "step": 7, "lr": 0.01}) == [("worker-0", "custom  step 7  lr 0.0100")]


def test_a_new_attempt_starts_counting_epochs_again_and_releases_what_waited():
    b = board("worker-0", "worker-1")
    b.add("worker-1", 1, record(5))
    assert b.add("worker-0", 2, record(2)) == [("worker-1", epoch_text(record(5))), ("worker-0", epoch_text(record(2)))]
    assert b.epoch == 2 and b.attempt == 2


# ---------------------------------------------------------------------------------------------
# The console's writer


def console_of(**options) -> tuple[Console, io.StringIO, io.StringIO]:
    out, err = io.StringIO(), io.StringIO()
    made = Console(out, messages=err, **options)
    made.register(["worker-0", "worker-1"])
    return made, out, err


def test_metric_lines_are_rendered_and_chatter_hidden_on_the_console():
    console, out, _ = console_of()
    startup = "".join(line + "\n" for line in captured("tf_startup_cpu.txt")).encode()
    feed(console, "worker-1", startup + b"trainer: hello\n" + metric("worker-1", 3, **EPOCH3))
    feed(console, "worker-0", startup + metric("worker-0", 3, **EPOCH3) + b"after\n")
    console.close()
    assert out.getvalue() == (
        "worker-1 | trainer: hello\n"
        "worker-0 | epoch 3/8  loss 0.262  acc 0.920  val_loss 0.242  val_acc 0.911  2,575 samples/s  0.84 s\n"
        "worker-0 | after\n")
    assert console.hidden_lines == 2 * len(captured("tf_startup_cpu.txt"))


def test_verbose_shows_every_line_as_written():
    console, out, _ = console_of(verbose=True)
    startup = "".join(line + "\n" for line in captured("tf_startup_cpu.txt")).encode()
    feed(console, "worker-0", startup + metric("worker-0", 3, **EPOCH3))
    console.close()
    assert out.getvalue() == "".join(f"worker-0 | {line}\n" for line in (startup + metric("worker-0", 3, **EPOCH3))
                                     .decode().splitlines())


def test_quiet_still_follows_the_epochs_for_the_status_line():
    console, out, _ = console_of(quiet=True, status=True, clock=lambda: 0.0)
    feed(console, "worker-0", b"noise\n" + metric("worker-0", 2, epochs=5))
    console.task_states({"worker-0": TaskState.RUNNING, "worker-1": TaskState.RUNNING}, 1)
    wait_for(lambda: "epoch 2/5" in out.getvalue(), timeout=10, message="the epoch in the status line")
    console.close()
    assert "noise" not in out.getvalue()


def test_a_closed_stream_drops_console_output_and_nothing_else_notices():
    read_end, write_end = os.pipe()
    os.close(read_end)  # like `tflaunch ... | head -1` once head has exited
    stream = os.fdopen(write_end, "w")
    console = Console(stream, messages=io.StringIO(), colour=False)
    started = time.monotonic()
    for i in range(2000):
        console.task_block("worker-0", b"line %d\n" % i)
    console.message("still here")
    console.close(timeout=10)
    assert time.monotonic() - started < 5
    assert console.messages.getvalue() == "tflaunch: still here\n"
    stream.close()


def test_a_stalled_stream_never_blocks_the_caller_and_the_backlog_is_bounded():
    read_end, write_end = os.pipe()  # nobody reads: the pipe fills up, then every write blocks
    stream = os.fdopen(write_end, "w")
    err = io.StringIO()
    console = Console(stream, messages=err, colour=False, max_queued=256 << 10)
    line = b"x" * 99 + b"\n"
    started = time.monotonic()
    for _ in range(200):  # 2 MB: far more than the pipe and the queue hold
        console.task_block("worker-0", line * 100)
    queued_in = time.monotonic() - started
    # Nobody ever reads the pipe: a caller that waited for the terminal would wait forever.
    assert queued_in < 10, f"queueing took {queued_in:.2f} s: the caller waited for the terminal"
    with console._cond:
        assert console._queued <= (256 << 10) + len(line) * 100
    started = time.monotonic()
    console.close(timeout=0.5)  # gives up on the stalled stream, which would otherwise never drain
    assert time.monotonic() - started < 10
    os.close(read_end)  # the reader goes away: the writer thread sees EPIPE and ends
    console._thread.join(10)
    assert not console._thread.is_alive()
    assert console.dropped_lines > 0 and "fell behind" in err.getvalue()
    stream.close()


def test_the_status_line_sits_under_the_output_and_is_erased_at_the_end():
    now = [100.0]
    console, out, _ = console_of(status=True, clock=lambda: now[0])
    console.task_states({"worker-0": TaskState.RUNNING, "worker-1": TaskState.PENDING}, 1)
    now[0] += 75
    feed(console, "worker-0", b"hello\n" + metric("worker-0", 3, **EPOCH3))
    status = "tflaunch 1:15 | epoch 3/8 | worker-0 running  worker-1 pending | attempt 1"
    wait_for(lambda: out.getvalue().endswith(status), timeout=10, message=lambda: f"the status line in {out.getvalue()!r}")
    console.close()
    text = out.getvalue()
    # Erased: the summary starts on a clean line (after lines that were still waiting for twins).
    assert "tflaunch 1:15" not in text.rsplit("\r\x1b[K", 1)[1] and text.endswith(("\r\x1b[K", "\n"))
    visible = text.split("\r\x1b[K")
    assert "worker-0 | hello\n" in "".join(visible)


def test_no_status_line_and_no_colour_when_not_a_terminal():
    console, out, err = console_of()
    console.task_states({"worker-0": TaskState.RUNNING}, 1)
    console.task_block("worker-0", b"hello\n")
    console.message("done")
    console.close()
    assert out.getvalue() == "worker-0 | hello\n" and err.getvalue() == "tflaunch: done\n"


def test_a_message_after_close_is_still_written():
    console, out, err = console_of()
    console.message("first")
    console.close()
    console.message("after the end")
    assert err.getvalue() == "tflaunch: first\ntflaunch: after the end\n"


def test_many_tasks_are_counted_by_state_in_the_status_line():
    console = Console(io.StringIO(), messages=io.StringIO(), status=True, clock=lambda: 0.0)
    console.task_states({f"worker-{i}": (TaskState.RUNNING if i < 60 else TaskState.SUCCEEDED) for i in range(64)}, 2)
    wait_for(lambda: "64 tasks: 60 running, 4 succeeded | attempt 2" in console.stream.getvalue(), timeout=10,
             message=lambda: f"the counted states in {console.stream.getvalue()!r}")
    console.close()


class FakeTty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_colour_follows_the_terminal_and_no_color():
    assert wants_colour(FakeTty(), {})
    assert not wants_colour(FakeTty(), {"NO_COLOR": "1"})
    assert wants_colour(FakeTty(), {"NO_COLOR": ""})  # empty means unset (no-color.org)
    assert not wants_colour(io.StringIO(), {})


def test_the_console_thread_is_not_the_callers():
    # The pump's thread only queues: the write happens on the console's own thread.
    seen: list[str] = []

    class Recording(io.StringIO):
        def write(self, text: str) -> int:
            seen.append(threading.current_thread().name)
            return super().write(text)

    console = Console(Recording(), messages=io.StringIO())
    console.task_block("worker-0", b"x\n")
    console.close()
    assert seen and set(seen) == {"tflaunch-console"}


# ---------------------------------------------------------------------------------------------
# Closing summary figures


def test_training_lines_use_the_final_attempt_of_the_reporting_task():
    records = [
        {"kind": "epoch", "task": "worker-1", "epoch": 1, "loss": 9.0, "attempt": 2},
        {"kind": "epoch", "task": "worker-0", "epoch": 1, "loss": 5.0, "attempt": 1},
        *({"kind": "epoch", "task": "worker-0", "epoch": e, "loss": 1.0 / e, "accuracy": 0.5,
           "samples_per_second": 1000.0 * e, "attempt": 2} for e in (1, 2, 3)),
        {"kind": "final", "task": "worker-0", "test_loss": 0.25, "test_accuracy": 0.75,
         "total_seconds": 12.34, "attempt": 2},
    ]
    assert training_lines(records, 2) == [
        "training: 3 epochs, median 2,000 samples/s; last epoch: loss 0.333  acc 0.500",
        "test: acc 0.750  loss 0.250"]
    assert training_lines([], 1) == []


def test_task_table_has_state_exit_memory_and_cpu(tmp_path):
    from launcher.cluster.plan import TaskLaunch

    def task(name: str, state: TaskState, status: ExitStatus | None) -> Task:
        launch = TaskLaunch(name=name, role="worker", index=0, host="localhost", address="localhost:1",
                            local=True, argv=("true",), env={}, workdir="/")
        return Task(launch=launch, state=state, status=status)

    usage = {"worker-0": {"rss_mb_peak": 431.04, "cpu_percent_mean": 93.1, "cpu_percent_peak": 101.2}}
    lines = task_table([task("worker-0", TaskState.SUCCEEDED, ExitStatus(code=0)),
                        task("worker-1", TaskState.STOPPED, ExitStatus(signal=15))], usage)
    assert lines[0].split() == ["task", "host", "state", "exit", "peak", "RSS", "CPU", "mean", "CPU", "peak"]
    cells = [[cell.strip() for cell in line.split("  ") if cell.strip()] for line in lines[1:]]
    assert cells[0] == ["worker-0", "localhost", "succeeded", "exit code 0", "431 MB", "93 %", "101 %"]
    assert cells[1] == ["worker-1", "localhost", "stopped", "SIGTERM from tflaunch", "-", "-", "-"]


@pytest.mark.parametrize("status, words", [(ExitStatus(code=1), "exit code 1"),
                                           (ExitStatus(signal=9), "killed by SIGKILL"),
                                           (ExitStatus(error="lost the agent on node2 (eof)"), "lost the agent on node2 (eof)")])
def test_the_closing_summary_and_status_word_a_tasks_exit_alike(status, words):
    from launcher.cluster.plan import TaskLaunch
    from launcher.inspect.report import status_lines
    from launcher.inspect.status import RunState, TaskStatus

    launch = TaskLaunch(name="worker-1", role="worker", index=1, host="node2", address="node2:1",
                        local=False, argv=("true",), env={}, workdir="/")
    summary = task_table([Task(launch=launch, state=TaskState.FAILED, status=status)], {})
    assert words in summary[1] and status.describe() == words
    shown = TaskStatus("worker-1", "worker", "node2", False, "failed", 7, None, None, status.shell_code,
                       status.signal, status.error, None, None, None, None)
    lines = status_lines(RunState("r", "/r", "--local 2", "failed", 1, 1, None, 3.0, {}, [shown]))
    assert f"failed ({words})" in lines[2]


def test_a_table_of_many_tasks_folds_alike_tasks_and_names_tasks_that_never_started():
    from launcher.cluster.plan import TaskLaunch

    def task(index: int, state: TaskState, status: ExitStatus | None, started: float | None = 1.0) -> Task:
        launch = TaskLaunch(name=f"worker-{index}", role="worker", index=index, host="localhost",
                            address="localhost:1", local=True, argv=("true",), env={}, workdir="/")
        return Task(launch=launch, state=state, status=status, started_at=started)

    tasks = ([task(i, TaskState.STOPPED, ExitStatus(signal=15)) for i in range(0, 5)]
             + [task(5, TaskState.SUCCEEDED, ExitStatus(code=0)), task(6, TaskState.SUCCEEDED, ExitStatus(code=0))]
             + [task(i, TaskState.STOPPED, None, started=None) for i in range(7, 30)])
    usage = {"worker-1": {"rss_mb_peak": 100.0, "cpu_percent_mean": 10.0, "cpu_percent_peak": 50.0},
             "worker-3": {"rss_mb_peak": 120.0, "cpu_percent_mean": 30.0, "cpu_percent_peak": 40.0}}
    rows = [line.split("  ") for line in task_table(tasks, usage)[1:]]
    cells = [[cell.strip() for cell in row if cell.strip()] for row in rows]
    assert cells == [
        ["worker-[0-4] (5 tasks)", "localhost", "stopped", "SIGTERM from tflaunch", "120 MB", "20 %", "50 %"],
        ["worker-[5,6] (2 tasks)", "localhost", "succeeded", "exit code 0", "-", "-", "-"],
        ["worker-[7-29] (23 tasks)", "localhost", "not started", "-", "-", "-", "-"],
    ]
    assert len(task_table(tasks[:7], usage)) == 8  # 7 tasks: one row each


SHUTDOWN = [  # what MWMS and ParameterServer tasks print as tflaunch stops them, a successful run's end included
    "W0000 00:00:1795357848.580920   20415 preemption_notifier.cc:90] SIGTERM caught at 2026-11-22T14:30:48.580918041+00:00",
    "W0000 00:00:1795357875.049559   21882 local_rendezvous.cc:412] Local rendezvous is aborting with status: "
    "ABORTED: Collective ops is aborted by: the task was stopped",
    "/job:worker/replica:0/task:1",
    "The tasks have crashed. Check the task logs for an earlier error, or scheduler events (e.g. preemption, "
    "eviction) to debug further.",
    "The error could be from a previous operation. Restart your program to reset.",
    "\t [[{{node CollectiveReduceV2}}]] [type.googleapis.com/tensorflow.DerivedStatus='']",
    "W0000 00:00:1795357875.049559   21882 local_rendezvous.cc:412] Local rendezvous is aborting with status: "
    "CANCELLED: the step was cancelled",
]


def test_what_tensorflow_prints_as_tflaunch_stops_a_task_is_chatter_and_a_real_abort_is_not():
    chatter = Chatter()
    assert [chatter.hides("worker-1", line) for line in SHUTDOWN] == [True] * len(SHUTDOWN)
    kept = [line for line in captured("../errors/tensor-oom.txt") if "local_rendezvous" in line]
    assert kept and not any(Chatter().hides("worker-0", line) for line in kept)  # RESOURCE_EXHAUSTED: the cause
    chatter = Chatter()
    assert not chatter.hides("worker-0", "The tasks have crashed. on its own line, after a line of the program")
