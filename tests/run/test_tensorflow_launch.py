"""Real TensorFlow clusters started by tflaunch on this machine (CPU)."""

from __future__ import annotations

import json

import pytest

from conftest import DEFAULT_LOCAL_TWO, HELPERS
from launcher.run.faults.diagnose import diagnose

pytestmark = [pytest.mark.slow, pytest.mark.tensorflow, pytest.mark.timeout(300)]


def metrics_of(done) -> list[dict]:
    return [json.loads(line) for line in (done.run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.xdist_group(DEFAULT_LOCAL_TWO)
def test_local_two_workers_train_in_lock_step(default_local_two):
    done = default_local_two.done
    assert done.returncode == 0, done.stderr[-3000:]
    records = metrics_of(done)
    epochs = [r for r in records if r["kind"] == "epoch"]
    by_task = {t: [r for r in epochs if r["task"] == t] for t in ("worker-0", "worker-1")}
    trained = [r["epoch"] for r in by_task["worker-0"]]
    assert trained == list(range(1, len(trained) + 1)) and len(trained) >= 2
    assert [r["epoch"] for r in by_task["worker-1"]] == trained
    assert [r["loss"] for r in by_task["worker-0"]] == [r["loss"] for r in by_task["worker-1"]]
    assert all(r["global_batch"] == 64 and r["replicas"] == 2 for r in epochs)  # 2 workers x 32, the default
    assert all(r["attempt"] == 1 for r in records)
    assert done.record["status"] == "succeeded"


def test_a_live_strategy_after_op_failure_is_diagnosed(tflaunch):
    """The tail of a real failing task's log, as tflaunch kept it, is diagnosed as in faults/test_diagnose.py."""
    run = tflaunch.run("--local", "2", "--", "python", str(HELPERS / "errors" / "op_before_strategy.py"))
    assert run.returncode == 1
    root = run.record["root_cause"]["task"]
    tail = run.task_output(root).splitlines()[-200:]
    found = diagnose(tail, signal=None, exit_code=1, task_names=("worker-0", "worker-1"))
    assert found is not None and found.rule == "strategy-after-op", tail[-5:]
