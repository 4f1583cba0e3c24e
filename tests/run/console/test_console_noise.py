"""TensorFlow's noise kept off the console and in the logs: the continuation lines of a hidden C++
log message, chatter left out of a failure's last lines, and the other tasks' errors after a
failure stopped the cluster folded to one line per task. Every TensorFlow line here was captured
from real runs on this machine (tests/fixtures/console, tests/fixtures/errors)."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest

from launcher.records.logview import tail_lines
from launcher.records.metrics import metric_lines
from launcher.run.console.writer import Console
from launcher.run.console.chatter import Chatter, meaningful, starts_error
from launcher.run.console.stopfold import folded_text

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def captured(name: str) -> list[str]:
    return (FIXTURES / name).read_text().splitlines()


def block(lines: list[str]) -> bytes:
    return "".join(line + "\n" for line in lines).encode()


def console_of(**options) -> tuple[Console, io.StringIO, io.StringIO]:
    out, err = io.StringIO(), io.StringIO()
    made = Console(out, messages=err, **options)
    made.register(["worker-0", "worker-1"])
    return made, out, err


def feed(console: Console, task: str, data: bytes, attempt: int = 1) -> None:
    console.task_block(task, data, attempt, metric_lines(data)[1])


# ---------------------------------------------------------------------------------------------
# Continuation lines of a multi-line C++ log message


def test_every_line_of_a_real_start_up_at_log_level_0_is_chatter_continuations_included():
    # TF_CPP_MIN_LOG_LEVEL=0, one worker of `tflaunch --local 2` of the built-in trainer: the CPU
    # feature notice goes on over a second line, "Example stragglers:" lists a task per line.
    lines = captured("console/tf_startup_info.txt")
    assert any(line.startswith("To enable the following instructions:") for line in lines)
    assert "/job:worker/replica:0/task:1" in lines
    chatter = Chatter()
    assert [line for line in lines if not chatter.hides("worker-0", line)] == []


def test_a_continuation_is_hidden_only_right_after_a_hidden_line():
    lines = captured("console/tf_startup_info.txt")
    stragglers, task = lines.index("/job:worker/replica:0/task:1") - 1, "/job:worker/replica:0/task:1"
    chatter = Chatter()
    assert chatter.hides("worker-0", lines[stragglers])
    assert not chatter.hides("worker-1", task)  # another task's line: worker-1 hid nothing before it
    assert chatter.hides("worker-0", task)
    assert chatter.hides("worker-0", task)  # a list of stragglers goes on
    assert not chatter.hides("worker-0", "the program's own line")
    assert not chatter.hides("worker-0", task)  # the program printing a task name is not chatter


def test_the_continuations_of_a_shown_error_stay_with_it():
    # What a survivor printed when its peer was killed mid-collective: errors, shown whole.
    lines = captured("console/tf_peer_lost.txt")
    assert any(line.startswith("Additional GRPC error information") for line in lines)
    chatter = Chatter()
    assert [line for line in lines if chatter.hides("worker-0", line)] == []


def test_the_console_hides_a_continuation_that_comes_in_a_block_of_its_own():
    lines = captured("console/tf_startup_info.txt")
    cut = lines.index("/job:worker/replica:0/task:1")
    console, out, _ = console_of(tasks=["worker-0"])
    feed(console, "worker-0", block(lines[:cut]))
    feed(console, "worker-0", block(lines[cut:cut + 1]))  # the output pump read up to here first
    feed(console, "worker-0", block(lines[cut + 1:] + ["trainer: hello"]))
    feed(console, "worker-0", block(["/job:worker/replica:0/task:1 is the program's own"]))
    console.close()
    assert out.getvalue() == ("worker-0 | trainer: hello\n"
                              "worker-0 | /job:worker/replica:0/task:1 is the program's own\n")
    assert console.hidden_lines == len(lines)


# ---------------------------------------------------------------------------------------------
# A failure's last lines without the chatter


def test_the_tail_of_a_killed_worker_skips_the_chatter_and_the_log_keeps_it(tmp_path):
    # worker-1 of a user's MultiWorkerMirroredStrategy script, SIGKILLed after its second epoch:
    # 11 of its 13 lines are TensorFlow's.
    lines = captured("console/tf_killed_worker.txt")
    log = tmp_path / "worker-1.log"
    log.write_text(block(lines).decode())
    assert tail_lines(log, 20) == lines
    assert tail_lines(log, 20, keep=meaningful()) == ["epoch 1", "epoch 2"]
    assert tail_lines(log, 1, keep=meaningful()) == ["epoch 2"]
    assert log.read_text().splitlines() == lines


def test_the_tail_filter_keeps_the_programs_lines_and_errors_of_a_real_failure(tmp_path):
    lines = captured("errors/peer-connection-lost.txt")
    log = tmp_path / "worker-0.log"
    log.write_text(block(lines).decode())
    kept = tail_lines(log, 200, keep=meaningful())
    assert "Traceback (most recent call last):" in kept
    assert all(" cudart_stub.cc:" not in line and not line.startswith("WARNING: All log messages") for line in kept)
    assert kept == [line for line in lines if line in kept]  # in order, nothing rewritten


# ---------------------------------------------------------------------------------------------
# After a failure stopped the cluster: the other tasks' output folded


def after_stop() -> list[str]:
    """A survivor's output once its peer died: gRPC errors and a Python traceback (a real capture)."""
    lines = captured("errors/peer-connection-lost.txt")
    return lines[lines.index("Traceback (most recent call last):") - 4:]


