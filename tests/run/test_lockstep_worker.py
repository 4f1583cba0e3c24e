"""The stand-in worker (tests/workers/lockstep.py) keeps a TensorFlow task's contract with tflaunch.

The launcher's tests of restarts, hosts, hangs, watchdogs and the console run it instead of
TensorFlow; these tests hold it to what those tests rely on: a mesh over TF_CONFIG's addresses,
lock step, metric and Keras lines, backup and resume, and a hang whose culprit py-spy can see.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import LOCKSTEP
from launcher.agent.threads import ThreadWatch
from polling import wait_for

HANG_TIMEOUT = 6
PEERS = str(Path(LOCKSTEP).with_name("peers.py"))


def records(run_dir: Path, kind: str, task: str | None = None) -> list[dict]:
    found = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in found if r.get("kind") == kind and (task is None or r.get("task") == task)]


def line_of(marker: str, path: str = LOCKSTEP) -> int:
    return next(n for n, text in enumerate(Path(path).read_text().splitlines(), 1) if marker in text)


def test_three_tasks_meet_step_in_lock_step_and_the_chief_saves(tflaunch, tmp_path):
    done = tflaunch.run("--local", "2", "--chief", "--env", f"TFLAUNCH_CHECKPOINT_DIR={tmp_path / 'ckpt'}", "--",
                        "python", LOCKSTEP, "--epochs", "2", "--steps", "4")
    assert done.returncode == 0, done.stderr[-3000:]
    losses = {}
    for name in ("chief-0", "worker-0", "worker-1"):
        text = done.task_output(name)
        assert "cluster formed with 3 training tasks" in text and "Epoch 2/2" in text
        assert "4/4 [==============================] - " in text  # Keras's epoch line
        epochs = records(done.run_dir, "epoch", name)
        assert [r["epoch"] for r in epochs] == [1, 2] and {r["global_batch"] for r in epochs} == {96}
        losses[name] = [r["loss"] for r in epochs]
    assert len({tuple(v) for v in losses.values()}) == 1, losses  # one all-reduced figure in every task
    assert [r["task"] for r in records(done.run_dir, "final")] and json.loads(
        (tmp_path / "ckpt" / "model.json").read_text())["epochs"] == 2
    assert "saved the model" in done.task_output("chief-0") and "saved the model" not in done.task_output("worker-0")


def test_keras_lines_alone_are_read_as_epochs(tflaunch):
    done = tflaunch.run("--local", "2", "--", "python", LOCKSTEP, "--epochs", "2", "--steps", "3", "--report", "keras")
    assert done.returncode == 0, done.stderr[-3000:]
    epochs = records(done.run_dir, "epoch", "worker-0")
    assert [(r["epoch"], r["source"], r["steps"]) for r in epochs] == [(1, "keras", 3), (2, "keras", 3)]


@pytest.mark.parametrize("knob", ["INPUT_SLEEP", "COMPUTE"])
def test_one_slow_task_slows_every_task(tflaunch, knob):
    done = tflaunch.run("--local", "3", "--env", f"LOCKSTEP_{knob}=worker-2=0.3", "--",
                        "python", LOCKSTEP, "--epochs", "1", "--steps", "6", "--step-seconds", "0")
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("worker-0", "worker-1", "worker-2"):
        (epoch,) = records(done.run_dir, "epoch", name)
        assert epoch["epoch_seconds"] >= 1.5, epoch  # six steps paced by worker-2: at least 5 x 0.3 s


def stalled_per_look(env: dict[str, str], looks: int = 20) -> float:
    """The agent's figure for one stand-in task stepping alone (0.1 s steps): stalled threads per look."""
    proc = subprocess.Popen([sys.executable, LOCKSTEP, "--epochs", "1", "--steps", "1000", "--step-seconds", "0.1"],
                            env={**env, "PATH": "/usr/bin:/bin"}, stdout=subprocess.PIPE, text=True)
    try:
        next(line for line in proc.stdout if "Epoch 1/1" in line)  # training, the input thread started
        watch = ThreadWatch()
        for _ in range(looks):
            watch.look([proc.pid])
            time.sleep(0.03)
    finally:
        proc.kill()
        proc.communicate()
    return watch.stalled / watch.looks


def test_the_stand_in_s_step_is_no_stall_and_its_sleeping_input_is_one():
    # A TensorFlow step computes or waits for its executor or device, never sleeps: a step of the
    # stand-in that slept read as a stalled thread in every task, which hid the one whose input
    # sleeps whenever the looks fell in that half of the step.
    assert stalled_per_look({}) == 0.0
    assert stalled_per_look({"LOCKSTEP_INPUT_SLEEP": "0.2"}) > 0.5


def test_a_flood_a_task_deaf_to_sigterm_and_a_stray_grandchild_are_the_launchers_to_stop(tflaunch):
    done = tflaunch.run("--local", "2", "--grace", "1", "--env", "LOCKSTEP_STRAY=worker-0=1",
                        "--env", "LOCKSTEP_IGNORE_TERM=worker-1=1", "--env", "LOCKSTEP_FLOOD=worker-1=40",
                        "--env", "LOCKSTEP_CRASH=worker-0=3:5", "--", "python", LOCKSTEP, "--epochs", "2")
    assert done.returncode == 5, done.stderr[-3000:]
    tasks = {t["name"]: t for t in done.record["tasks"]}
    assert tasks["worker-0"]["exit_code"] == 5
    assert (tasks["worker-1"]["state"], tasks["worker-1"]["signal"]) == ("stopped", 9)  # deaf to SIGTERM: killed
    assert done.task_output("worker-1").count("filler line") >= 80  # 40 lines a step, two steps at least
    stray = int(next(line for line in done.task_output("worker-0").splitlines() if line.startswith("STRAY "))[6:])
    wait_for(lambda: not psutil.pid_exists(stray) or psutil.Process(stray).status() == psutil.STATUS_ZOMBIE,
             timeout=10, message="the stray grandchild to be stopped with its task")


