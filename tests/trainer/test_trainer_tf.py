"""The trainer as a real program: real TensorFlow on CPU, real processes, hand-launched clusters.

Clusters are started the way the launcher does it: one process group per task,
TF_CONFIG naming every task, TFLAUNCH_TASK, unbuffered output, one thread each.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pytest

from conftest import DEFAULT_LOCAL_TWO
from launcher.records.folder import TENSORBOARD
from polling import wait_for
from trainer.metrics import METRIC_PREFIX, parse_line

pytestmark = [pytest.mark.slow, pytest.mark.tensorflow]

REPO = Path(__file__).resolve().parents[2]
THREAD_LIMITS = {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1", "OMP_NUM_THREADS": "1"}


# ---------------------------------------------------------------- helpers

class Output:
    """What one trainer wrote, read as its metric records."""

    def output(self) -> str:
        raise NotImplementedError

    def metrics(self, kind: str | None = None) -> list[dict]:
        records = [parse_line(line) for line in self.output().splitlines() if line.startswith(METRIC_PREFIX)]
        return [r for r in records if kind is None or r["kind"] == kind]

    def epochs(self) -> list[int]:
        return [r["epoch"] for r in self.metrics("epoch")]

    def final(self) -> dict:
        finals = self.metrics("final")
        assert len(finals) == 1, self.output()
        return finals[0]



class Ran(Output):
    """A trainer run in this process: its exit code and everything it wrote (stdout, then stderr)."""

    def __init__(self, returncode: int, text: str):
        self.returncode, self.text = returncode, text

    def output(self) -> str:
        return self.text


class Task(Output):
    """One `python -m trainer` process in its own process group, output in a log file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path, cwd: Path):
        self.name = name
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "trainer", *argv], env=env, cwd=cwd,
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, grace: float = 10.0) -> int:
        """SIGTERM the group, SIGKILL after grace seconds; return the exit code."""
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
        return self.proc.wait()


class Cluster:
    """Tasks of one hand-launched cluster; stops every one of them on exit."""

    def __init__(self, tmp_path: Path, roles: dict[str, int], argv: list[str], env: dict[str, str] | None = None,
                 label: str = "run", only: set[str] | None = None):
        ports = free_ports(sum(roles.values()))
        spec = {role: [f"localhost:{ports.pop()}" for _ in range(count)] for role, count in roles.items()}
        logs = tmp_path / f"logs-{label}"
        logs.mkdir(exist_ok=True)
        self.tasks: dict[str, Task] = {}
        # Servers first, so that a ParameterServerStrategy chief finds them listening.
        order = sorted(((r, i) for r, n in roles.items() for i in range(n)), key=lambda t: t[0] == "chief")
        for role, index in order:
            name = f"{role}-{index}"
            if only is not None and name not in only:
                continue
            task_env = {**os.environ, **THREAD_LIMITS, **(env or {}), "PYTHONUNBUFFERED": "1",
                        "TFLAUNCH_TASK": name,
                        "TF_CONFIG": json.dumps({"cluster": spec, "task": {"type": role, "index": index}})}
            self.tasks[name] = Task(name, argv, task_env, logs / f"{name}.log", tmp_path)

    def __getitem__(self, name: str) -> Task:
        return self.tasks[name]

    def wait(self, timeout: float, names: list[str] | None = None) -> dict[str, int]:
        """Exit codes of the named tasks (all by default); fails the test if they outlive timeout."""
        deadline = time.monotonic() + timeout
        codes = {}
        for name in names or list(self.tasks):
            try:
                codes[name] = self.tasks[name].proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.stop()
                pytest.fail(f"{name} still running after {timeout} s:\n{self.tasks[name].output()[-3000:]}")
        return codes

    def stop(self) -> dict[str, int]:
        return {name: task.stop() for name, task in self.tasks.items()}

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("localhost", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def start_single(tmp_path: Path, argv: list[str], env: dict[str, str] | None = None) -> Task:
    """One trainer process without TF_CONFIG, started."""
    task_env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "TFLAUNCH_TASK")}
    task_env.update(PYTHONUNBUFFERED="1", **(env or {}))
    return Task("local", argv, task_env, tmp_path / f"local-{time.monotonic_ns()}.log", tmp_path)