def test_after_the_stop_the_survivors_lines_fold_to_one_line_and_the_root_causes_stay():
    console, out, err = console_of()
    feed(console, "worker-0", b"epoch 1 done\n")
    console.message("a message of tflaunch's: what waited for twins prints before it")
    console.stop_began(1, "worker-1", "worker-1 on localhost failed (exit code 3): stopping the cluster")
    feed(console, "worker-0", block(after_stop()[:10]))
    feed(console, "worker-1", b"worker-1's own last words\n")
    feed(console, "worker-0", block(after_stop()[10:]))
    console.message("run failed")
    console.close()
    shown = out.getvalue()
    assert "Traceback" not in shown and "UnavailableError" not in shown
    assert shown == ("worker-0 | epoch 1 done\n"
                     "worker-1 | worker-1's own last words\n"
                     f"worker-0 | {folded_text(len(after_stop()), 'worker-0', 'worker-1')}\n")
    assert folded_text(len(after_stop()), "worker-0", "worker-1") == (
        f"… {len(after_stop())} lines since worker-1 failed, not shown here (worker-0.log has them all)")
    assert err.getvalue().splitlines()[-1] == "tflaunch: run failed"


FOLDED_ONE = f"worker-0 | {folded_text(1, 'worker-0', 'worker-1')}\n"


def shown_after_a_stop(data: bytes, **options) -> str:
    """The console's output when worker-0 writes ``data`` after worker-1's failure stopped the cluster."""
    console, out, _ = console_of(**options)
    console.stop_began(1, "worker-1", "stopping")
    feed(console, "worker-0", data)
    console.close()
    return out.getvalue()


def test_the_folded_line_prints_at_the_end_when_no_message_follows():
    assert shown_after_a_stop(b"Traceback (most recent call last):\n", tasks=["worker-0"]) == FOLDED_ONE
    assert folded_text(1, "worker-0", "worker-1").startswith("… 1 line since worker-1 failed,")


def test_verbose_folds_nothing():
    assert shown_after_a_stop(b"Traceback (most recent call last):\n", verbose=True) == (
        "worker-0 | Traceback (most recent call last):\n")


def test_a_metric_line_after_the_stop_still_counts_for_the_run_and_is_not_counted_as_noise():
    data = b'TFLAUNCH_METRIC {"kind":"epoch","task":"worker-0","epoch":3}\nerror\n'
    assert shown_after_a_stop(data, tasks=["worker-0"]) == "worker-0 | epoch 3\n" + FOLDED_ONE


def test_the_next_attempt_is_shown_again():
    console, out, _ = console_of(tasks=["worker-0"])
    console.stop_began(1, "worker-1", "stopping")
    feed(console, "worker-0", b"CancelledError\n")
    console.message("attempt 1 failed; restarting the whole cluster")
    feed(console, "worker-0", b"attempt 2 starts\n", attempt=2)
    console.close()
    assert out.getvalue() == FOLDED_ONE + "worker-0 | attempt 2 starts\n"

def test_the_errors_a_survivor_printed_just_before_tflaunch_saw_the_failure_fold_too():
    # Measured here: worker-0's collective errors reached its log 35 ms before the supervisor saw
    # worker-1 die (tests/fixtures/console/tf_peer_lost.txt). Lines still waiting for their twins
    # then (the last half second's) fold with what follows, from the first error on; older
    # lines were shown already.
    console, out, err = console_of()
    feed(console, "worker-0", b"earlier line\n")
    time.sleep(0.8)  # printed by now: more than half a second old
    feed(console, "worker-0", b'TFLAUNCH_METRIC {"kind":"epoch","task":"worker-0","epoch":2}\n'
                              b"the program's own line just before\n")
    feed(console, "worker-0", block(captured("console/tf_peer_lost.txt")))
    feed(console, "worker-1", b"worker-1's last words\n")
    console.stop_began(1, "worker-1", "worker-1 on localhost failed (killed by SIGKILL): stopping the cluster")
    feed(console, "worker-0", block(after_stop()))
    console.message("run failed")
    console.close()
    count = len(captured("console/tf_peer_lost.txt")) + len(after_stop())
    assert out.getvalue() == ("worker-0 | earlier line\n"
                              "worker-0 | epoch 2\n"
                              "worker-0 | the program's own line just before\n"
                              "worker-1 | worker-1's last words\n"
                              f"worker-0 | {folded_text(count, 'worker-0', 'worker-1')}\n")
    assert err.getvalue() == ("tflaunch: worker-1 on localhost failed (killed by SIGKILL): stopping the cluster\n"
                              "tflaunch: run failed\n")


@pytest.mark.parametrize("line, starts", [
    (captured("console/tf_peer_lost.txt")[0], True),   # E0000 ... ring_alg.cc:291] Aborting RingReduce
    (captured("console/tf_peer_lost.txt")[6], True),   # W0000 ... local_rendezvous.cc:412]
    ("Traceback (most recent call last):", True),
    ("2024-01-01 12:00:00.123456: E tensorflow/core/x.cc:9] an error in the old format", True),
    (captured("console/tf_startup_info.txt")[1], False),  # an INFO line
    (captured("console/tf_peer_lost.txt")[1], False),  # a continuation: not where a report starts
    ("epoch 2  loss 0.717", False),
])
def test_where_a_report_of_an_error_starts(line, starts):
    assert starts_error(line.encode()) is starts
