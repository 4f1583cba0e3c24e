"""Fast tests of the trainer's pure pieces: options, TF_CONFIG, data checks, metric lines.

None of these import TensorFlow.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from trainer import cli, cluster, data, handoff, metrics, termination
from trainer.cli import DatasetSpec
from trainer.cluster import ClusterError, TaskInfo

pytestmark = pytest.mark.unit


# ---------------------------------------------------------------- options

def test_defaults():
    args = cli.parse_args([], environ={})
    assert args.strategy == "auto"
    assert args.collective == "auto"
    assert args.loop == "fit"
    assert args.dataset == DatasetSpec("digits")
    assert args.epochs == cli.DEFAULT_EPOCHS
    assert args.batch_per_worker == cli.DEFAULT_BATCH_PER_WORKER
    assert args.optimizer == "adam"
    assert args.steps_per_epoch is None
    assert args.model_dir is None and args.tensorboard_dir is None and args.backup_dir is None
    assert args.checkpoint_dir is None
    assert args.backup_every is None


def test_backup_dir_defaults_to_environment():
    args = cli.parse_args([], environ={"TFLAUNCH_BACKUP_DIR": "/tmp/bk"})
    assert args.backup_dir == "/tmp/bk"
    args = cli.parse_args(["--backup-dir", "/x"], environ={"TFLAUNCH_BACKUP_DIR": "/tmp/bk"})
    assert args.backup_dir == "/x"


def test_checkpoint_dir_defaults_to_environment():
    args = cli.parse_args([], environ={"TFLAUNCH_CHECKPOINT_DIR": "/run/checkpoints"})
    assert args.checkpoint_dir == "/run/checkpoints"
    args = cli.parse_args(["--checkpoint-dir", "c"], environ={"TFLAUNCH_CHECKPOINT_DIR": "/run/checkpoints"})
    assert args.checkpoint_dir == "c"
    assert cli.parse_args([], environ={"TFLAUNCH_CHECKPOINT_DIR": ""}).checkpoint_dir is None


@pytest.mark.parametrize("name", cli.STRATEGIES)
def test_every_strategy_is_an_option(name):
    assert cli.parse_args(["--strategy", name], environ={}).strategy == name
    assert "central_storage" in cli.STRATEGIES


def test_all_options():
    args = cli.parse_args([
        "--strategy", "multi_worker_mirrored", "--collective", "ring", "--loop", "custom",
        "--dataset", "npz:/data/x.npz", "--width", "0.5", "--epochs", "3", "--steps-per-epoch", "7",
        "--batch-per-worker", "16", "--lr", "0.01", "--optimizer", "sgd", "--seed", "3",
        "--model-dir", "m", "--tensorboard-dir", "t", "--backup-dir", "b", "--backup-every", "5",
        "--checkpoint-dir", "c",
    ], environ={})
    assert (args.strategy, args.collective, args.loop) == ("multi_worker_mirrored", "ring", "custom")
    assert args.dataset == DatasetSpec("npz", path="/data/x.npz")
    assert (args.width, args.epochs, args.steps_per_epoch, args.batch_per_worker) == (0.5, 3, 7, 16)
    assert (args.lr, args.optimizer, args.seed) == (0.01, "sgd", 3)
    assert (args.model_dir, args.tensorboard_dir, args.backup_dir, args.backup_every) == ("m", "t", "b", 5)
    assert args.checkpoint_dir == "c"


@pytest.mark.parametrize("text, expected", [
    ("digits", DatasetSpec("digits")),
    ("mnist", DatasetSpec("mnist")),
    ("fashion_mnist", DatasetSpec("fashion_mnist")),
    ("npz:a/b.npz", DatasetSpec("npz", path="a/b.npz")),
    ("npz:c:d.npz", DatasetSpec("npz", path="c:d.npz")),
    ("synthetic:512", DatasetSpec("synthetic", size=512)),
])
def test_dataset_spec(text, expected):
    assert cli.dataset_spec(text) == expected
    assert str(expected) == text


@pytest.mark.parametrize("argv, fragment", [
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--epochs", "0"], "--epochs: expected a positive integer, got 0"),
    (["--epochs", "two"], "--epochs: expected a positive integer, got 'two'"),
    (["--lr", "-1"], "--lr: expected a positive number"),
    (["--lr", "nan"], "--lr: expected a positive number"),
    (["--strategy", "tpu"], "--strategy: invalid choice: 'tpu'"),
    (["--dataset", "cifar"], "--dataset: expected digits, mnist, fashion_mnist, npz:PATH or synthetic:N"),
    (["--dataset", "npz:"], "npz:PATH needs a path"),
    (["--dataset", "synthetic:x"], "synthetic:N needs an integer N"),
    (["--backup-every", "sometimes"], "--backup-every: expected 'epoch' or a positive integer"),
])
def test_bad_options_give_one_line_and_exit_2(argv, fragment, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.parse_args(argv, environ={})
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("trainer: error: ")
    assert fragment in err


def test_backup_every_epoch_keyword():
    assert cli.parse_args(["--backup-every", "epoch"], environ={}).backup_every is None


# ---------------------------------------------------------------- TF_CONFIG

def tf_config(cluster_spec, task_type, index):
    return {"TF_CONFIG": json.dumps({"cluster": cluster_spec, "task": {"type": task_type, "index": index}})}


TWO_WORKERS = {"worker": ["h:1", "h:2"]}
WITH_CHIEF = {"chief": ["h:0"], "worker": ["h:1", "h:2"]}
WITH_PS = {"chief": ["h:0"], "ps": ["h:9"], "worker": ["h:1", "h:2"]}


def test_no_tf_config_is_a_lone_chief():
    for environ in ({}, {"TF_CONFIG": ""}, {"TF_CONFIG": "{}"}):
        task = cluster.read_tf_config(environ)
        assert task.task_type is None and task.is_chief and task.name == "local"
        assert task.num_training_tasks == 0


@pytest.mark.parametrize("spec, task_type, index, chief", [
    (TWO_WORKERS, "worker", 0, True),
    (TWO_WORKERS, "worker", 1, False),
    (WITH_CHIEF, "chief", 0, True),
    (WITH_CHIEF, "worker", 0, False),
    (WITH_PS, "chief", 0, True),
    (WITH_PS, "ps", 0, False),
    (WITH_PS, "worker", 0, False),
])
def test_chief_rule(spec, task_type, index, chief):
    task = cluster.read_tf_config(tf_config(spec, task_type, index))
    assert task.is_chief is chief
    assert task.name == f"{task_type}-{index}"


@pytest.mark.parametrize("raw, fragment", [
    ("{not json", "not valid JSON"),
    ("[1]", "expected a JSON object"),
    (json.dumps({"cluster": {"worker": "h:1"}, "task": {"type": "worker", "index": 0}}), "cluster.worker"),
    (json.dumps({"cluster": TWO_WORKERS, "task": {"type": "boss", "index": 0}}), "task.type"),
    (json.dumps({"cluster": TWO_WORKERS, "task": {"type": "worker", "index": 2}}), "worker-2 is not in"),
    (json.dumps({"cluster": TWO_WORKERS, "task": {"type": "worker", "index": "0"}}), "task.index"),
    (json.dumps({"cluster": {**TWO_WORKERS, "master": ["h:5"]}, "task": {"type": "worker", "index": 0}}),
     "cluster.master"),
    (json.dumps({"cluster": TWO_WORKERS, "task": {"type": "evaluator", "index": 0}}), "evaluator-0 is not in"),
])
def test_bad_tf_config(raw, fragment):
    with pytest.raises(ClusterError, match=fragment):
        cluster.read_tf_config({"TF_CONFIG": raw})


def test_evaluator_task():
    # As tflaunch writes it: the evaluator sees the whole cluster, itself included.
    task = cluster.read_tf_config(tf_config({**WITH_PS, "evaluator": ["h:5"]}, "evaluator", 0))
    assert task.is_evaluator and not task.is_chief
    assert task.name == "evaluator-0"
    assert task.num_training_tasks == 3
    assert task.training_cluster == {"chief": ("h:0",), "ps": ("h:9",), "worker": ("h:1", "h:2")}


def test_training_tasks_leave_out_an_evaluator_in_their_cluster():
    # Launchers that put the evaluator into every task's cluster: the chief still trains.
    task = cluster.read_tf_config(tf_config({**WITH_PS, "evaluator": ["h:5"]}, "chief", 0))
    assert not task.is_evaluator and task.is_chief
    assert "evaluator" not in task.training_cluster and "evaluator" in task.cluster
    assert cluster.choose_strategy("auto", task, 0) == "parameter_server"
    task = cluster.read_tf_config(tf_config({**TWO_WORKERS, "evaluator": ["h:5"]}, "worker", 1))
    assert task.training_cluster == {"worker": ("h:1", "h:2")}
    assert cluster.choose_strategy("auto", task, 0) == "multi_worker_mirrored"


def test_task_label():
    task = cluster.read_tf_config(tf_config(TWO_WORKERS, "worker", 1))
    assert cluster.task_label({}, task) == "worker-1"
    assert cluster.task_label({"TFLAUNCH_TASK": "w1"}, task) == "w1"
    assert cluster.task_label({}, TaskInfo()) == "local"


@pytest.mark.parametrize("spec, task_type, gpus, expected", [
    (None, None, 0, "default"),
    (None, None, 1, "default"),
    (None, None, 2, "mirrored"),
    ({"worker": ["h:1"]}, "worker", 0, "default"),
    ({"worker": ["h:1"]}, "worker", 4, "mirrored"),
    (TWO_WORKERS, "worker", 0, "multi_worker_mirrored"),
    (TWO_WORKERS, "worker", 2, "multi_worker_mirrored"),
    ({"chief": ["h:0"], "worker": ["h:1"]}, "chief", 0, "multi_worker_mirrored"),
    (WITH_PS, "chief", 0, "parameter_server"),
    (WITH_PS, "worker", 0, "parameter_server"),
])
def test_auto_strategy(spec, task_type, gpus, expected):
    task = cluster.read_tf_config(tf_config(spec, task_type, 0)) if spec else TaskInfo()
    assert cluster.choose_strategy("auto", task, gpus) == expected


def test_explicit_strategies():
    lone = TaskInfo()
    assert cluster.choose_strategy("multi_worker_mirrored", lone, 0) == "multi_worker_mirrored"
    assert cluster.choose_strategy("mirrored", lone, 0) == "mirrored"
    assert cluster.choose_strategy("default", lone, 8) == "default"
    assert cluster.choose_strategy("central_storage", lone, 0) == "central_storage"
    alone = cluster.read_tf_config(tf_config({"worker": ["h:1"]}, "worker", 0))
    assert cluster.choose_strategy("central_storage", alone, 2) == "central_storage"


@pytest.mark.parametrize("requested, spec, fragment", [
    ("parameter_server", None, "needs ps tasks"),
    ("parameter_server", {"ps": ["h:9"], "worker": ["h:1"]}, "needs a chief"),
    ("multi_worker_mirrored", WITH_PS, "only --strategy parameter_server"),
    ("mirrored", TWO_WORKERS, "runs in one process"),
    ("default", TWO_WORKERS, "runs in one process"),
    ("central_storage", TWO_WORKERS, "runs in one process"),
    ("central_storage", WITH_PS, "only --strategy parameter_server"),
])
def test_impossible_strategies(requested, spec, fragment):
    task = cluster.read_tf_config(tf_config(spec, "worker", 0)) if spec else TaskInfo()
    with pytest.raises(ClusterError, match=fragment):
        cluster.choose_strategy(requested, task, 0)


# ---------------------------------------------------------------- Keras 3 or tf_keras

@pytest.mark.parametrize("environ, legacy", [
    ({}, True),
    ({"TF_USE_LEGACY_KERAS": "1"}, True),
    ({"TF_USE_LEGACY_KERAS": "true"}, True),
    ({"TF_USE_LEGACY_KERAS": "True"}, True),
    ({"TF_USE_LEGACY_KERAS": "0"}, False),
    ({"TF_USE_LEGACY_KERAS": "false"}, False),
    ({"TF_USE_LEGACY_KERAS": ""}, False),
])
def test_keras_choice_reads_the_variable_as_tensorflow_does(environ, legacy):
    assert cluster.uses_legacy_keras(environ) is legacy


@pytest.mark.parametrize("strategy", ["default", "mirrored", "central_storage", "multi_worker_mirrored"])
def test_keras3_custom_loop_runs_everywhere_but_parameter_servers(strategy):
    cluster.check_keras(False, strategy, "custom")
    cluster.check_keras(True, strategy, "custom")
    cluster.check_keras(True, strategy, "fit")


@pytest.mark.parametrize("strategy", ["default", "mirrored", "central_storage"])
def test_keras3_fit_runs_in_one_process(strategy):
    cluster.check_keras(False, strategy, "fit")


@pytest.mark.parametrize("strategy, loop, fragment", [
    ("multi_worker_mirrored", "fit", "Model.fit cannot run under multi_worker_mirrored; use --loop custom"),
    ("parameter_server", "fit", "Keras 3 has no ParameterServerStrategy support"),
    ("parameter_server", "custom", "Keras 3 has no ParameterServerStrategy support"),
])
def test_keras3_refusals_name_the_way_out(strategy, loop, fragment):
    with pytest.raises(ClusterError, match=fragment) as caught:
        cluster.check_keras(False, strategy, loop)
    assert str(caught.value).startswith("TF_USE_LEGACY_KERAS=0 (Keras 3): ")
    assert "TF_USE_LEGACY_KERAS=1" in str(caught.value) and "\n" not in str(caught.value)
    cluster.check_keras(True, strategy, loop)


# ---------------------------------------------------------------- the evaluator's marker

def test_marker_round_trip_and_run_ownership(tmp_path):
    directory = str(tmp_path)
    assert handoff.read_marker(directory, "run-a") is None
    handoff.write_marker(directory, epochs=4, checkpoint=str(tmp_path / "ckpt-4"), run_id="run-a")
    assert handoff.read_marker(directory, "run-a") == {"epochs": 4, "checkpoint": "ckpt-4", "run_id": "run-a"}
    # A marker left by another run, or by a run outside tflaunch, does not end this run's evaluator.
    assert handoff.read_marker(directory, "run-b") is None
    assert handoff.read_marker(directory, None) is None
    assert [p.name for p in tmp_path.iterdir()] == [handoff.MARKER]
    handoff.remove_marker(directory)
    handoff.remove_marker(directory)
    assert handoff.read_marker(directory, "run-a") is None
    handoff.write_marker(directory, epochs=1, checkpoint="ckpt-1", run_id=None)
    assert handoff.read_marker(directory, None)["checkpoint"] == "ckpt-1"


@pytest.mark.parametrize("content", ["", "{half", "[1]", '{"epochs": 3}', '{"checkpoint": 3, "run_id": null}'])
def test_unreadable_markers_are_ignored(tmp_path, content):
    (tmp_path / handoff.MARKER).write_text(content)
    assert handoff.read_marker(str(tmp_path), None) is None


def test_run_id_and_checkpoint_epoch():
    assert handoff.run_id_of({"TFLAUNCH_RUN_ID": "r1"}) == "r1"
    assert handoff.run_id_of({"TFLAUNCH_RUN_ID": ""}) is None and handoff.run_id_of({}) is None
    assert handoff.checkpoint_epoch("/x/ckpt-12") == 12
    assert handoff.checkpoint_epoch("ckpt-3") == 3
    assert handoff.checkpoint_epoch("/x/model") is None


# ---------------------------------------------------------------- data

def good_arrays(n=40, with_test=False):
    rng = np.random.default_rng(0)
    arrays = {"x_train": rng.random((n, 6, 6)), "y_train": rng.integers(0, 10, n)}
    if with_test:
        arrays.update(x_test=rng.random((12, 6, 6)), y_test=rng.integers(0, 10, 12))
    return arrays


@pytest.mark.parametrize("change, fragment", [
    (lambda a: a.pop("x_train"), "missing key 'x_train'"),
    (lambda a: a.pop("y_train"), "missing key 'y_train'"),
    (lambda a: a.update(x_test=np.zeros((3, 6, 6))), "missing key 'y_test'"),
    (lambda a: a.update(x_train=np.zeros((40, 36))), "x_train: expected shape (N, H, W) or (N, H, W, C), got (40, 36)"),
    (lambda a: a.update(x_train=np.zeros((40, 1, 6))), "x_train: images must be at least 2x2"),
    (lambda a: a.update(y_train=np.zeros((40, 3))), "y_train: expected shape (N,)"),
    (lambda a: a.update(y_train=np.zeros(39, int)), "y_train: 39 labels but x_train has 40 images"),
    (lambda a: a.update(y_train=np.full(40, 10)), "y_train: class ids must be in 0..9"),
    (lambda a: a.update(y_train=np.full(40, 0.5)), "y_train: expected integer class ids"),
    (lambda a: a.update(x_train=np.full((40, 6, 6), np.nan)), "x_train: contains NaN"),
    (lambda a: a.update(x_train=np.array([["a"] * 4] * 40).reshape(40, 2, 2)), "x_train: expected numbers"),
    (lambda a: a.update(x_test=np.zeros((5, 7, 7)), y_test=np.zeros(5, int)), "x_test: image shape"),
    (lambda a: a.update(x_test=np.zeros((5, 6, 6)), y_test=np.zeros(4, int)), "y_test: 4 labels but x_test has 5"),
])
def test_npz_checks_name_the_key(change, fragment):
    arrays = good_arrays()
    change(arrays)
    with pytest.raises(data.DataError) as exc:
        data.check_arrays(arrays, "npz:f.npz")
    assert str(exc.value).startswith("npz:f.npz: ")
    assert fragment in str(exc.value)


def test_npz_files(tmp_path):
    good = tmp_path / "good.npz"
    np.savez(good, **good_arrays(with_test=True))
    raw = data.load_npz(str(good))
    assert raw.x_train.shape == (40, 6, 6, 1) and raw.x_test.shape == (12, 6, 6, 1)
    assert raw.y_train.dtype == np.int32

    with pytest.raises(data.DataError, match="not a file"):
        data.load_npz(str(tmp_path / "missing.npz"))
    with pytest.raises(data.DataError, match="not a file"):
        data.load_npz(str(tmp_path))
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"this is not a zip archive")
    with pytest.raises(data.DataError, match=r"junk.npz: cannot read it as an .npz file"):
        data.load_npz(str(junk))
    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, x_train=np.array([{"a": 1}] * 20, dtype=object), y_train=np.zeros(20, int))
    with pytest.raises(data.DataError, match="pickled.npz"):
        data.load_npz(str(pickled))


def test_split_without_test_arrays_and_scaler_fitted_on_train_only():
    rng = np.random.default_rng(1)
    raw = data.RawData(rng.random((200, 5, 5)).astype(np.float32) * 7 + 3, rng.integers(0, 10, 200))
    splits = data.split_and_scale(raw, "npz:x")
    assert (len(splits.x_train), len(splits.x_val), len(splits.x_test)) == (140, 30, 30)
    assert splits.input_shape == (5, 5, 1)
    for x in (splits.x_train, splits.x_val, splits.x_test):
        assert x.dtype == np.float32 and x.shape[1:] == (5, 5, 1)
    # Standardised with the training split's statistics: exactly zero-mean, unit-variance
    # per pixel on train, only approximately on the other splits.
    flat = splits.x_train.reshape(140, -1)
    np.testing.assert_allclose(flat.mean(axis=0), 0, atol=1e-5)
    np.testing.assert_allclose(flat.std(axis=0), 1, atol=1e-4)
    assert np.abs(splits.x_test.reshape(30, -1).mean(axis=0)).max() > 1e-3
    # No sample lands in two splits.
    rows = {tuple(r) for r in splits.x_train.reshape(140, -1).round(5)}
    assert not rows & {tuple(r) for r in splits.x_test.reshape(30, -1).round(5)}


def test_split_keeps_given_test_arrays():
    raw = data.check_arrays(good_arrays(n=100, with_test=True), "npz:x")
    splits = data.split_and_scale(raw, "npz:x")
    assert (len(splits.x_train), len(splits.x_val), len(splits.x_test)) == (85, 15, 12)


def test_digits_split_is_fixed():
    first = data.load(DatasetSpec("digits"))
    second = data.load(DatasetSpec("digits"))
    assert first.input_shape == (8, 8, 1)
    assert (len(first.x_train), len(first.x_val), len(first.x_test)) == (1257, 270, 270)
    np.testing.assert_array_equal(first.y_test, second.y_test)
    np.testing.assert_array_equal(first.x_train, second.x_train)
    assert set(np.unique(first.y_train)) == set(range(10))


def test_the_digits_and_their_scaling_are_scikit_learns_without_its_import(monkeypatch):
    from sklearn.datasets import load_digits
    from sklearn.preprocessing import StandardScaler

    theirs = load_digits()
    ours = data.load_digits()
    np.testing.assert_array_equal(ours.x_train, theirs.images.astype(np.float32))
    np.testing.assert_array_equal(ours.y_train, theirs.target.astype(np.int32))
    assert ours.x_train.dtype == np.float32 and ours.y_train.dtype == np.int32
    # Where the file is not in its place, scikit-learn's loader gives the same.
    monkeypatch.setattr(data, "_digits_file", lambda: None)
    fallback = data.load_digits()
    np.testing.assert_array_equal(fallback.x_train, ours.x_train)
    np.testing.assert_array_equal(fallback.y_train, ours.y_train)
    # Scaled as StandardScaler scales, constant pixels (the digits' corners are always 0) centred only.
    x = ours.x_train
    scaled = data.fit_scaler(x[:1200])(x)
    expected = StandardScaler().fit(x[:1200].reshape(1200, -1)).transform(x.reshape(len(x), -1))
    np.testing.assert_allclose(scaled.reshape(len(x), -1), expected, atol=1e-5)
    assert scaled.dtype == np.float32 and scaled.shape == (1797, 8, 8, 1)
    constant = np.full((10, 2, 2), 5.0, np.float32)
    np.testing.assert_array_equal(data.fit_scaler(constant)(constant), np.zeros((10, 2, 2, 1), np.float32))


def test_synthetic():
    splits = data.load(DatasetSpec("synthetic", size=100))
    assert splits.input_shape == (28, 28, 1)
    assert len(splits.x_train) + len(splits.x_val) + len(splits.x_test) == 100


# ---------------------------------------------------------------- metric lines

def test_metric_line_format():
    line = metrics.format_line({"kind": "epoch", "task": "worker-0", "epoch": 1,
                                "loss": np.float32(0.5), "accuracy": float("nan")})
    assert line.startswith("TFLAUNCH_METRIC {")
    assert " " not in line[len(metrics.METRIC_PREFIX):]
    assert "\n" not in line
    assert metrics.parse_line(line) == {"kind": "epoch", "task": "worker-0", "epoch": 1,
                                        "loss": 0.5, "accuracy": None}
    assert metrics.parse_line("trainer: hello") is None


def test_evaluation_lines():
    import io

    stream = io.StringIO()
    reporter = metrics.Reporter("evaluator-0", stream)
    reporter.evaluation(epoch=2, checkpoint="ckpt-2", val_loss=0.4, val_accuracy=0.9, eval_seconds=0.5, final=False)
    reporter.evaluation(epoch=4, checkpoint="ckpt-4", val_loss=0.3, val_accuracy=0.95, eval_seconds=0.5, final=True,
                        test_loss=0.2, test_accuracy=0.96)
    middle, last = (metrics.parse_line(line) for line in stream.getvalue().splitlines())
    assert tuple(middle) == metrics.EVAL_FIELDS
    assert middle["kind"] == "eval" and middle["task"] == "evaluator-0" and middle["final"] is False
    assert tuple(last) == metrics.EVAL_FIELDS + ("test_loss", "test_accuracy")
    assert last["final"] is True and last["test_accuracy"] == 0.96 and last["epoch"] == 4


def test_reporter_lines_have_the_contract_fields():
    import io

    stream = io.StringIO()
    reporter = metrics.Reporter("worker-1", stream)
    reporter.epoch(epoch=2, logs={"loss": 1.0, "accuracy": 0.5, "val_loss": 1.1, "val_accuracy": 0.4},
                   timing={"epoch_seconds": 2.0, "train_seconds": 1.8, "first_step_seconds": 0.5, "steps": 10,
                           "samples_per_second": 100.0}, global_batch=64, replicas=2)
    reporter.final(test_loss=0.3, test_accuracy=0.9, startup_seconds=5.0, test_seconds=0.5, total_seconds=10.0,
                   epochs=4)
    epoch_line, final_line = stream.getvalue().splitlines()
    epoch = metrics.parse_line(epoch_line)
    assert tuple(epoch) == metrics.EPOCH_FIELDS
    assert epoch["task"] == "worker-1" and epoch["global_batch"] == 64 and epoch["replicas"] == 2
    final = metrics.parse_line(final_line)
    assert tuple(final) == metrics.FINAL_FIELDS
    assert final["kind"] == "final" and final["test_accuracy"] == 0.9


def test_epoch_clock_leaves_out_the_first_step():
    times = iter([0.0, 5.0, 6.0, 7.0, 8.0, 9.0])  # begin, 4 steps, end
    clock = metrics.EpochClock(global_batch=10, clock=lambda: next(times))
    clock.begin()
    for _ in range(4):
        clock.step_done()
    # 3 steps of 10 samples between t=5 and t=8: 10/s; the 5 s first step is left out.
    assert clock.samples_per_second() == pytest.approx(10.0)
    assert clock.seconds() == pytest.approx(9.0)
    assert (clock.first_step_seconds(), clock.train_seconds()) == (5.0, 8.0)  # validation: the last 1 s


def test_epoch_clock_without_step_timing():
    times = iter([0.0, 4.0])
    clock = metrics.EpochClock(global_batch=10, clock=lambda: next(times))
    clock.begin()
    clock.train_done(steps=8)
    assert clock.samples_per_second() == pytest.approx(20.0)


# ---------------------------------------------------------------- no TensorFlow here

@pytest.mark.parametrize("step_seconds, proposed", [
    (0.010, 50),        # as many steps as fit in AGREE_SECONDS
    (0.6, 1),           # a step longer than that: every step
    (1e-6, termination.AGREE_AT_MOST),
    (0.0, 1), (float("nan"), 1), (-1.0, 1),  # no usable timing: every step
])
def test_a_worker_proposes_agreeing_as_many_steps_apart_as_fit_in_half_a_second(step_seconds, proposed):
    assert termination.AGREE_SECONDS == 0.5
    assert termination.agreed_every(step_seconds) == proposed


def test_every_worker_derives_the_same_spacing_from_the_summed_proposals():
    # Two workers of 8 replicas each, proposing 25 and 10: each replica adds its worker's proposal.
    proposals = [25] * 8 + [10] * 8
    total = float(np.float32(sum(proposals)))  # what the float32 reduction gives, exactly
    assert termination.shared_every(total, len(proposals)) == 17  # the mean, rounded down
    assert termination.shared_every(float(np.float32(8)), 16) == 1  # never 0
    assert termination.shared_every(0.0, 0) == 1
    # The largest sum the spacing can reach (1,024 workers of 8 replicas at AGREE_AT_MOST) is exact in float32.
    largest = termination.AGREE_AT_MOST * 8 * 1024
    assert float(np.float32(largest)) == largest


@pytest.mark.unit
def test_print_epoch_is_a_keras_callback_whose_line_the_launcher_reads():
    """trainer.metrics.print_epoch, as LambdaCallback(on_epoch_end=...) calls it: epoch from 0, numpy figures."""
    from launcher.records.metrics import parse_line as launcher_parse

    class Scalar(float):  # a numpy scalar's one method that matters here
        def item(self):
            return float(self)

    stream = io.StringIO()
    metrics.print_epoch(2, {"loss": Scalar(0.25), "sparse_categorical_accuracy": 0.5, "lr": 1e-4,
                            "val_loss": float("nan")}, stream=stream)
    line = stream.getvalue()
    assert line.endswith("\n") and line.count("\n") == 1
    assert launcher_parse(line[:-1].encode()) == {"kind": "epoch", "epoch": 3, "loss": 0.25,
                                                  "sparse_categorical_accuracy": 0.5, "lr": 0.0001, "val_loss": None}


@pytest.mark.unit
def test_the_callback_docs_inspect_md_offers_to_copy_prints_what_print_epoch_prints():
    """docs/inspect.md's copy of print_epoch, run as written: the launcher reads the same record from it."""
    import contextlib
    import re

    from conftest import ROOT
    from launcher.records.metrics import parse_line as launcher_parse

    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "inspect.md").read_text(), re.S)
    (copy,) = [block for block in blocks if "def print_epoch(" in block]
    space: dict = {}
    exec(copy, space)

    class Scalar(float):  # a numpy scalar, as Keras's logs hold them
        def item(self):
            return float(self)

    logs = {"loss": Scalar(0.25), "sparse_categorical_accuracy": 0.5, "lr": 1e-4, "val_loss": float("nan")}
    copied, ours = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(copied):
        space["print_epoch"](2, logs)
    metrics.print_epoch(2, logs, stream=ours)
    assert copied.getvalue().count("\n") == 1
    assert launcher_parse(copied.getvalue()[:-1].encode()) == launcher_parse(ours.getvalue()[:-1].encode())
