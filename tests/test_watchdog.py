"""The start and hang watchdogs, on a fake clock.

Each test drives a real OutputPump (its thread tails real task files) and a Watchdog that share
one fake clock, so "30 seconds without progress" takes no time at all: the test writes a task's
output, waits until the pump has read it, moves the clock, and asks the watchdog. Only the stack
dump is stood in for (by a process object that returns fixed text), since the watchdog's job is
to decide and to file the dumps, not to run py-spy.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from launcher.cluster.plan import TaskLaunch
from launcher.run.console import Console
from launcher.records.metrics import PREFIX as METRIC_PREFIX
from launcher.run.pump import OutputPump
from launcher.records.states import TaskState
from launcher.run.supervisor import Task, Trip
from launcher.run.watchdog import Watchdog, WatchdogSettings, training_tasks
from polling import wait_for

START = 1_800_000_000.0


class FakeClock:
    def __init__(self, now: float = START):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class StackDump:
    """A task's process as far as the watchdog uses it: something whose stacks can be dumped."""

    pid = None

    def __init__(self, name: str):
        self.text = f"Thread 1 (idle): {name}\n    wait (collective.py:42)\n"

    def dump_stacks(self, timeout: float = 10.0) -> str:
        return self.text


def task(name: str, state: TaskState = TaskState.RUNNING) -> Task:
    role, index = name.rsplit("-", 1)
    launch = TaskLaunch(name, role, int(index), "localhost", "localhost:1", True, ("true",), {}, "/")
    record = Task(launch, process=StackDump(name))
    record.to(TaskState.RUNNING, START)
    if state is not TaskState.RUNNING:
        record.to(state, START)
    return record


class Cluster:
    """Task files tailed by a running pump, a fake clock, and watchdogs made on demand."""

    def __init__(self, folder: Path, console: Console):
        self.folder = folder
        self.clock = FakeClock()
        self.events: list[str] = []
        self.pump = OutputPump(folder / "merged.log", folder / "metrics.jsonl", console, interval=0.002,
                               clock=self.clock).start()
        self.lines = 0

    def watchdog(self, trainers: list[str], attempt: int = 1, start_timeout: float | None = None,
                 hang_timeout: float | None = None) -> Watchdog:
        return Watchdog(WatchdogSettings(start_timeout, hang_timeout), self.pump.progress, attempt, trainers,
                        self.folder / f"attempt-{attempt}" / "stacks", self.events.append, clock=self.clock)

    def workers(self, count: int, **timeouts: float) -> tuple[Watchdog, list[Task]]:
        """``count`` running workers, followed by the pump, and a watchdog that counts them all as trainers."""
        names = [f"worker-{i}" for i in range(count)]
        self.follow(*names)
        return self.watchdog(names, **timeouts), [task(name) for name in names]

    def path(self, name: str, attempt: int) -> Path:
        return self.folder / f"{name}.{attempt}.log"

    def follow(self, *names: str, attempt: int = 1) -> None:
        for name in names:
            self.pump.follow(name, self.path(name, attempt), attempt)

    def write(self, name: str, *lines: str, attempt: int = 1) -> None:
        """Append lines to a task's file and return once the pump has read them all."""
        with open(self.path(name, attempt), "ab") as handle:
            handle.write("".join(line + "\n" for line in lines).encode())
        self.lines += len(lines)
        wait_for(self._all_read, timeout=10, interval=0.002, message=f"the pump to read {name}'s output")

    def _all_read(self) -> bool:
        merged = self.folder / "merged.log"
        if merged.exists() and merged.read_bytes().count(b"\n") >= self.lines:
            return True
        if not self.pump._thread.is_alive():
            pytest.fail("the output pump's thread died", pytrace=False)
        return False

    def metric(self, name: str, attempt: int = 1, epoch: int = 1) -> None:
        record = json.dumps({"kind": "epoch", "epoch": epoch, "loss": 0.5})
        self.write(name, METRIC_PREFIX.decode() + record, attempt=attempt)

    def close(self) -> None:
        self.pump.close()


def quiet_console() -> Console:
    return Console(io.StringIO(), messages=io.StringIO(), colour=False)


@pytest.fixture
def cluster(tmp_path):
    made = Cluster(tmp_path, quiet_console())
    yield made
    made.close()


# -- which tasks must show progress --------------------------------------------------------------


@pytest.mark.parametrize("roles, trainers", [
    (["worker", "worker"], ["worker-0", "worker-1"]),
    (["chief", "worker", "evaluator"], ["chief-0", "worker-0"]),
    (["chief", "worker", "worker", "ps"], ["chief-0"]),
    (["worker", "ps", "chief"], ["chief-0"]),
])
def test_training_tasks_are_the_chief_with_ps_else_chief_and_workers(roles, trainers):
    counts: dict[str, int] = {}
    names = []
    for role in roles:
        names.append((f"{role}-{counts.get(role, 0)}", role))
        counts[role] = counts.get(role, 0) + 1
    assert training_tasks(names) == trainers


@pytest.mark.parametrize("settings, enabled", [
    (WatchdogSettings(), False), (WatchdogSettings(start_timeout=5), True), (WatchdogSettings(hang_timeout=5), True),
])
def test_settings_are_enabled_by_either_timeout(settings, enabled):
    assert settings.enabled is enabled


# -- start timeout -------------------------------------------------------------------------------


