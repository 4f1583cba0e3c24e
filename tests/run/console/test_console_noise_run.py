"""TensorFlow's noise off the console and in the logs, through the real ``tflaunch``: a failure's
last lines without start-up chatter, and the other tasks' errors after the failure folded to one
line per task while their logs and merged.log keep every line."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from conftest import TASK
from launcher.run.console.stopfold import folded_text
from polling import wait_for

pytestmark = pytest.mark.slow

# Real lines of a CPU-only TensorFlow start-up (tests/fixtures/console/tf_killed_worker.txt).
CHATTER = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1795920192.482364   17577 cudart_stub.cc:31] Could not find cuda drivers on your machine, "
    "GPU will not be used.",
    "I0000 00:00:1795920193.015248   17577 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to use "
    "available CPU instructions in performance-critical operations.",
    "To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow with the appropriate "
    "compiler flags.",
]


def test_a_failure_shows_its_meaningful_last_lines_and_folds_the_survivors_traceback(tflaunch):
    # worker-0 prints TensorFlow's start-up chatter, its own line, and fails; worker-1 raises a
    # Python exception when tflaunch stops it (as a worker whose collective broke does).
    actions = ["traceback-on-term", "print:ready", *(f"stderr:{line}" for line in CHATTER),
               "print:worker-0 gives up", "sleep-if:worker-0:0.7", "exit-if:worker-0:3", "forever"]
    done = tflaunch.run("--local", "2", "--", "python", TASK, *actions)
    assert done.returncode == 3, done.stderr
    run_dir = done.run_dir
    survivor = (run_dir / "worker-1.log").read_text()
    assert "Traceback (most recent call last):" in survivor and "RuntimeError: collective" in survivor
    assert "Traceback" not in done.stdout and "RuntimeError" not in done.stdout, done.stdout
    count = len(survivor.splitlines()) - len(CHATTER) - 2  # its lines since worker-0 failed
    assert f"worker-1 | {folded_text(count, 'worker-1', 'worker-0')}\n" in done.stdout, done.stdout
    assert "worker-[0,1] | worker-0 gives up\n" in done.stdout  # the root cause's own lines stay
    assert "] worker-1 | Traceback (most recent call last):" in (run_dir / "merged.log").read_text()
    # The summary's tail of worker-0 skips the chatter and says where all of its output is.
    summary = done.stderr[done.stderr.index("root cause: worker-0"):]
    tail = summary.splitlines()[1:4]
    assert tail == ["tflaunch:   worker-0 | ready", "tflaunch:   worker-0 | worker-0 gives up",
                    f"tflaunch:   (all of its output, TensorFlow's start-up chatter included: "
                    f"{run_dir / 'worker-0.log'})"], summary
    assert all(line in (run_dir / "worker-0.log").read_text() for line in CHATTER)
    record = json.loads((run_dir / "run.json").read_text())
    assert record["root_cause"]["tail"] == ["ready", "worker-0 gives up"]


def kill_mid_training(tflaunch) -> tuple[str, str, Path, list[str]]:
    """Two workers of the built-in trainer, worker-1 SIGKILLed as their second epoch starts:
    tflaunch's output and error, the run folder, and the lines worker-0 wrote after its last epoch."""
    before = tflaunch.latest_run()
    proc = tflaunch.start("--local", "2", "--", sys.executable, "-m", "trainer", "--epochs", "20",
                          "--steps-per-epoch", "40")
    wait_for(lambda: tflaunch.latest_run() != before and '"task":"worker-0","epoch":1,' in tflaunch.merged_text(),
             timeout=240, interval=0.1, message="worker-0's first epoch")
    victim = next(task["pid"] for task in tflaunch.live_tasks() if task["name"] == "worker-1")
    os.kill(victim, signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGKILL, err
    run_dir = tflaunch.latest_run()
    survivor = (run_dir / "worker-0.log").read_text()
    return out, err, run_dir, survivor[survivor.rindex('"epoch":'):].splitlines()[1:]


@pytest.mark.tensorflow
def test_a_worker_killed_mid_training_leaves_one_line_for_the_survivors_errors(tflaunch):
    # worker-0's collective breaks: its gRPC errors (and whatever it prints while it is stopped)
    # are in its log and merged.log, and one line on the console. Whether it says anything before
    # tflaunch's SIGTERM ends it is TensorFlow's race (about half the runs here, under load): a
    # second run when the first left nothing to fold; the cheap test above always has some.
    for _ in range(2):
        out, err, run_dir, after = kill_mid_training(tflaunch)
        if after:
            break
    assert "root cause: worker-1" in err, err
    for line in after:
        assert f"worker-0 | {line}\n" not in out, out
        assert f"] worker-0 | {line}" in (run_dir / "merged.log").read_text()
    folded = "since worker-1 failed, not shown here (worker-0.log has them all)"
    assert (f"worker-0 | … {len(after)} lines {folded}\n" in out) == bool(after), out
    assert "Traceback" not in out and "Additional GRPC error information" not in out, out
