"""The built-in trainer's evaluator task and ParameterServer workers coming back, with real TensorFlow.

Clusters are hand-launched as in test_trainer_tf, with TF_CONFIG written the way tflaunch
writes it: the evaluator sees the whole cluster, the training tasks do not see the evaluator
(unless a test says otherwise, as some other launchers do).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from polling import wait_for
from test_trainer_tf import (IN_PROCESS, THREAD_LIMITS, Cluster, Task, free_ports, tensorflow_here,  # noqa: F401
                             trainer_here, wait_for_epoch)

pytestmark = [pytest.mark.slow, pytest.mark.tensorflow]


class RoleCluster(Cluster):
    """A Cluster whose evaluator is in its own TF_CONFIG only (or, asked, in everyone's)."""

    def __init__(self, tmp_path: Path, roles: dict[str, int], argv: list[str], *,
                 evaluator_in_every_cluster: bool = False, env: dict[str, str] | None = None):
        ports = free_ports(sum(roles.values()))
        self.spec = {role: [f"localhost:{ports.pop()}" for _ in range(count)] for role, count in roles.items()}
        training = {role: addresses for role, addresses in self.spec.items() if role != "evaluator"}
        logs = tmp_path / "logs"
        logs.mkdir(exist_ok=True)
        self.tmp_path, self.argv, self.logs = tmp_path, argv, logs
        self.tasks: dict[str, Task] = {}
        # Servers first, so that a ParameterServerStrategy chief finds them listening.
        order = sorted(((r, i) for r, n in roles.items() for i in range(n)), key=lambda t: t[0] == "chief")
        for role, index in order:
            cluster = self.spec if role == "evaluator" or evaluator_in_every_cluster else training
            self.env_of = {**os.environ, **THREAD_LIMITS, "TF_NUM_INTEROP_THREADS": "2", **(env or {}),
                           "PYTHONUNBUFFERED": "1"}
            self.start(role, index, cluster)

    def start(self, role: str, index: int, cluster: dict, suffix: str = "") -> Task:
        name = f"{role}-{index}"
        env = {**self.env_of, "TFLAUNCH_TASK": name,
               "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": role, "index": index}})}
        task = Task(name, self.argv, env, self.logs / f"{name}{suffix}.log", self.tmp_path)
        self.tasks[name + suffix] = task
        return task


def check_evaluations(records: list[dict], chief: str, epochs: int, checkpoints: Path, evaluator_output: str,
                      run_id: str | None = None) -> None:
    """The evaluator evaluated checkpoints in order, ending with the final one, on the chief's weights
    (``records``: the metric records of the evaluator and the chief)."""
    evals = [r for r in records if r["kind"] == "eval"]
    assert evals, evaluator_output[-3000:]
    assert all(r["task"] == "evaluator-0" for r in evals)
    numbers = [r["epoch"] for r in evals]
    assert [r["final"] for r in evals] == [False] * (len(evals) - 1) + [True]
    # In order; the final checkpoint may have been seen once before the chief's marker.
    before_final = numbers[:-1]
    assert before_final == sorted(set(before_final)) and numbers[-1] == epochs, numbers
    assert all(n < epochs for n in before_final[:-1]), numbers
    last = evals[-1]
    assert last["checkpoint"] == f"ckpt-{epochs}"
    # The final checkpoint holds the weights the chief tested: the same split gives the same figures.
    final = next(r for r in records if r["kind"] == "final" and r["task"] == chief)
    assert last["test_accuracy"] == pytest.approx(final["test_accuracy"], abs=1e-6)
    assert last["test_loss"] == pytest.approx(final["test_loss"], rel=1e-4)
    chief_val = {r["epoch"]: r["val_accuracy"] for r in records if r["kind"] == "epoch" and r["task"] == chief}
    for record in evals:
        assert record["val_accuracy"] == pytest.approx(chief_val[record["epoch"]], abs=1e-6), record
    assert "trainer: training ended; final checkpoint" in evaluator_output
    marker = json.loads((checkpoints / "training-finished.json").read_text())
    assert marker == {"epochs": epochs, "checkpoint": f"ckpt-{epochs}", "run_id": run_id}
    # Only the chief writes there; other workers' copies went to their own scratch folders.
    assert not [p for p in checkpoints.iterdir() if p.is_dir()]