def run_single(tmp_path: Path, argv: list[str], env: dict[str, str] | None = None, timeout: float = 120) -> Task:
    """One trainer process without TF_CONFIG, waited for."""
    task = start_single(tmp_path, argv, env)
    try:
        task.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        task.stop()
        pytest.fail(f"trainer still running after {timeout} s:\n{task.output()[-3000:]}")
    return task


# The tests that run the trainer in pytest's own process, where TensorFlow loads once for them all
# rather than once per run: one xdist worker takes them.
IN_PROCESS = "trainer_in_process"


@pytest.fixture(scope="session")
def tensorflow_here() -> None:
    """TensorFlow and tf_keras loaded in this process, once, before the tests that use them start:
    importing TensorFlow sets variables of its own in os.environ, which a test may not leave behind."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TF_CPP_MIN_LOG_LEVEL", "1")
        patch.setenv("TF_USE_LEGACY_KERAS", "1")
        import tensorflow  # noqa: F401
        import tf_keras  # noqa: F401


@pytest.fixture
def trainer_here(tensorflow_here, monkeypatch, capfd, signal_handlers) -> Iterator[Callable[..., Ran]]:
    """Runs `python -m trainer ARGV` in this process, without TF_CONFIG: ``run(argv, env=None)`` -> Ran.
    Only for runs that start no cluster and keep no backup (which would leave a SIGTERM watcher here)."""
    from trainer.__main__ import main

    def run(argv: list[str], env: dict[str, str] | None = None) -> Ran:
        for name in ("TF_CONFIG", "TFLAUNCH_TASK"):
            monkeypatch.delenv(name, raising=False)
        for name, value in {"TF_CPP_MIN_LOG_LEVEL": "1", "TF_USE_LEGACY_KERAS": "1", **(env or {})}.items():
            monkeypatch.setenv(name, value)
        capfd.readouterr()
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's one-line errors
            code = exc.code
        out, err = capfd.readouterr()
        return Ran(code, out + err)

    yield run
    faulthandler.unregister(signal.SIGUSR1)  # main() registered it for the stack dumps


def wait_for_task(task: Task, reached: Callable[[], bool], what: str, timeout: float) -> None:
    """Wait until ``reached()``; fail at once, showing the task's output, when the task exits first."""
    def check() -> bool:
        if reached():
            return True
        if task.proc.poll() is not None:
            pytest.fail(f"{task.name} exited {task.proc.returncode} before {what}:\n{task.output()[-3000:]}")
        return False

    wait_for(check, timeout, interval=0.02, message=lambda: f"{task.name}: {what}\n{task.output()[-3000:]}")


def wait_for_epoch(task: Task, epoch: int, timeout: float) -> None:
    wait_for_task(task, lambda: epoch in task.epochs(), f"epoch {epoch}", timeout)


def killed_after_epoch(tmp_path: Path, argv: list[str], epoch: int, timeout: float) -> Task:
    """One trainer process without TF_CONFIG (one thread each way), killed with SIGKILL once it
    reported ``epoch``: what a resume starts from."""
    task = start_single(tmp_path, argv, THREAD_LIMITS)
    try:
        wait_for_epoch(task, epoch, timeout=timeout)
        task.signal(signal.SIGKILL)
    finally:
        task.stop()
    return task


def assert_user_error(task: Output, fragment: str) -> None:
    """Exit 2 with one `trainer: error:` line naming the problem, and no traceback."""
    out = task.output()
    assert (task.returncode if isinstance(task, Ran) else task.proc.returncode) == 2, out
    assert "Traceback" not in out, out
    errors = [line for line in out.splitlines() if line.startswith("trainer: error: ")]
    assert len(errors) == 1, out
    assert fragment in errors[0], errors[0]


# ---------------------------------------------------------------- single process

