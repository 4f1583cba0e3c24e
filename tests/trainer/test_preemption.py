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


def running_in_epoch_2(tflaunch, options, workers: int = 2, epochs: int = 3, restarts: int = 1):
    """A trainer run of ``workers`` workers with ``restarts`` restarts allowed, once epoch 1 of ``epochs``
    is done: (its process, its run folder, its run.json then)."""
    proc = tflaunch.start("--local", str(workers), "--max-restarts", str(restarts), "--restart-delay", "0", "--",
                          "python", "-m", "trainer", "--epochs", str(epochs), *options)
    run_dir = wait_for(tflaunch.latest_run, timeout=60, message="the run folder")
    wait_for(lambda: epoch_done(run_dir, 1) or proc.poll() is not None, timeout=180, message="epoch 1")
    assert proc.poll() is None, "the run ended before the tasks could be stopped"
    return proc, run_dir, json.loads((run_dir / "run.json").read_text())


@pytest.mark.timeout(300)
# Backups after a step, which the restart resumes right after. Epoch-level backups, whose
# interrupted epoch is repeated: the first of the two restarts in tests/run/lifecycle/test_restarts.py.
# The custom loop's: test_a_preempted_custom_loop_resumes_after_its_step_then_from_a_killed_workers_epoch.
def test_sigterm_saves_a_backup_and_the_restart_resumes_from_it(tflaunch):
    proc, run_dir, record = running_in_epoch_2(tflaunch, ("--backup-every", "5"))
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


def records(run_dir, kind: str, task: str, attempt: int) -> list[dict]:
    metrics = run_dir / "metrics.jsonl"
    found = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] if metrics.exists() else []
    return [r for r in found if (r.get("kind"), r.get("task"), r.get("attempt")) == (kind, task, attempt)]


def backup_states(run_dir) -> dict[str, str]:
    """The texts of the backup's checkpoint state files, which each save writes last."""
    return {str(path): path.read_text() for path in (run_dir / "backup").rglob("checkpoint")}


EPOCHS = 4


@pytest.mark.timeout(300)
def test_a_preempted_custom_loop_resumes_after_its_step_then_from_a_killed_workers_epoch(tflaunch):
    # One run of the custom loop, two faults: every task SIGTERMed in epoch 2 saves after a step, which
    # attempt 2 resumes right after; then, once attempt 2 backed up the end of that epoch, worker-1 is
    # SIGKILLed, and attempt 3 resumes from that backup.
    proc, run_dir, record = running_in_epoch_2(tflaunch, ("--loop", "custom", "--collective", "ring"),
                                               epochs=EPOCHS, restarts=2)
    for task in record["tasks"]:  # as a scheduler's preemption does: every task at once
        try:
            psutil.Process(task["pid"]).send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    # Attempt 2 saves no backup before its first epoch ends: what is there now is the SIGTERM's.
    wait_for(lambda: (run_dir / "attempt-1").exists() and backup_states(run_dir), timeout=120,
             message="attempt 2 to start from a backup")
    saved = backup_states(run_dir)
    first = (run_dir / "attempt-1" / "worker-0.log").read_text()
    preempted = re.search(r"SIGTERM: backup saved in epoch (\d+) after step (\d+)", first)
    assert preempted, first[-2000:]
    epoch, step = int(preempted.group(1)), int(preempted.group(2))
    assert epoch < EPOCHS, first[-2000:]
    wait_for(lambda: records(run_dir, "epoch", "worker-0", 2) or proc.poll() is not None, timeout=180,
             message=f"epoch {epoch} of attempt 2")
    wait_for(lambda: backup_states(run_dir) != saved or proc.poll() is not None, timeout=60,
             message=f"epoch {epoch}'s backup in attempt 2")
    assert proc.poll() is None, "the run ended before worker-1 could be killed"
    worker_1 = next(t for t in tflaunch.live_tasks() if t["name"] == "worker-1")
    psutil.Process(worker_1["pid"]).send_signal(signal.SIGKILL)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-3000:]
    final = json.loads(run_dir.joinpath("run.json").read_text())
    assert [a["outcome"] for a in final["attempts"]] == ["failed", "failed", "succeeded"]
    assert final["attempts"][0]["exit_code"] == 128 + signal.SIGTERM  # ended by SIGTERM, as before
    assert final["attempts"][1]["failed_task"] == "worker-1" and "SIGKILL" in final["attempts"][1]["reason"]

    # The preemption: attempt 2 went on right after the saved step.
    second = (run_dir / "attempt-2" / "worker-0.log").read_text()
    assert f"resuming from backup at epoch {epoch} step {step + 1}" in second, second[:2000]
    assert [r["epoch"] for r in records(run_dir, "epoch", "worker-0", 2)][0] == epoch

    # The kill: each worker resumed from the backup of the epoch attempt 2 finished, and trained on.
    resumed = records(run_dir, "epoch", "worker-0", 3)[0]["epoch"]
    assert epoch < resumed <= EPOCHS
    for name in ("worker-0", "worker-1"):
        assert "trainer: resuming from backup at epoch %d\n" % resumed in (run_dir / f"{name}.log").read_text()
        assert [r["epoch"] for r in records(run_dir, "epoch", name, 3)] == list(range(resumed, EPOCHS + 1))
    (done,) = records(run_dir, "final", "worker-0", 3)
    assert done["test_accuracy"] >= 0.85, done
    assert not (run_dir / "backup" / "chief").exists()  # a finished run leaves no backup behind
