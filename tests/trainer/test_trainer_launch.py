"""The built-in trainer under tflaunch: evaluators beside every kind of cluster, and a
ParameterServer cluster resuming from its backup after a ps dies. Real TensorFlow on CPU.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from conftest import HELPERS
from launcher.records.folder import RunFolder
from polling import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.tensorflow]

CLUSTERS = {
    "multi_worker_mirrored": "worker: [localhost:auto, localhost:auto]\nevaluator: [localhost:auto]\n",
    "parameter_server": ("chief: [localhost:auto]\nworker: [localhost:auto]\nps: [localhost:auto]\n"
                         "evaluator: [localhost:auto]\n"),
}
COMMANDS = {
    "busy": ["python", "-m", "trainer"],
    "idle": ["python", str(HELPERS / "idle_evaluator.py")],
}


def metrics_of(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("evaluator", ["idle", "busy"])
@pytest.mark.parametrize("strategy", ["multi_worker_mirrored", "parameter_server"])
def test_training_finishes_beside_an_evaluator(tflaunch, tmp_path, strategy, evaluator):
    cluster_file = tmp_path / "cluster.yaml"
    cluster_file.write_text(CLUSTERS[strategy])
    # A busy evaluator gets time to finish its last evaluation; an idle one would use it all up.
    evaluator_timeout = "120" if evaluator == "busy" else "1"
    started = time.monotonic()
    done = tflaunch.run(str(cluster_file), "--evaluator-timeout", evaluator_timeout, "--",
                        *COMMANDS[evaluator], "--epochs", "3", timeout=240)
    seconds = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-3000:]
    chief = "chief-0" if strategy == "parameter_server" else "worker-0"
    records = metrics_of(done.run_dir)
    final = [r for r in records if r["kind"] == "final" and r["task"] == chief]
    assert final and final[0]["test_accuracy"] >= 0.80, final
    tasks = {t["name"]: t for t in done.record["tasks"]}
    configs = {name: json.loads(t["env"]["TF_CONFIG"]) for name, t in tasks.items()}
    assert "evaluator" in configs["evaluator-0"]["cluster"]
    assert all("evaluator" not in c["cluster"] for name, c in configs.items() if name != "evaluator-0")
    evals = [r for r in records if r["kind"] == "eval"]
    if evaluator == "busy":
        # It ended by itself after the final checkpoint, which holds the weights the chief tested.
        assert tasks["evaluator-0"]["state"] == "succeeded" and tasks["evaluator-0"]["exit_code"] == 0
        assert evals and evals[-1]["final"] and evals[-1]["epoch"] == 3, evals
        assert evals[-1]["test_accuracy"] == pytest.approx(final[0]["test_accuracy"], abs=1e-6)
        assert (done.run_dir / "checkpoints" / "training-finished.json").is_file()
    else:
        # Nothing waited for it: tflaunch stopped it once training had succeeded.
        assert tasks["evaluator-0"]["state"] == "stopped" and evals == []
        assert "idle evaluator: waiting to be stopped" in done.task_output("evaluator-0")
    print(f"{strategy} with a {evaluator} evaluator: {seconds:.1f} s, test accuracy {final[0]['test_accuracy']}")


@pytest.mark.timeout(420)
def test_parameter_server_run_resumes_from_backup_after_a_ps_dies(tflaunch):
    proc = tflaunch.start("--local", "1", "--ps", "1", "--max-restarts", "1", "--restart-delay", "0", "--quiet",
                          "--", "python", "-m", "trainer", "--epochs", "6", "--width", "1")
    try:
        run_dir = wait_for(lambda: tflaunch.latest_run(), timeout=60, message="the run folder")

        def chief_epochs() -> list[int]:
            path = RunFolder(run_dir).task_log("chief-0", 1)  # at the top until attempt 2 starts
            text = path.read_text(errors="replace") if path.exists() else ""
            return [json.loads(line[16:])["epoch"] for line in text.splitlines()
                    if line.startswith("TFLAUNCH_METRIC ") and '"kind":"epoch"' in line]

        def ready():
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            return 2 in chief_epochs()

        wait_for(ready, timeout=200, message="the chief's epoch 2")
        manifest = json.loads((run_dir / "run.json").read_text())
        ps_pid = next(t["pid"] for t in manifest["tasks"] if t["name"] == "ps-0")
        os.kill(ps_pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    manifest = json.loads((run_dir / "run.json").read_text())
    assert len(manifest["attempts"]) == 2, manifest["attempts"]
    first_epochs = chief_epochs()
    assert first_epochs[:2] == [1, 2] and 6 not in first_epochs, first_epochs
    second = (run_dir / "chief-0.log").read_text(errors="replace")
    resumed_at = max(first_epochs) + 1
    assert f"trainer: resuming from backup at epoch {resumed_at}" in second, second[-3000:]
    records = [r for r in metrics_of(run_dir) if r["task"] == "chief-0"]
    assert [r["epoch"] for r in records if r["kind"] == "epoch" and r["attempt"] == 2] == list(range(resumed_at, 7))
    final = [r for r in records if r["kind"] == "final"]
    assert len(final) == 1 and final[0]["attempt"] == 2 and final[0]["test_accuracy"] >= 0.90, final
    print(f"ps killed after epoch {resumed_at - 1}; attempt 2 resumed at epoch {resumed_at}, "
          f"test accuracy {final[0]['test_accuracy']}")
