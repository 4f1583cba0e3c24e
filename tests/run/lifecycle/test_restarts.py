"""Fault tolerance for real: whole-cluster restarts that resume, identical failures, watchdogs."""

from __future__ import annotations

import json
import os
import re
import signal
import sys

import pytest

from cgroups import CpuQuota, cpu_quotas_available
from conftest import TASK
from polling import wait_for

pytestmark = pytest.mark.timeout(300)


def metrics_of(run_dir) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


EPOCHS = 4


def backup_states(run_dir) -> dict[str, str]:
    """The texts of the backup's checkpoint state files, which each save writes last."""
    return {str(path): path.read_text() for path in (run_dir / "backup").rglob("checkpoint")}


@pytest.mark.slow
@pytest.mark.tensorflow
def test_a_preempted_run_and_then_a_worker_killed_mid_epoch_each_restart_and_resume_from_backup(tflaunch):
    # One run, two faults: every task SIGTERMed in epoch 2, as a scheduler's preemption does, saves an
    # epoch-level backup and the restart repeats that epoch; then worker-1 SIGKILLed in epoch 3 (after
    # epoch 2's backup) and the next restart resumes from the last epoch's backup.
    proc = tflaunch.start("--local", "2", "--max-restarts", "2", "--restart-delay", "0.5", "--",
                          "python", "-m", "trainer", "--epochs", str(EPOCHS), "--width", "1")

    def epoch_done(epoch: int, attempt: int):
        if proc.poll() is not None:
            pytest.fail(f"tflaunch exited {proc.returncode} before epoch {epoch} of attempt {attempt} ended:\n"
                        f"{proc.stderr.read()[-3000:]}")
        run_dir = tflaunch.latest_run()
        return run_dir if run_dir and any(m["kind"] == "epoch" and m["epoch"] == epoch and m["attempt"] == attempt
                                          for m in metrics_of(run_dir)) else None

    run_dir = wait_for(lambda: epoch_done(1, 1), timeout=180, interval=0.1, message="epoch 1 to end")
    for task in json.loads((run_dir / "run.json").read_text())["tasks"]:  # every task at once
        try:
            os.kill(task["pid"], signal.SIGTERM)
        except ProcessLookupError:
            pass
    # Attempt 2 saves no backup before its first epoch ends: what is there now is the SIGTERM's.
    wait_for(lambda: (run_dir / "attempt-1").exists() and backup_states(run_dir), timeout=120,
             message="attempt 2 to start from a backup")
    saved = backup_states(run_dir)
    first = (run_dir / "attempt-1" / "worker-0.log").read_text()
    preempted = re.search(r"SIGTERM: backup saved in epoch (\d+) after step (\d+)", first)
    assert preempted, first[-2000:]
    repeated = int(preempted.group(1))
    assert repeated < EPOCHS, first[-2000:]
    wait_for(lambda: epoch_done(repeated, 2), timeout=180, interval=0.1, message=f"epoch {repeated} of attempt 2 to end")
    wait_for(lambda: backup_states(run_dir) != saved, timeout=60, message=f"epoch {repeated}'s backup in attempt 2")
    manifest = json.loads((run_dir / "run.json").read_text())
    os.kill(next(t["pid"] for t in manifest["tasks"] if t["name"] == "worker-1"), signal.SIGKILL)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-3000:]
    run_dir = tflaunch.latest_run()
    manifest = json.loads((run_dir / "run.json").read_text())
    assert [a["outcome"] for a in manifest["attempts"]] == ["failed", "failed", "succeeded"]
    assert manifest["attempts"][0]["exit_code"] == 128 + signal.SIGTERM  # the preemption: ended by SIGTERM
    assert manifest["attempts"][1]["failed_task"] == "worker-1"
    assert "SIGKILL" in manifest["attempts"][1]["reason"]

    # The preemption: the epoch it stopped repeated from the backup saved in it.
    for name in ("worker-0", "worker-1"):
        second = (run_dir / "attempt-2" / f"{name}.log").read_text()
        assert f"trainer: resuming from backup at epoch {repeated}\n" in second, second[-3000:]
    records = metrics_of(run_dir)
    assert [m["epoch"] for m in records if m["kind"] == "epoch" and m["task"] == "worker-0" and m["attempt"] == 2][0] \
        == repeated

    # The kill: resumed from the backup of the epoch before, not from the preemption's.
    third = [m for m in records if m["kind"] == "epoch" and m["attempt"] == 3 and m["task"] == "worker-0"]
    first_epoch_of_third = third[0]["epoch"]
    assert repeated < first_epoch_of_third <= EPOCHS
    assert [m["epoch"] for m in third] == list(range(first_epoch_of_third, EPOCHS + 1))
    for name in ("worker-0", "worker-1"):  # each worker resumed from the backup tflaunch offered
        log = (run_dir / f"{name}.log").read_text()
        assert f"trainer: resuming from backup at epoch {first_epoch_of_third}\n" in log, log[-3000:]
    final = [m for m in records if m["kind"] == "final" and m["task"] == "worker-0"]
    assert len(final) == 1 and final[0]["attempt"] == 3 and final[0]["epochs"] == EPOCHS, final
    assert final[0]["test_accuracy"] >= 0.85, final
    # A finished run leaves no backup behind, so the next run starts afresh.
    assert not (run_dir / "backup" / "chief").exists()
    assert (run_dir / "attempt-2" / "worker-1.log").exists() and (run_dir / "worker-1.log").exists()
    assert b"[3] worker-0 | " in (run_dir / "merged.log").read_bytes()
    assert "resum" in (run_dir / "worker-0.log").read_text().lower()
    assert "resum" not in first.lower()


