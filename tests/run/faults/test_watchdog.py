"""The start and hang watchdogs, on a fake clock.

Each test drives a real OutputPump (its thread tails real task files) and a Watchdog that share
one fake clock, so "30 seconds without progress" takes no time at all: the test writes a task's
output, waits until the pump has read it, moves the clock, and asks the watchdog. The task's
process is stood in for by an object that returns CPU readings the test chooses and fixed stack
text (real py-spy dumps of a hung MWMS cluster), since the watchdog's job is to decide and to file
the dumps; the real agents, py-spy and TensorFlow are in tests/run/faults/test_hangs.py.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from launcher.cluster.plan import TaskLaunch
from launcher.run.console.writer import Console
from launcher.records.metrics import PREFIX as METRIC_PREFIX
from launcher.run.output.pump import OutputPump
from launcher.records.states import TaskState
from launcher.run.lifecycle.task import Task, Trip
from launcher.run.faults.watchdog import Watchdog, WatchdogSettings, never_formed, training_tasks
from launcher.transports.base import Reading
from launcher.options import LOG_MAX_SIZE
from launcher.records.boundedlog import WRITING
from polling import wait_for

pytestmark = pytest.mark.unit

START = 1_800_000_000.0


class FakeClock:
    def __init__(self, now: float = START):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeProcess:
    """A task's process as far as the watchdog uses it: its agent's CPU readings and its stacks."""

    def __init__(self, name: str, clock: "FakeClock"):
        self.text = 'Thread 1 (idle): "MainThread"\n    wait (collective.py:42)\n'
        self.clock = clock
        self.pid = 4711
        self.cpu = 0.0  # CPU seconds the task's tree used so far
        self.waited = 0.0  # seconds its main threads waited for a CPU so far

    def dump_stacks(self, timeout: float = 10.0) -> str:
        return self.text

    def reading(self) -> Reading:
        return Reading(self.pid, 1 << 20, self.cpu, 1, self.clock(), waited_seconds=self.waited)


CLOCK = None  # the clock of the test's Cluster (set when it is made), for the processes task() makes


def task(name: str, state: TaskState = TaskState.RUNNING) -> Task:
    role, index = name.rsplit("-", 1)
    launch = TaskLaunch(name, role, int(index), "localhost", "localhost:1", True, ("true",), {}, "/")
    record = Task(launch, process=FakeProcess(name, CLOCK))
    record.to(TaskState.RUNNING, START)
    if state is not TaskState.RUNNING:
        record.to(state, START)
    return record


class Cluster:
    """Task files tailed by a running pump, a fake clock, and watchdogs made on demand."""

    def __init__(self, folder: Path, console: Console):
        global CLOCK
        self.folder = folder
        self.clock = CLOCK = FakeClock()
        self.events: list[str] = []
        self.pump = OutputPump(folder / "merged.log", folder / "metrics.jsonl", console, log_max_size=LOG_MAX_SIZE, interval=0.002,
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
        """Append lines to a task's file, as a transport does (the pump reads it when told), and return
        once the pump has read them all."""
        WRITING.get(str(self.path(name, attempt))).write("".join(line + "\n" for line in lines).encode())
        self.lines += len(lines)
        wait_for(self._all_read, timeout=10, interval=0.002, message=f"the pump to read {name}'s output")

    def _all_read(self) -> bool:
        merged = self.folder / "merged.log"
        if merged.exists() and merged.read_bytes().count(b"\n") >= self.lines:
            return True
        if not self.pump._thread.is_alive():
            pytest.fail("the output pump's thread died", pytrace=False)
        return False

    def run(self, watchdog: Watchdog, tasks: list[Task], seconds: float, busy: dict[str, float] | None = None,
            waiting: dict[str, float] | None = None) -> Trip | None:
        """Ask the watchdog every second for ``seconds`` (and once at the end) while every task's agent
        reports a reading each second: ``busy`` tasks use that share of a core, the others 1 %;
        ``waiting`` tasks wait for a CPU that share of the time."""
        busy, waiting = busy or {}, waiting or {}
        left = seconds
        while True:
            step = min(1.0, left)
            self.clock.advance(step)
            left -= step
            for record in tasks:
                record.process.cpu += step * busy.get(record.name, 0.01)
                record.process.waited += step * waiting.get(record.name, 0.0)
            trip = watchdog(tasks)
            if trip is not None or left <= 0:
                return trip

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
    assert cluster.run(watchdog, tasks, seconds=25) is None  # exactly 30 s: not yet over
    assert cluster.run(watchdog, tasks, seconds=0.5) == Trip(
        "start timeout: worker-1 made no training progress within 30 s (no metric line, and under 10% of a "
        "core used or waited for over its last 15 s: the cluster never formed)", ("worker-1",))
    assert cluster.events == []  # the supervisor announces the trip; the start watchdog adds nothing


def test_start_timeout_counts_a_silent_trainer_that_works_as_progress(cluster):
    # A Keras script that prints no metric lines, training on every worker: busy, so formed.
    watchdog, tasks = cluster.workers(2, start_timeout=20)
    assert cluster.run(watchdog, tasks, seconds=25, busy={"worker-0": 0.9, "worker-1": 0.12}) is None
    assert watchdog.formed
    # Later quiet is the hang rule's to judge (none armed here), not the start rule's.
    assert cluster.run(watchdog, tasks, seconds=600) is None


def test_a_silent_trainer_that_waits_for_a_cpu_others_keep_busy_works_for_both_rules(cluster):
    # On a machine whose cores others keep busy, a computing task gets 5 % of one and waits for it
    # the rest of the time: it wants to run, where a task that waits for its peers sleeps.
    watchdog, tasks = cluster.workers(2, start_timeout=20, hang_timeout=30)
    starved = {"worker-0": 0.05, "worker-1": 0.05}
    assert cluster.run(watchdog, tasks, seconds=25, busy=starved, waiting={"worker-0": 0.9, "worker-1": 0.9}) is None
    assert watchdog.formed
    assert cluster.run(watchdog, tasks, seconds=60, busy=starved, waiting={"worker-1": 0.5}) is None
    # The same CPU without the waiting is a hang.
    trip = cluster.run(watchdog, tasks, seconds=35, busy=starved)
    assert trip is not None and "no training progress" in trip.reason


def test_start_timeout_does_not_count_the_cpu_of_starting_up(cluster):
    # Both import TensorFlow (busy for 8 s), then worker-1 waits for a peer that never comes.
    watchdog, tasks = cluster.workers(2, start_timeout=20)
    cluster.metric("worker-0")
    assert cluster.run(watchdog, tasks, seconds=8, busy={"worker-1": 1.0}) is None
    trip = cluster.run(watchdog, tasks, seconds=13)
    assert trip is not None and trip.tasks == ("worker-1",)
    assert not watchdog.formed


def test_start_timeout_with_a_hang_timeout_keeps_the_readings_its_window_needs(cluster):
    # The hang window (4 s) is shorter than the start rule's (15 s): worker-1 busy in between counts.
    watchdog, tasks = cluster.workers(2, start_timeout=30, hang_timeout=4)
    cluster.metric("worker-0")
    assert cluster.run(watchdog, tasks, seconds=20, busy={"worker-1": 0.5}) is None
    assert cluster.run(watchdog, tasks, seconds=11, busy={"worker-1": 0.5}) is None
    assert watchdog.formed


@pytest.mark.parametrize("readings, now, verdict", [
    ({"worker-1": ()}, 20.0, None),  # not yet past the timeout
    ({"worker-1": ((10.0, 1.0), (20.5, 1.1))}, 20.5, ["worker-1"]),  # 1 % of a core over the second half
    ({"worker-1": ((10.0, 1.0), (20.5, 3.0))}, 20.5, []),  # 19 %: it works
    ({"worker-1": ((20.5, 1.0),)}, 20.5, None),  # one reading: cannot tell yet
    ({"worker-1": ()}, 25.0, None),  # never sampled: metrics alone only after the grace
    ({"worker-1": ()}, 30.5, ["worker-1"]),
    ({"worker-0": ((10.0, 1.0), (20.5, 9.0)), "worker-1": ((10.0, 1.0), (20.5, 1.0))}, 20.5, ["worker-1"]),
])
def test_never_formed_judges_the_silent_trainers_by_their_cpu(readings, now, verdict):
    assert never_formed(readings, now, since=0.0, timeout=20.0) == verdict


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
    trip = cluster.run(watchdog, [task("worker-0")], seconds=11)
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
    trip = cluster.run(watchdog, [task("chief-0"), task("evaluator-0")], seconds=10.5, busy={"evaluator-0": 1.0})
    assert trip.tasks == ("chief-0",)


# -- hang timeout ----------------------------------------------------------------------------------

STACKS = Path(__file__).resolve().parents[2] / "fixtures" / "stacks"


def stalled_workers(cluster, count: int = 3, hang: float = 10) -> tuple[Watchdog, list[Task]]:
    """Workers whose stacks are real ones of an MWMS input stall (worker-2's generator sleeps)."""
    watchdog, tasks = cluster.workers(count, hang_timeout=hang)
    for record in tasks:
        record.process.text = (STACKS / "input-stall" / f"{record.name}.txt").read_text()
    return watchdog, tasks


def test_a_lone_hung_task_is_one_task_in_the_reason(cluster):
    watchdog, tasks = stalled_workers(cluster, count=1)
    trip = cluster.run(watchdog, tasks, seconds=11)
    assert trip.reason.endswith(f"stack traces of 1 task in {cluster.folder / 'attempt-1' / 'stacks'}"), trip.reason


def test_a_cluster_without_progress_is_declared_hung_and_the_odd_task_named(cluster):
    watchdog, tasks = stalled_workers(cluster)
    cluster.clock.advance(4)
    cluster.metric("worker-1")
    assert cluster.run(watchdog, tasks, seconds=10) is None  # 10 s since the last metric: not yet over
    trip = cluster.run(watchdog, tasks, seconds=1)
    stacks = cluster.folder / "attempt-1" / "stacks"
    assert trip.tasks == ("worker-2",)
    assert trip.reason.startswith("hang timeout: no training progress for 10 s; worker-2 differs from the rest: "
                                  "thread 11825 in slow_source (mwms_hang.py:51); worker-0 and worker-1 are at: "
                                  "MainThread in quick_execute (tensorflow/python/eager/execute.py:53)"), trip.reason
    assert trip.reason.endswith(f"stack traces of 3 tasks in {stacks}")
    assert cluster.events == ["no training progress from any task for 10 s (no new metric line, under 10% of a "
                              "core used or waited for): sampling every task's stacks"]
    assert sorted(p.name for p in stacks.iterdir()) == ["verdict.json", "worker-0.txt", "worker-1.txt", "worker-2.txt"]
    assert (stacks / "worker-2.txt").read_text() == tasks[2].process.text
    filed = json.loads((stacks / "verdict.json").read_text())
    assert filed["verdict"] == "culprit" and filed["hang_timeout"] == 10
    assert filed["culprits"][0]["threads"][0] == {
        "thread": "thread 11825", "function": "slow_source", "file": "mwms_hang.py", "line": 51,
        "innermost": "slow_source (mwms_hang.py:51)", "code": "user"}
    assert all(share is not None and share < 0.1 for share in filed["cpu_share"].values())
    cause = watchdog.root_cause
    assert (cause.task, cause.host, cause.exit_code) == ("worker-2", "localhost", None)
    assert cause.diagnosis["rule"] == "hang" and cause.diagnosis["evidence"]["culprits"][0]["task"] == "worker-2"


def test_ended_tasks_are_neither_watched_nor_sampled(cluster):
    watchdog, tasks = stalled_workers(cluster)
    tasks[1] = task("worker-1", TaskState.SUCCEEDED)
    trip = cluster.run(watchdog, tasks, seconds=11)
    assert trip is not None
    assert sorted(p.name for p in watchdog.stacks_dir.iterdir()) == ["verdict.json", "worker-0.txt", "worker-2.txt"]


def test_a_stuck_task_that_keeps_logging_does_not_hide_the_hang(cluster):
    watchdog, tasks = stalled_workers(cluster)
    for second in range(10):
        cluster.clock.advance(1)
        cluster.write("worker-2", f"waiting for the barrier file, retry {second}")
        assert cluster.run(watchdog, tasks, seconds=0) is None
    assert cluster.run(watchdog, tasks, seconds=1).tasks == ("worker-2",)


def test_steady_metric_lines_keep_the_hang_timeout_quiet(cluster):
    watchdog, tasks = stalled_workers(cluster)
    for step in range(20):  # 160 s where one task or another reports a step every 8 s, with no CPU to show
        assert cluster.run(watchdog, tasks, seconds=8) is None, step
        cluster.metric(f"worker-{step % 3}", epoch=step)
    assert cluster.events == []


def test_a_task_computing_without_printing_is_not_hung(cluster):
    watchdog, tasks = stalled_workers(cluster)
    assert cluster.run(watchdog, tasks, seconds=120, busy={"worker-0": 0.5}) is None
    assert cluster.run(watchdog, tasks, seconds=120, busy={"worker-0": 0.11}) is None  # just above 10 % of a core
    assert cluster.events == []


def test_parameter_servers_and_evaluators_are_not_watched(cluster):
    names = ["chief-0", "worker-0", "ps-0", "evaluator-0"]
    cluster.follow(*names)
    watchdog = cluster.watchdog(["chief-0"], hang_timeout=10)
    tasks = [task(name) for name in names]
    # Busy ps and evaluator tasks do not count as progress of the training...
    assert cluster.run(watchdog, tasks, seconds=11, busy={"ps-0": 1.0, "evaluator-0": 1.0}) is not None
    # ...and a cluster of only those is never declared hung.
    idle = cluster.watchdog(["chief-0"], hang_timeout=10)
    assert cluster.run(idle, tasks[2:], seconds=60) is None


def test_hang_timeout_counts_from_the_attempts_start(cluster):
    cluster.follow("worker-0")
    cluster.metric("worker-0")
    cluster.clock.advance(100)  # e.g. the restart delay: silence before this attempt is not a hang
    watchdog = cluster.watchdog(["worker-0"], hang_timeout=10)
    tasks = [task("worker-0")]
    assert cluster.run(watchdog, tasks, seconds=10) is None
    assert cluster.run(watchdog, tasks, seconds=1) is not None


def test_metrics_of_an_earlier_attempt_are_not_progress(cluster):
    cluster.follow("worker-0", attempt=1)
    cluster.follow("worker-0", attempt=2)
    watchdog = cluster.watchdog(["worker-0"], attempt=2, hang_timeout=10)
    tasks = [task("worker-0")]
    cluster.clock.advance(5)
    cluster.metric("worker-0", attempt=1)
    assert cluster.run(watchdog, tasks, seconds=6) is not None


def test_a_task_restarted_in_place_starts_its_cpu_count_over(cluster):
    watchdog, tasks = cluster.workers(1, hang_timeout=10)
    process = tasks[0].process
    process.cpu = 500.0  # what the process before it used; the new one's readings count from zero
    assert cluster.run(watchdog, tasks, seconds=3) is None
    process.pid, process.cpu = 4712, 0.0
    assert cluster.run(watchdog, tasks, seconds=11, busy={"worker-0": 0.5}) is None  # busy, not hung


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
        # metrics.jsonl is written just after merged.log, which is what write() waited on.
        wait_for(lambda: len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 10, timeout=10,
                 message="metrics.jsonl's 10 lines")
    finally:
        cluster.close()