@pytest.mark.xdist_group(IN_PROCESS)
def test_single_process_learns_digits(trainer_here):
    task = trainer_here(["--epochs", "4"])
    assert task.returncode == 0, task.output()
    epochs = task.metrics("epoch")
    assert [e["epoch"] for e in epochs] == [1, 2, 3, 4]
    assert all(e["task"] == "local" and e["replicas"] == 1 and e["global_batch"] == 32 for e in epochs)
    assert epochs[-1]["loss"] < epochs[0]["loss"] / 3
    assert all(e["samples_per_second"] > 0 and e["epoch_seconds"] > 0 for e in epochs)
    final = task.final()
    assert final["test_accuracy"] >= 0.90, final
    assert final["epochs"] == 4 and final["total_seconds"] > 0
    # The figures add up: each epoch's parts within it, its rate over the steps after the first,
    # and the task's start-up, epochs and test within its whole time.
    for e in epochs:
        assert 0 < e["first_step_seconds"] <= e["train_seconds"] <= e["epoch_seconds"], e
        steady = e["train_seconds"] - e["first_step_seconds"]
        assert (e["steps"] - 1) * 32 / e["samples_per_second"] == pytest.approx(steady, rel=1e-3), e
    assert epochs[0]["first_step_seconds"] > epochs[1]["first_step_seconds"]  # the first traces the step
    spent = final["startup_seconds"] + sum(e["epoch_seconds"] for e in epochs) + final["test_seconds"]
    assert spent <= final["total_seconds"] < spent + 5, final


@pytest.mark.xdist_group(IN_PROCESS)
def test_custom_loop_learns_digits(trainer_here):
    task = trainer_here(["--loop", "custom", "--epochs", "4"])
    assert task.returncode == 0, task.output()
    assert task.epochs() == [1, 2, 3, 4]
    assert task.final()["test_accuracy"] >= 0.90, task.final()


# ---------------------------------------------------------------- two workers, default options

# `python -m trainer` with no training options on two MWMS workers: the run of the default job that
# tflaunch's own tests read too (conftest's default_local_two), so one run serves them all.

