"""The built-in trainer under tflaunch: an evaluator beside each kind of cluster, and a
ParameterServer cluster resuming from its backup after a ps dies. Real TensorFlow on CPU.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from test_trainer_evaluator import check_evaluations
from launcher.records.folder import RunFolder
from polling import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.tensorflow]

CLUSTERS = {
    "multi_worker_mirrored": "worker: [localhost:auto, localhost:auto]\nevaluator: [localhost:auto]\n",
    "parameter_server": ("chief: [localhost:auto]\nworker: [localhost:auto, localhost:auto]\nps: [localhost:auto]\n"
                         "evaluator: [localhost:auto]\n"),
}
EPOCHS = 3


def metrics_of(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", ["multi_worker_mirrored", "parameter_server"])
def test_training_finishes_beside_an_evaluator(tflaunch, tmp_path, strategy):
    # The evaluator runs no TensorFlow server, and tflaunch keeps it out of the training tasks'
    # TF_CONFIG: a ParameterServerStrategy chief would otherwise wait for it forever.
    cluster_file = tmp_path / "cluster.yaml"
    cluster_file.write_text(CLUSTERS[strategy])
    started = time.monotonic()
    done = tflaunch.run(str(cluster_file), "--evaluator-timeout", "120", "--",
                        "python", "-m", "trainer", "--epochs", str(EPOCHS), timeout=240)
    seconds = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-3000:]
    chief = "chief-0" if strategy == "parameter_server" else "worker-0"
    records = metrics_of(done.run_dir)
    final = [r for r in records if r["kind"] == "final" and r["task"] == chief]
    assert final and final[0]["test_accuracy"] >= 0.80, final
    tasks = {t["name"]: t for t in done.record["tasks"]}
    assert all(t["pid"] for t in tasks.values())
    configs = {name: json.loads(t["env"]["TF_CONFIG"]) for name, t in tasks.items()}
    assert "evaluator" in configs["evaluator-0"]["cluster"]
    assert all("evaluator" not in c["cluster"] for name, c in configs.items() if name != "evaluator-0")
    # It ended by itself after the final checkpoint; the evaluations are those of the chief's epochs.
    assert tasks["evaluator-0"]["state"] == "succeeded" and tasks["evaluator-0"]["exit_code"] == 0
    check_evaluations(records, chief, EPOCHS, done.run_dir / "checkpoints", done.task_output("evaluator-0"),
                      run_id=done.record["run_id"])
    if strategy == "parameter_server":
        # The chief trains; the servers serve until tflaunch stops them once the chief succeeded.
        states = {name: t["state"] for name, t in tasks.items()}
        assert states == {"chief-0": "succeeded", "worker-0": "stopped", "worker-1": "stopped", "ps-0": "stopped",
                          "evaluator-0": "succeeded"}
        epochs = [r for r in records if r["kind"] == "epoch"]
        assert [r["epoch"] for r in epochs] == list(range(1, EPOCHS + 1))
        assert all(r["task"] == "chief-0" and r["val_accuracy"] is not None for r in epochs)
        assert "ParameterServerStrategy" in done.task_output("chief-0")
    else:
        assert "replicas=2" in done.task_output("worker-0")
    # The evaluator trains nothing and reports no epochs of its own.
    assert not [r for r in records if r["task"] == "evaluator-0" and r["kind"] in ("epoch", "final")]
    print(f"{strategy} with an evaluator: {seconds:.1f} s, test accuracy {final[0]['test_accuracy']}")


PS_EPOCHS = 4


@pytest.mark.timeout(420)
def test_parameter_server_run_resumes_from_backup_after_a_ps_dies(tflaunch):
    proc = tflaunch.start("--local", "1", "--ps", "1", "--max-restarts", "1", "--restart-delay", "0", "--quiet",
                          "--", "python", "-m", "trainer", "--epochs", str(PS_EPOCHS), "--width", "1")
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
    assert first_epochs[:2] == [1, 2] and PS_EPOCHS not in first_epochs, first_epochs
    second = (run_dir / "chief-0.log").read_text(errors="replace")
    resumed_at = max(first_epochs) + 1
    assert f"trainer: resuming from backup at epoch {resumed_at}" in second, second[-3000:]
    records = [r for r in metrics_of(run_dir) if r["task"] == "chief-0"]
    resumed = [r["epoch"] for r in records if r["kind"] == "epoch" and r["attempt"] == 2]
    assert resumed == list(range(resumed_at, PS_EPOCHS + 1)), resumed
    final = [r for r in records if r["kind"] == "final"]
    assert len(final) == 1 and final[0]["attempt"] == 2 and final[0]["test_accuracy"] >= 0.90, final
    print(f"ps killed after epoch {resumed_at - 1}; attempt 2 resumed at epoch {resumed_at}, "
          f"test accuracy {final[0]['test_accuracy']}")