def test_a_crash_restarts_the_cluster_and_it_resumes_from_the_backup(tflaunch):
    done = tflaunch.run("--local", "2", "--max-restarts", "1", "--restart-delay", "0",
                        "--env", "LOCKSTEP_CRASH=worker-1=7:3", "--",
                        "python", LOCKSTEP, "--epochs", "3", "--steps", "5")
    assert done.returncode == 0, done.stderr[-3000:]
    attempts = done.record["attempts"]
    assert [a["outcome"] for a in attempts] == ["failed", "succeeded"]
    assert attempts[0]["failed_task"] == "worker-1" and "exit code 3" in attempts[0]["reason"]
    second = [r["epoch"] for r in records(done.run_dir, "epoch", "worker-0") if r["attempt"] == 2]
    assert second == [2, 3]  # epoch 1's backup, not a fresh start
    assert "resuming from backup at epoch 2" in done.task_output("worker-0")
    assert "the collective with worker-1 failed" in (done.run_dir / "attempt-1" / "worker-0.log").read_text()


def test_a_resume_on_fewer_workers_keeps_the_global_batch(tflaunch, tmp_path):
    backup = tmp_path / "backup"
    first = tflaunch.run("--local", "3", "--env", f"TFLAUNCH_BACKUP_DIR={backup}", "--env", "LOCKSTEP_CRASH=worker-0=7:4",
                         "--",
                         "python", LOCKSTEP, "--epochs", "3", "--steps", "5")
    assert first.returncode != 0
    done = tflaunch.run("--local", "2", "--env", f"TFLAUNCH_BACKUP_DIR={backup}", "--",
                        "python", LOCKSTEP, "--epochs", "3", "--steps", "5")
    assert done.returncode == 0, done.stderr[-3000:]
    text = done.task_output("worker-0")
    assert ("the backup was written by 3 workers, this attempt has 2: resuming at the start of epoch 2 with the "
            "same global batch 96 (48 per replica)") in text
    epochs = records(done.run_dir, "epoch", "worker-0")
    assert [(r["epoch"], r["global_batch"], r["replicas"]) for r in epochs] == [(2, 96, 2), (3, 96, 2)]


def test_a_hang_in_the_exchange_is_declared_and_its_function_named(tflaunch):
    done = tflaunch.run("--local", "3", "--hang-timeout", str(HANG_TIMEOUT), "--grace", "1",
                        "--env", "LOCKSTEP_HANG=worker-1=4", "--", "python", LOCKSTEP, "--epochs", "50")
    assert done.returncode == 124, done.stderr[-3000:]
    attempt = done.record["attempts"][0]
    assert attempt["blamed_tasks"] == ["worker-1"]
    where = f"hang_in_exchange (lockstep.py:{line_of('# the task hangs here')})"
    assert f"worker-1 differs from the rest: MainThread in {where}" in attempt["reason"], attempt["reason"]
    others = done.record["root_cause"]["diagnosis"]["evidence"]["others"]
    waiting = f"read_exactly (peers.py:{line_of('# a late peer keeps the main thread here', PEERS)})"
    assert others and all(t["innermost"] == waiting for crowd in others for t in crowd["threads"]
                          if t["thread"] == "MainThread"), others


def test_stacks_of_a_live_hang_name_the_stand_ins_function(tflaunch):
    proc = tflaunch.start("--local", "3", "--grace", "1", "--env", "LOCKSTEP_HANG=worker-2=3", "--",
                          "python", LOCKSTEP, "--epochs", "50")
    try:
        wait_for(lambda: "STALLED" in tflaunch.merged_text(), timeout=60, message="worker-2 to hang")

        def named():
            shown = subprocess.run([sys.executable, "-m", "launcher", "stacks", "--log-dir", str(tflaunch.log_dir),
                                    "--json"], capture_output=True, text=True, timeout=60, cwd=tflaunch.cwd,
                                   env=tflaunch.env())
            assert shown.returncode == 0, shown.stderr
            answer = json.loads(shown.stdout)
            return answer if answer["verdict"]["verdict"] == "culprit" else None
        answer = wait_for(named, timeout=60, interval=0.5, message="the others to wait in the exchange")
        (culprit,) = answer["verdict"]["culprits"]
        assert culprit["task"] == "worker-2"
        assert (culprit["threads"][0]["function"], culprit["threads"][0]["line"]) == (
            "hang_in_exchange", line_of("# the task hangs here"))
        assert proc.poll() is None
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)


def test_parameter_servers_serve_and_the_evaluator_ends_after_the_chiefs_model(tflaunch, tmp_path):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("chief: [localhost]\nworker: [localhost, localhost]\nps: [localhost]\nevaluator: [localhost]\n")
    started = time.monotonic()
    done = tflaunch.run(str(cluster), "--", "python", LOCKSTEP, "--epochs", "2", "--steps", "3")
    assert done.returncode == 0, done.stderr[-3000:]
    assert time.monotonic() - started < 60
    assert "cluster formed with 3 servers" in done.task_output("chief-0")
    assert "ps-0: serving" in done.task_output("ps-0")
    (final,) = records(done.run_dir, "eval", "evaluator-0")  # it evaluated the chief's saved model, then ended
    assert final["final"] is True and final["epoch"] == 2
    assert [r["epoch"] for r in records(done.run_dir, "epoch", "chief-0")] == [1, 2]