def test_attempt_number_reaches_tasks_and_logs(tflaunch):
    done = tflaunch.run("--local", "1", "--max-restarts", "1", "--restart-delay", "0", "--", "python", TASK,
                        "env", 'print:TFLAUNCH_METRIC {"kind":"progress"}', "exit:5")
    assert done.returncode == 5
    seen = [json.loads(line.split("ENV ", 1)[1]) for line in done.merged.decode().splitlines() if "| ENV " in line]
    assert [s["TFLAUNCH_ATTEMPT"] for s in seen] == ["1", "2"]
    assert all(s["TFLAUNCH_BACKUP_DIR"] == str(done.run_dir.resolve() / "backup") for s in seen)
    assert [m["attempt"] for m in metrics_of(done.run_dir)] == [1, 2]
    assert len(done.record["attempts"]) == 2 and done.record["max_restarts"] == 1
    # Each attempt's own log: the latest at the top of the run folder, the first moved into attempt-1/.
    logs = {"1": done.run_dir / "attempt-1" / "worker-0.log", "2": done.run_dir / "worker-0.log"}
    for attempt, path in logs.items():
        assert path.is_file() and not path.is_symlink()
        shown = [json.loads(line.split("ENV ", 1)[1]) for line in path.read_text().splitlines() if "ENV " in line]
        assert [s["TFLAUNCH_ATTEMPT"] for s in shown] == [attempt]
    assert not (done.run_dir / "attempt-2").exists()


def test_failure_with_progress_exhausts_every_restart(tflaunch):
    done = tflaunch.run("--local", "2", "--max-restarts", "2", "--restart-delay", "0", "--", "python", TASK,
                        'print:TFLAUNCH_METRIC {"kind":"progress"}', "exit-if:worker-0:7", "forever")
    assert done.returncode == 7
    assert [a["outcome"] for a in done.record["attempts"]] == ["failed"] * 3
    assert "after 3 attempts" in done.stderr


def test_identical_failure_before_progress_stops_early(tflaunch):
    done = tflaunch.run("--local", "2", "--max-restarts", "5", "--restart-delay", "0", "--", "python", TASK,
                        "stderr:ModuleNotFoundError: No module named 'missing'", "exit-if:worker-1:3", "forever")
    assert done.returncode == 3
    assert len(done.record["attempts"]) == 2
    assert "failed exactly like attempt 1" in done.stderr
    assert "No module named 'missing'" in done.stderr


def test_hang_watchdog_collects_stacks_of_every_task(tflaunch):
    done = tflaunch.run("--local", "2", "--hang-timeout", "2", "--", "python", TASK, "print:started", "forever")
    assert done.returncode == 124
    assert "hang timeout" in done.stderr
    stacks = done.run_dir / "attempt-1" / "stacks"
    for name in ("worker-0", "worker-1"):
        text = (stacks / f"{name}.txt").read_text()
        assert "task.py" in text and "main" in text, text
    assert done.record["attempts"][0]["reason"].startswith("hang timeout")


