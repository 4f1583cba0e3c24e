"""A stopped training task saves where it is: SIGTERM makes the built-in trainer write its backup at
the next step boundary and end by SIGTERM, so a restarted (or requeued) run resumes from that step.
A SIGTERM that reaches one worker of several stops them all after the same step: test_resize.py."""

from __future__ import annotations

import json
import re
import signal

import psutil
import pytest
from polling import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.tensorflow]


def epoch_done(run_dir, epoch: int) -> bool:
    metrics = run_dir / "metrics.jsonl"
    return metrics.exists() and any(
        json.loads(line).get("kind") == "epoch" and json.loads(line).get("epoch") == epoch
        for line in metrics.read_text().splitlines() if line.strip())


def running_in_epoch_2(tflaunch, options, workers: int = 2):
    """A trainer run of ``workers`` workers with one restart allowed, once epoch 1 of 3 is done: (its
    process, its run folder, its run.json then)."""
    proc = tflaunch.start("--local", str(workers), "--max-restarts", "1", "--restart-delay", "0", "--",
                          "python", "-m", "trainer", "--epochs", "3", *options)
    run_dir = wait_for(tflaunch.latest_run, timeout=60, message="the run folder")
    wait_for(lambda: epoch_done(run_dir, 1) or proc.poll() is not None, timeout=180, message="epoch 1")
    assert proc.poll() is None, "the run ended before the tasks could be stopped"
    return proc, run_dir, json.loads((run_dir / "run.json").read_text())


@pytest.mark.timeout(300)
# Backups after a step, which the restart resumes right after. Epoch-level backups, whose
# interrupted epoch is repeated: the first of the two restarts in tests/run/lifecycle/test_restarts.py.
@pytest.mark.parametrize("options", [("--backup-every", "5"), ("--loop", "custom")], ids=["fit", "custom"])
def test_sigterm_saves_a_backup_and_the_restart_resumes_from_it(tflaunch, options):
    proc, run_dir, record = running_in_epoch_2(tflaunch, options)
    for task in record["tasks"]:  # as a scheduler's preemption does: every task at once
        try:
            psutil.Process(task["pid"]).send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-3000:]
    first = (run_dir / "attempt-1" / "worker-0.log").read_text()
    saved = re.search(r"SIGTERM: backup saved in epoch (\d+) after step (\d+)", first)
    assert saved, first[-2000:]
    epoch, step = int(saved.group(1)), int(saved.group(2))
    second = (run_dir / "worker-0.log").read_text()
    assert f"resuming from backup at epoch {epoch} step {step + 1}" in second, second[:2000]
    final = json.loads(run_dir.joinpath("run.json").read_text())
    assert final["attempts"][0]["exit_code"] == 128 + signal.SIGTERM  # ended by SIGTERM, as before


@pytest.mark.timeout(300)
def test_a_lone_worker_saves_after_the_step_it_was_signalled_in_without_agreeing_with_anyone(tflaunch):
    proc, run_dir, record = running_in_epoch_2(tflaunch, ("--backup-every", "5"), workers=1)
    psutil.Process(record["tasks"][0]["pid"]).send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-3000:]
    first = (run_dir / "attempt-1" / "worker-0.log").read_text()
    saved = re.search(r"SIGTERM: backup saved in epoch (\d+) after step (\d+)", first)
    assert saved, first[-2000:]
    assert "agree on stopping" not in first  # one worker has nobody to agree with: no reduction
    epoch, step = (int(x) for x in saved.groups())
    assert f"resuming from backup at epoch {epoch} step {step + 1}" in (run_dir / "worker-0.log").read_text()