def epoch_records(done, task: str | None = None, kind: str = "epoch") -> list[dict]:
    records = [json.loads(line) for line in (done.run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r["kind"] == kind and (task is None or r["task"] == task)]


@pytest.mark.timeout(300)
@pytest.mark.xdist_group(DEFAULT_LOCAL_TWO)
def test_two_workers_train_in_lockstep(default_local_two):
    done = default_local_two.done
    assert done.returncode == 0, done.stderr[-3000:]
    assert {t["name"]: t["exit_code"] for t in done.record["tasks"]} == {"worker-0": 0, "worker-1": 0}
    w0, w1 = epoch_records(done, "worker-0"), epoch_records(done, "worker-1")
    assert [e["epoch"] for e in w0] == list(range(1, len(w0) + 1)) and len(w0) >= 2
    # Gradients are all-reduced, so both workers hold the same model and report the same losses.
    assert [e["loss"] for e in w0] == [e["loss"] for e in w1]
    assert [e["val_accuracy"] for e in w0] == [e["val_accuracy"] for e in w1]
    for record in w0 + w1:
        assert record["replicas"] == 2
        assert record["global_batch"] == 2 * 32
    finals = {r["task"]: r["test_accuracy"] for r in epoch_records(done, kind="final")}
    assert set(finals) == {"worker-0", "worker-1"} and finals["worker-0"] == finals["worker-1"]


@pytest.mark.timeout(300)
@pytest.mark.xdist_group(DEFAULT_LOCAL_TWO)
def test_default_two_worker_run_is_accurate(default_local_two):
    # Its time is a benchmark's (benchmarks/bench_tf_overhead.py), not a bound here: a loaded machine
    # doubles it.
    final = epoch_records(default_local_two.done, "worker-0", "final")[0]
    print(f"default 2-worker run: {default_local_two.seconds:.1f} s wall, "
          f"test_accuracy {final['test_accuracy']:.4f}")
    assert final["test_accuracy"] >= 0.90, final


@pytest.mark.timeout(300)
@pytest.mark.xdist_group(DEFAULT_LOCAL_TWO)
def test_no_unshardable_warning(default_local_two):
    for name in ("worker-0", "worker-1"):
        out = default_local_two.done.task_output(name)
        assert "unshardable" not in out.lower()
        assert "AutoShardPolicy" not in out


@pytest.mark.timeout(300)
@pytest.mark.xdist_group(DEFAULT_LOCAL_TWO)
def test_only_the_chief_keeps_the_model(default_local_two, tensorflow_here):
    done, path = default_local_two.done, default_local_two.tflaunch.cwd
    assert (path / "model" / "saved_model.pb").is_file()
    assert sorted(p.name for p in (done.run_dir / TENSORBOARD).iterdir()) == ["train", "validation"]
    # Worker 1 saved into its own temporary directory (under TMPDIR), then removed it. Autograph
    # imports the code it generates from TMPDIR too, so where Python writes bytecode (no
    # PYTHONDONTWRITEBYTECODE) a __pycache__ of TensorFlow's stays there, and tflaunch keeps its
    # port locks in tflaunch-<uid> there: neither is the model's.
    assert [p for p in (path / "tmp").iterdir() if p.name not in ("__pycache__", f"tflaunch-{os.geteuid()}")] == []
    assert not list(path.rglob("workertemp_*"))
    # The saved model loads and scores what worker 0 reported on the same test split;
    # the TensorBoard events hold one loss per epoch.
    import tensorflow as tf
    import tf_keras

    from trainer.cli import DatasetSpec
    from trainer.data import load

    splits = load(DatasetSpec("digits"))
    loss, accuracy = tf_keras.models.load_model(path / "model").evaluate(splits.x_test, splits.y_test, verbose=0)
    val_losses = {}
    for events in (done.run_dir / TENSORBOARD / "validation").glob("events.*"):
        for event in tf.compat.v1.train.summary_iterator(str(events)):
            for value in event.summary.value:
                if value.tag == "epoch_loss":
                    val_losses[event.step] = float(tf.make_ndarray(value.tensor))
    reported = epoch_records(done, "worker-0", "final")[0]
    assert accuracy == pytest.approx(reported["test_accuracy"], abs=1e-4)
    assert loss == pytest.approx(reported["test_loss"], rel=1e-3)
    epochs = epoch_records(done, "worker-0")
    assert sorted(val_losses) == [e["epoch"] for e in epochs]
    assert [val_losses[step] for step in sorted(val_losses)] == pytest.approx([e["val_loss"] for e in epochs],
                                                                              rel=1e-5)


# ---------------------------------------------------------------- resuming from a backup

@pytest.mark.timeout(180)
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_step_backups_resume_mid_epoch(tmp_path, loop):
    # 20 steps per epoch, a backup every 50 steps: at step 10 of epoch 3 and at the end of
    # epoch 5, the last. Killed after epoch 3, the run resumes from the first one: epoch 3, step 11.
    argv = ["--loop", loop, "--width", "1", "--batch-per-worker", "64", "--steps-per-epoch", "20",
            "--epochs", "5", "--backup-dir", str(tmp_path / "backup"), "--backup-every", "50"]
    first = killed_after_epoch(tmp_path, argv, 3, timeout=120)
    assert first.epochs()[:3] == [1, 2, 3] and 5 not in first.epochs(), first.output()
    second = run_single(tmp_path, argv, env={"TF_NUM_INTRAOP_THREADS": "1"})
    assert second.proc.returncode == 0, second.output()
    assert "trainer: resuming from backup at epoch 3 step 11" in second.output()
    assert second.epochs() == [3, 4, 5]


# ---------------------------------------------------------------- signals

@pytest.mark.timeout(120)
def test_sigusr1_dumps_stacks_and_sigterm_ends_promptly(tmp_path):
    # A ps task just serves until it is stopped: a long-running trainer process to poke.
    with Cluster(tmp_path, {"ps": 1, "worker": 1, "chief": 1}, [], only={"ps-0"}) as cluster:
        ps = cluster["ps-0"]
        wait_for_task(ps, lambda: "serving as ps" in ps.output(), "serving", timeout=60)
        ps.proc.send_signal(signal.SIGUSR1)
        wait_for_task(ps, lambda: "in serve" in ps.output(), "the stack dump", timeout=10)
        assert "(most recent call first)" in ps.output() and "trainer/ps.py" in ps.output(), ps.output()
        assert ps.proc.poll() is None
        started = time.monotonic()
        ps.proc.send_signal(signal.SIGTERM)
        assert ps.proc.wait(5) == -signal.SIGTERM
        assert time.monotonic() - started < 5


# ---------------------------------------------------------------- user errors

def write_npz(path: Path, **arrays) -> str:
    np.savez(path, **arrays)
    return str(path)


@pytest.mark.timeout(120)
def test_bad_npz_files_give_one_line_errors(tmp_path):
    rng = np.random.default_rng(0)
    x, y = rng.random((50, 8, 8)), rng.integers(0, 10, 50)
    cases = {
        write_npz(tmp_path / "nokey.npz", x_train=x): "missing key 'y_train'",
        write_npz(tmp_path / "shape.npz", x_train=x.reshape(50, 64), y_train=y): "x_train: expected shape",
        write_npz(tmp_path / "lengths.npz", x_train=x, y_train=y[:49]): "y_train: 49 labels but x_train has 50",
        str(tmp_path): "not a file",
        str(tmp_path / "absent.npz"): "not a file",
    }
    corrupt = tmp_path / "corrupt.npz"
    corrupt.write_bytes(b"PK\x03\x04 truncated")
    cases[str(corrupt)] = "cannot read it as an .npz file"
    for path, fragment in cases.items():
        task = run_single(tmp_path, ["--dataset", f"npz:{path}"])
        assert_user_error(task, f"npz:{path}: {fragment}")


@pytest.mark.timeout(120)
@pytest.mark.xdist_group(IN_PROCESS)
def test_good_npz_trains(tmp_path, trainer_here):
    rng = np.random.default_rng(0)
    x = rng.random((60, 8, 8)).astype(np.float32)
    y = (x.mean(axis=(1, 2)) > 0.5).astype(np.int64)
    path = write_npz(tmp_path / "good.npz", x_train=x, y_train=y)
    task = trainer_here(["--dataset", f"npz:{path}", "--epochs", "1"])
    assert task.returncode == 0, task.output()
    assert "train=42 val=9 test=9" in task.output()
    assert task.final()["epochs"] == 1


@pytest.mark.timeout(120)
def test_option_and_cluster_errors_give_one_line_errors(tmp_path):
    task = run_single(tmp_path, ["--no-such-option"])
    assert_user_error(task, "unrecognized arguments: --no-such-option")
    task = run_single(tmp_path, ["--batch-per-worker", "-4"])
    assert_user_error(task, "--batch-per-worker: expected a positive integer")
    task = run_single(tmp_path, ["--strategy", "parameter_server"])
    assert_user_error(task, "needs ps tasks in TF_CONFIG")
    task = run_single(tmp_path, [], env={"TF_CONFIG": "{broken"})
    assert_user_error(task, "TF_CONFIG: not valid JSON")
    ps_config = json.dumps({"cluster": {"chief": ["localhost:1"], "ps": ["localhost:2"], "worker": ["localhost:3"]},
                            "task": {"type": "chief", "index": 0}})
    task = run_single(tmp_path, ["--loop", "custom"], env={"TF_CONFIG": ps_config})
    assert_user_error(task, "--strategy parameter_server supports --loop fit only")


@pytest.mark.timeout(120)
@pytest.mark.xdist_group(IN_PROCESS)
@pytest.mark.parametrize("name", ["mnist", "fashion_mnist"])
def test_download_failure_is_a_one_line_error(tmp_path, name, trainer_here, monkeypatch):
    import urllib.request

    # An empty home: no cached copy in ~/.keras, so load_data() has to download (and cannot here).
    monkeypatch.setenv("HOME", str(tmp_path))
    # Make sure the download fails even on a machine with internet access; urlopen's opener, made on
    # first use, reads the proxies then, so a fresh one is made for this run.
    monkeypatch.setattr(urllib.request, "_opener", None)
    task = trainer_here(["--dataset", name], env={"KERAS_HOME": str(tmp_path / ".keras"),
                                                 "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9",
                                                 "https_proxy": "http://127.0.0.1:9", "http_proxy": "http://127.0.0.1:9"})
    assert_user_error(task, f"{name}: could not be downloaded")
    assert "use --dataset digits or --dataset npz:PATH instead" in task.output()