def test_hang_then_restart_per_policy(tflaunch):
    done = tflaunch.run("--local", "1", "--hang-timeout", "1.5", "--max-restarts", "1", "--restart-delay", "0",
                        "--", "python", TASK, "print:started", "forever")
    assert done.returncode == 124
    assert [a["outcome"] for a in done.record["attempts"]] == ["failed", "failed"]
    assert (done.run_dir / "attempt-2" / "stacks" / "worker-0.txt").exists()


BUSY = "import time\nend = time.time() + {seconds}\nwhile time.time() < end:\n    sum(range(10000))\nprint('trained')"


def test_start_timeout_spares_a_script_that_works_without_metric_lines(tflaunch):
    # Like a Keras script training under MultiWorkerMirroredStrategy: busy, and no TFLAUNCH_METRIC line.
    done = tflaunch.run("--local", "2", "--start-timeout", "4", "--", "python", "-c", BUSY.format(seconds=12))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "start timeout" not in done.stderr
    assert [a["outcome"] for a in done.record["attempts"]] == ["succeeded"]


@pytest.mark.skipif(not cpu_quotas_available(), reason="needs root and a cgroup CPU controller")
def test_start_timeout_spares_a_script_held_back_by_a_cpu_quota(tflaunch):
    # A container's CPU limit (a pod's, a job's cgroup) far below what the tasks want: each computes
    # on a few hundredths of a core and waits for the quota the rest of the time. It wants to run:
    # it is not waiting for a peer (and the quota costs this machine nothing, unlike busy neighbours).
    quota = CpuQuota(0.05)
    try:
        enter = f'echo $$ > {quota.folder / "cgroup.procs"} && exec "$0" "$@"'
        # This Python, not a `python` found on PATH: a shim there (pyenv's) is a shell script that starts
        # several short-lived processes, and at 5 % of a core they would take the timeout's first seconds.
        done = tflaunch.run("--local", "2", "--start-timeout", "4", "--", "sh", "-c", enter, sys.executable, "-c",
                            BUSY.format(seconds=7))
    finally:
        quota.remove()
    assert done.returncode == 0, done.stderr[-2000:]
    assert "start timeout" not in done.stderr
    figures = json.loads((done.run_dir / "resources.json").read_text())["tasks"]
    assert all(f["cpu_percent_mean"] < 10 for f in figures.values()), figures  # held back indeed


@pytest.mark.skipif(not cpu_quotas_available(), reason="needs root and a cgroup CPU controller")
def test_start_timeout_spares_a_script_whose_work_runs_in_short_lived_processes_held_back_by_a_quota(tflaunch):
    # A shell script whose work is done by one short-lived process after another (as an interpreter
    # shim's is at its start), under a CPU limit far below what they want: each waits for the quota
    # most of its life, and what it waited leaves with it when it ends unless the agent keeps it.
    quota = CpuQuota(0.05)
    work = 'n=0; while [ $n -lt 8 ]; do sh -c "i=0; while [ \\$i -lt 20000 ]; do i=\\$((i+1)); done"; n=$((n+1)); done'
    try:
        enter = f'echo $$ > {quota.folder / "cgroup.procs"} && exec "$0" "$@"'
        done = tflaunch.run("--local", "2", "--start-timeout", "4", "--", "sh", "-c", enter, "sh", "-c", work)
    finally:
        quota.remove()
    assert done.returncode == 0, done.stderr[-2000:]
    assert "start timeout" not in done.stderr
    assert done.record["duration_seconds"] > 6  # held back indeed: it ran past the start timeout


def test_start_timeout_names_the_task_that_never_joined(tflaunch):
    done = tflaunch.run("--local", "2", "--start-timeout", "3", "--", "python", TASK,
                        "sleep-if:worker-1:600", 'print:TFLAUNCH_METRIC {"kind":"progress"}', "forever")
    assert done.returncode == 124
    first = done.stderr.splitlines()
    verdict = next(line for line in first if "start timeout" in line and "failed" in line)
    assert "worker-1" in verdict and "worker-0" not in verdict.split("start timeout", 1)[1]
    # worker-1 printed nothing: no "last 0 lines" header for it
    assert not any(line.startswith("tflaunch: worker-1 (host localhost): last") for line in first)
    assert done.record["attempts"][0]["blamed_tasks"] == ["worker-1"]
