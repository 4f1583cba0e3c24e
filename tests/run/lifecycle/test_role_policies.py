"""Per-role policies on the stand-in worker (tests/workers/lockstep.py): a ParameterServer worker restarted
in place, and an evaluator given the time to finish its last evaluation after training ends. (Real
TensorFlow's side of both, a PS worker that rejoins and the model's accuracy after it, is held by
tests/trainer/test_trainer_evaluator.py.)
"""

from __future__ import annotations

import json
import signal
import textwrap

import psutil
import pytest
from conftest import LOCKSTEP
from polling import wait_for

pytestmark = [pytest.mark.slow]

EPOCHS = 20
# Twenty epochs of about half a second: room to kill a worker after the chief's first.
TRAINER = ["--", "python", LOCKSTEP, "--epochs", str(EPOCHS), "--steps", "10", "--step-seconds", "0.05"]


def chief_records(run_dir, kind: str) -> list[dict]:
    text = (run_dir / "metrics.jsonl").read_text()
    records = [json.loads(line) for line in text[:text.rfind("\n") + 1].splitlines()]  # whole lines: still written
    return [r for r in records if r["kind"] == kind and r["task"] == "chief-0"]


def chief_trained_an_epoch(run_dir) -> bool:
    metrics = run_dir / "metrics.jsonl"
    return bool(metrics and metrics.exists() and '"task":"chief-0"' in metrics.read_text()
                and '"kind":"epoch"' in metrics.read_text())


def worker_trainer_process(run_dir, name: str) -> psutil.Process:
    """The stand-in's process of task ``name`` (under its agent, when the task runs under one)."""
    task = next(t for t in json.loads((run_dir / "run.json").read_text())["tasks"] if t["name"] == name)
    root = psutil.Process(task["pid"])
    return next(p for p in [root, *root.children(recursive=True)] if "lockstep" in " ".join(p.cmdline()))


def test_a_killed_parameter_server_worker_restarts_alone_and_the_run_succeeds_in_one_attempt(tflaunch):
    proc = tflaunch.start("--local", "2", "--ps", "1", *TRAINER)
    run_dir = wait_for(lambda: tflaunch.latest_run(), timeout=60, message="the run's folder")
    wait_for(lambda: chief_trained_an_epoch(run_dir) or proc.poll() is not None, timeout=180,
             message="the chief's first epoch")
    assert proc.poll() is None, "the run ended before a worker could be killed mid-training"
    worker_trainer_process(run_dir, "worker-1").send_signal(signal.SIGKILL)
    killed_after = max(r["epoch"] for r in chief_records(run_dir, "epoch"))
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-3000:]
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "succeeded" and len(record["attempts"]) == 1
    assert {t["name"]: t["restarts"] for t in record["tasks"]} == {"chief-0": 0, "worker-0": 0, "worker-1": 1,
                                                                   "ps-0": 0}
    assert "worker-1 on localhost failed (killed by SIGKILL): restarting it alone, in place" in err
    # The chief reached the restarted worker again and trained every epoch after it.
    assert "worker-1 went away; reaching it again" in (run_dir / "chief-0.log").read_text()
    assert [r["epoch"] for r in chief_records(run_dir, "epoch")] == list(range(1, EPOCHS + 1))
    assert killed_after < EPOCHS


def test_a_sidecar_evaluator_finishes_its_last_evaluation_after_training(tflaunch, tmp_path):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(textwrap.dedent("""\
        worker: [localhost:auto, localhost:auto]
        evaluator: [localhost:auto]
    """))
    done = tflaunch.run(str(cluster), "--", "python", LOCKSTEP, "--epochs", "3", "--eval-seconds", "3", timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    evaluator = next(t for t in done.record["tasks"] if t["name"] == "evaluator-0")
    assert evaluator["state"] == "succeeded" and evaluator["exit_code"] == 0
    assert "evaluator-0: done after model.json" in done.task_output("evaluator-0")
    assert "training finished; waiting up to" in done.stderr  # it was still evaluating when training ended
    assert "evaluator-0 finished on its own (exit code 0)" in done.stderr
    evals = [json.loads(line) for line in (done.run_dir / "metrics.jsonl").read_text().splitlines()
             if '"kind":"eval"' in line]
    assert evals and evals[-1]["task"] == "evaluator-0"