def test_start_timeout_fires_naming_the_trainers_without_progress(cluster):
    cluster.follow("chief-0", "worker-0", "worker-1")
    watchdog = cluster.watchdog(["chief-0", "worker-0", "worker-1"], start_timeout=30)
    tasks = [task("chief-0"), task("worker-0"), task("worker-1")]
    cluster.clock.advance(5)
    cluster.metric("chief-0")
    cluster.metric("worker-0")
    cluster.write("worker-1", "loading data", "still loading")  # output, but no progress
    cluster.clock.advance(25)
    assert watchdog(tasks) is None  # exactly 30 s: not yet over
    cluster.clock.advance(0.5)
    assert watchdog(tasks) == Trip("start timeout: worker-1 made no training progress within 30 s "
                                   "(the cluster never formed)", ("worker-1",))
    assert cluster.events == []  # the supervisor announces the trip; the start watchdog adds nothing


def test_start_timeout_does_not_fire_once_every_trainer_reported(cluster):
    watchdog, tasks = cluster.workers(2, start_timeout=30)
    cluster.clock.advance(29)
    assert watchdog(tasks) is None
    cluster.metric("worker-0")
    cluster.metric("worker-1")
    assert watchdog(tasks) is None
    cluster.clock.advance(3600)  # a formed cluster may train for as long as it likes
    assert watchdog(tasks) is None


def test_start_timeout_counts_only_the_current_attempts_progress(cluster):
    cluster.follow("worker-0", attempt=1)
    cluster.follow("worker-0", attempt=2)
    cluster.metric("worker-0", attempt=1)
    watchdog = cluster.watchdog(["worker-0"], attempt=2, start_timeout=10)
    cluster.clock.advance(11)
    trip = watchdog([task("worker-0")])
    assert trip is not None and trip.tasks == ("worker-0",)

    second = cluster.watchdog(["worker-0"], attempt=2, start_timeout=10)
    cluster.metric("worker-0", attempt=2)
    cluster.clock.advance(11)
    assert second([task("worker-0")]) is None


def test_with_parameter_servers_only_the_chief_must_show_progress(cluster):
    names = ["chief-0", "worker-0", "ps-0"]
    cluster.follow(*names)
    watchdog = cluster.watchdog(training_tasks([(n, n.split("-")[0]) for n in names]), start_timeout=10)
    cluster.write("worker-0", "waiting for the coordinator")
    cluster.metric("chief-0")
    cluster.clock.advance(60)
    assert watchdog([task(n) for n in names]) is None


def test_progress_of_a_task_that_is_not_a_trainer_does_not_count(cluster):
    cluster.follow("chief-0", "evaluator-0")
    watchdog = cluster.watchdog(["chief-0"], start_timeout=10)
    cluster.metric("evaluator-0")
    cluster.clock.advance(10.5)
    assert watchdog([task("chief-0"), task("evaluator-0")]).tasks == ("chief-0",)


# -- hang timeout --------------------------------------------------------------------------------


def test_hang_timeout_fires_on_silence_and_files_the_running_tasks_stacks(cluster):
    cluster.follow("worker-0", "worker-1")
    watchdog = cluster.watchdog(["worker-0", "worker-1"], hang_timeout=10)
    tasks = [task("worker-0"), task("worker-1", TaskState.SUCCEEDED), task("worker-2")]
    cluster.clock.advance(4)
    cluster.write("worker-1", "epoch 1 done")
    cluster.clock.advance(10)
    assert watchdog(tasks) is None  # exactly 10 s since the last line
    assert cluster.events == []
    cluster.clock.advance(0.5)
    stacks = cluster.folder / "attempt-1" / "stacks"
    assert watchdog(tasks) == Trip(f"hang timeout: no output from any task for 10 s; stack traces of 2 tasks "
                                   f"in {stacks}", ("worker-0", "worker-2"))
    assert cluster.events == ["no output from any task for 10 s: collecting stack traces"]
    assert sorted(p.name for p in stacks.iterdir()) == ["worker-0.txt", "worker-2.txt"]  # not the ended task
    assert (stacks / "worker-2.txt").read_text() == tasks[2].process.text


def test_hang_timeout_counts_from_the_attempts_start_when_nothing_was_written(cluster):
    cluster.follow("worker-0")
    cluster.write("worker-0", "output of an earlier attempt")
    cluster.clock.advance(100)  # e.g. the restart delay: silence before this attempt is not a hang
    watchdog = cluster.watchdog(["worker-0"], hang_timeout=10)
    tasks = [task("worker-0")]
    cluster.clock.advance(10)
    assert watchdog(tasks) is None
    cluster.clock.advance(0.5)
    assert watchdog(tasks) is not None


def test_steady_output_keeps_the_hang_timeout_quiet(cluster):
    watchdog, tasks = cluster.workers(2, hang_timeout=10)
    for step in range(20):  # 160 s of a run where one task or the other writes every 8 s
        cluster.clock.advance(8)
        cluster.write(f"worker-{step % 2}", f"step {step}")
        assert watchdog(tasks) is None, step
    assert cluster.events == []


# -- the console is not what the watchdogs watch -------------------------------------------------


def test_a_closed_console_does_not_make_a_healthy_run_look_hung_or_unformed(tmp_path):
    read_end, write_end = os.pipe()
    os.close(read_end)  # like `tflaunch ... | head -1` once head has exited
    closed = Console(os.fdopen(write_end, "w"), messages=io.StringIO(), colour=False)
    cluster = Cluster(tmp_path, closed)
    try:
        watchdog, tasks = cluster.workers(2, start_timeout=20, hang_timeout=10)
        for epoch in range(1, 6):  # 5 epochs of 8 s, each task reporting each one
            cluster.clock.advance(8)
            cluster.metric("worker-0", epoch=epoch)
            cluster.metric("worker-1", epoch=epoch)
            assert watchdog(tasks) is None, epoch
        assert watchdog.formed
        assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 10
    finally:
        cluster.close()
