"""CentralStorageStrategy and the Keras choice in the built-in trainer, with real TensorFlow on CPU.

Single processes and hand-launched clusters, as in test_trainer_tf; tflaunch is not involved.
"""

from __future__ import annotations

import pytest

from test_trainer_tf import (IN_PROCESS, Cluster, assert_user_error, killed_after_epoch, run_single,  # noqa: F401
                             tensorflow_here, trainer_here)

pytestmark = [pytest.mark.slow, pytest.mark.tensorflow]

KERAS3 = {"TF_USE_LEGACY_KERAS": "0"}


# ---------------------------------------------------------------- CentralStorageStrategy

@pytest.mark.timeout(180)
@pytest.mark.xdist_group(IN_PROCESS)
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_central_storage_learns_digits(trainer_here, loop):
    task = trainer_here(["--strategy", "central_storage", "--loop", loop, "--epochs", "4"])
    assert task.returncode == 0, task.output()
    assert "CentralStorageStrategy replicas=1" in task.output()
    # With TF_USE_LEGACY_KERAS unset or 1 the trainer builds with tf_keras.
    assert "keras=tf_keras-" in task.output()
    assert task.epochs() == [1, 2, 3, 4]
    assert task.final()["test_accuracy"] >= 0.90, task.final()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_central_storage_resumes_mid_epoch(tmp_path, loop):
    # As test_trainer_tf's step-backup test: 20 steps per epoch, a backup every 50 steps (step 10
    # of epoch 3); killed after epoch 3, the run resumes at epoch 3, step 11.
    argv = ["--strategy", "central_storage", "--loop", loop, "--batch-per-worker", "64",
            "--steps-per-epoch", "20", "--epochs", "5", "--backup-dir", str(tmp_path / "backup"),
            "--backup-every", "50"]
    first = killed_after_epoch(tmp_path, argv, 3, timeout=150)
    assert 5 not in first.epochs(), first.output()
    second = run_single(tmp_path, argv, timeout=150)
    assert second.proc.returncode == 0, second.output()
    assert "trainer: resuming from backup at epoch 3 step 11" in second.output()
    assert second.epochs() == [3, 4, 5]


# ---------------------------------------------------------------- Keras 3 when the user asks for it

@pytest.mark.timeout(180)
def test_keras3_fit_in_one_process(tmp_path):
    model_dir = tmp_path / "model"
    task = run_single(tmp_path, ["--epochs", "4", "--model-dir", str(model_dir)], env=KERAS3)
    assert task.proc.returncode == 0, task.output()
    assert "keras=keras-3." in task.output()
    assert task.final()["test_accuracy"] >= 0.90, task.final()
    # Keras 3 exports the SavedModel.
    assert (model_dir / "saved_model.pb").is_file()


@pytest.mark.timeout(240)
def test_keras3_custom_loop_under_multi_worker_mirrored(tmp_path):
    argv = ["--loop", "custom", "--epochs", "3", "--collective", "ring"]
    with Cluster(tmp_path, {"worker": 2}, argv, env=KERAS3) as cluster:
        codes = cluster.wait(timeout=200)
    assert codes == {"worker-0": 0, "worker-1": 0}, cluster["worker-0"].output()[-3000:]
    w0, w1 = cluster["worker-0"], cluster["worker-1"]
    assert "replicas=2" in w0.output()
    assert "keras=keras-3." in w0.output() and "keras=keras-3." in w1.output()
    assert [e["loss"] for e in w0.metrics("epoch")] == [e["loss"] for e in w1.metrics("epoch")]
    assert w0.final()["test_accuracy"] >= 0.85, w0.final()


@pytest.mark.timeout(120)
def test_keras3_where_it_cannot_run_is_a_one_line_error(tmp_path):
    # Model.fit under MultiWorkerMirroredStrategy: every worker refuses before TensorFlow starts.
    with Cluster(tmp_path, {"worker": 2}, ["--epochs", "1"], env=KERAS3) as cluster:
        codes = cluster.wait(timeout=60)
    assert codes == {"worker-0": 2, "worker-1": 2}
    for task in cluster.tasks.values():
        assert_user_error(task, "TF_USE_LEGACY_KERAS=0 (Keras 3): Model.fit cannot run under "
                                "multi_worker_mirrored; use --loop custom")
    with Cluster(tmp_path, {"chief": 1, "worker": 1, "ps": 1}, ["--epochs", "1"], env=KERAS3,
                 label="ps") as cluster:
        codes = cluster.wait(timeout=60)
    assert codes == {"chief-0": 2, "worker-0": 2, "ps-0": 2}
    for task in cluster.tasks.values():
        assert_user_error(task, "Keras 3 has no ParameterServerStrategy support")