@pytest.mark.timeout(180)
@pytest.mark.xdist_group(IN_PROCESS)
def test_evaluator_user_errors_are_one_line(tmp_path, trainer_here):
    evaluator_config = json.dumps({"cluster": {"worker": ["localhost:1"], "evaluator": ["localhost:2"]},
                                   "task": {"type": "evaluator", "index": 0}})
    env = {"TF_CONFIG": evaluator_config, "TFLAUNCH_CHECKPOINT_DIR": ""}
    task = trainer_here([], env=env)
    assert task.returncode == 2 and "Traceback" not in task.output(), task.output()
    assert "trainer: error: the evaluator task needs --checkpoint-dir" in task.output()
    # Checkpoints of a narrower model than the evaluator builds.
    checkpoints = tmp_path / "checkpoints"
    chief = trainer_here(["--epochs", "1", "--steps-per-epoch", "2", "--width", "0.125",
                          "--checkpoint-dir", str(checkpoints)])
    assert chief.returncode == 0, chief.output()
    task = trainer_here(["--checkpoint-dir", str(checkpoints)], env={"TF_CONFIG": evaluator_config})
    out = task.output()
    assert task.returncode == 2 and "Traceback" not in out, out
    errors = [line for line in out.splitlines() if line.startswith("trainer: error: ")]
    assert len(errors) == 1 and "ckpt-1: does not match this model" in errors[0], out
    assert "WARNING:tensorflow" not in out


EPOCHS = 8


@pytest.mark.timeout(300)
def test_parameter_server_worker_restarted_in_place_rejoins_beside_an_evaluator_in_every_tasks_cluster(tmp_path):
    # Some launchers name the evaluator in every task's TF_CONFIG; a ParameterServerStrategy
    # chief would then wait for it forever, so the trainer leaves it out of the cluster it uses.
    checkpoints = tmp_path / "checkpoints"
    argv = ["--epochs", str(EPOCHS), "--width", "1", "--checkpoint-dir", str(checkpoints)]
    roles = {"ps": 1, "worker": 2, "chief": 1, "evaluator": 1}
    with RoleCluster(tmp_path, roles, argv, evaluator_in_every_cluster=True) as cluster:
        chief = cluster["chief-0"]
        wait_for_epoch(chief, 2, timeout=150)
        cluster["worker-1"].signal(signal.SIGKILL)
        assert cluster["worker-1"].proc.wait(10) == -signal.SIGKILL
        wait_for(lambda: "worker 1 lost" in chief.output(), timeout=60, message="the chief to see worker 1 lost")
        # The chief held while the replacement starts (TensorFlow takes seconds to start here), so
        # that it sees the worker come back with epochs still to train, however long the start takes.
        chief.signal(signal.SIGSTOP)
        try:
            # The same TF_CONFIG, as a launcher restarting the worker alone, in place, does.
            replacement = cluster.start("worker", 1, cluster.spec, suffix="-restarted")
            wait_for(lambda: "serving as worker 1" in replacement.output() or replacement.proc.poll() is not None,
                     timeout=120, message="the replacement worker to serve")
        finally:
            chief.signal(signal.SIGCONT)
        assert replacement.proc.poll() is None, replacement.output()[-3000:]
        # The evaluator ends by itself once it has evaluated the final checkpoint.
        codes = cluster.wait(timeout=240, names=["chief-0", "evaluator-0"])
        assert codes == {"chief-0": 0, "evaluator-0": 0}, chief.output()[-3000:]
        # The servers serve until they are stopped, and SIGTERM stops them.
        servers = {name: cluster[name] for name in ("ps-0", "worker-0", "worker-1-restarted")}
        for name, task in servers.items():
            assert task.proc.poll() is None, f"{name} ended early:\n{task.output()[-2000:]}"
        assert {name: task.stop() for name, task in servers.items()} == dict.fromkeys(servers, -signal.SIGTERM)
    out = chief.output()
    assert "ParameterServerStrategy" in out
    assert "trainer: worker 1 lost; its steps go to the other workers" in out
    assert "trainer: worker 1 rejoined" in out, out[-3000:]
    assert out.index("worker 1 lost") < out.index("worker 1 rejoined") < out.index('"kind":"final"')
    epochs = chief.metrics("epoch")
    assert [e["epoch"] for e in epochs] == list(range(1, EPOCHS + 1))
    assert all(e["task"] == "chief-0" and e["val_accuracy"] is not None for e in epochs)
    assert chief.final()["task"] == "chief-0"
    # Asynchronous training can spike in a late epoch whoever joins, so the bar is on the epochs
    # after the loss (their best reaches 0.90) and on the final model staying far above chance.
    after_loss = [e["val_accuracy"] for e in epochs if e["epoch"] > 2]
    assert max(after_loss) >= 0.90 and chief.final()["test_accuracy"] >= 0.5, (after_loss, chief.final())
    # The lost and rejoined lines come once each, and TensorFlow's INFO lines stay hidden.
    assert out.count("worker 1 rejoined") == 1 and "INFO:tensorflow" not in out
    evaluator = cluster["evaluator-0"]
    check_evaluations(evaluator.metrics() + chief.metrics(), "chief-0", EPOCHS, checkpoints, evaluator.output())
