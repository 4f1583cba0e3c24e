"""The supervisor's policy on a fake transport and a fake clock: no processes, milliseconds per test.

Each fake task follows a script: it ends with a given status at a given time on the fake clock,
or runs until it is signalled (and then ends after its own "stop delay", or never, to exercise
SIGKILL). What the supervisor does is exactly what it does with real processes; only time and
processes are simulated. Real-process behaviour is in test_run_local.py and test_faults.py.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

import pytest

from launcher.cluster.plan import TaskLaunch
from launcher.cluster.spec import DEFAULT_TASK_RESTARTS, RestartPolicy
from launcher.options import RunOptions
from launcher.run.lifecycle.signals import Signals
from launcher.records.states import Outcome, TaskState
from launcher.run.lifecycle.supervisor import Pacing, Supervisor
from launcher.run.lifecycle.task import Trip
from launcher.transports.base import ExitStatus

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Script:
    """How one start of a fake task behaves."""

    ends_at: float | None = None  # ends on its own at this clock time (None: runs until stopped)
    status: ExitStatus = field(default_factory=lambda: ExitStatus(code=0))
    stop_delay: float | None = 0.0  # after SIGTERM it ends this much later (None: ignores SIGTERM)
    # It had ended on its own with this status just before the SIGTERM; the report came after it.
    ended_first: ExitStatus | None = None
    leftovers: tuple[str, ...] = ()


class FakeProcess:
    def __init__(self, clock: Clock, script: Script, started: float):
        self.clock, self.script, self.pid = clock, script, 1000
        self.ends_at = None if script.ends_at is None else max(script.ends_at, started)
        self.final: ExitStatus | None = None if script.ends_at is None else script.status
        self.signals: list[int] = []
        self.cleaned = False
        self.leftovers: tuple[str, ...] = ()

    def poll(self) -> ExitStatus | None:
        if self.ends_at is not None and self.clock() >= self.ends_at:
            return self.final
        return None

    def _end(self, at: float, status: ExitStatus) -> None:
        if self.ends_at is None or at < self.ends_at:
            self.ends_at, self.final = at, status

    def terminate(self) -> None:
        self.signals.append(signal.SIGTERM)
        if self.script.ended_first is not None:
            self._end(self.clock(), self.script.ended_first)
        elif self.script.stop_delay is not None:
            self._end(self.clock() + self.script.stop_delay, ExitStatus(signal=signal.SIGTERM, termed=True))

    def kill(self) -> None:
        self.signals.append(signal.SIGKILL)
        self._end(self.clock(), ExitStatus(signal=signal.SIGKILL, termed=True))

    def cleanup(self) -> None:
        self.cleaned = True
        self.leftovers = self.script.leftovers

    def dump_stacks(self, timeout: float = 10.0) -> str:
        return ""


class FakeTransport:
    """Starts fake processes from per-task scripts; a list of scripts is used one per start."""

    def __init__(self, clock: Clock, scripts: dict[str, Script | list[Script] | Exception]):
        self.clock, self.scripts = clock, scripts
        self.started: list[str] = []
        self.processes: dict[str, list[FakeProcess]] = {}

    def start(self, launch: TaskLaunch, log_path: str) -> FakeProcess:
        script = self.scripts.get(launch.name, Script())
        if isinstance(script, Exception):
            raise script
        if isinstance(script, list):
            script = script[min(len(self.processes.get(launch.name, [])), len(script) - 1)]
        self.started.append(launch.name)
        process = FakeProcess(self.clock, script, self.clock())
        self.processes.setdefault(launch.name, []).append(process)
        return process


def launch(name: str) -> TaskLaunch:
    role, _, index = name.rpartition("-")
    return TaskLaunch(name=name, role=role, index=int(index), host="localhost", address="localhost:1",
                      local=True, argv=("task",), env={}, workdir="/")


def supervise(names, scripts, clock=None, signals=None, watchdog=None, restart_policy=None,
              task_restarts=DEFAULT_TASK_RESTARTS, failure_grace=1.0, **options):
    """``options``: the run options (grace, evaluator_timeout); the rest as a cluster file would set them."""
    clock = clock or Clock()
    transport = FakeTransport(clock, scripts)
    events: list[str] = []

    pacing = Pacing(failure_grace=failure_grace, clock=clock, wall=clock, sleep=clock.sleep)
    supervisor = Supervisor([launch(n) for n in names], lambda _l: transport, lambda _l: "/dev/null", events.append,
                            RunOptions(**options), restart_policy or {}, task_restarts, pacing,
                            watchdog=watchdog, signals=signals)
    result = supervisor.run()
    return result, {t.name: t for t in result.tasks}, transport, events, clock


def test_every_worker_exits_zero_and_the_attempt_succeeds():
    result, tasks, _, _, _ = supervise(["worker-0", "worker-1"], {"worker-0": Script(1.0), "worker-1": Script(2.0)})
    assert result.outcome is Outcome.SUCCEEDED and result.exit_code == 0
    assert {t.state for t in tasks.values()} == {TaskState.SUCCEEDED}


def test_the_earliest_failure_is_the_root_cause_and_the_rest_are_stopped_within_the_failure_grace():
    scripts = {"worker-0": Script(), "worker-1": Script(2.0, ExitStatus(code=3)), "worker-2": Script(3.0, ExitStatus(code=4))}
    result, tasks, transport, _, clock = supervise(["worker-0", "worker-1", "worker-2"], scripts, grace=5.0,
                                                   failure_grace=1.0)
    assert result.outcome is Outcome.FAILED and result.exit_code == 3 and result.root_cause.name == "worker-1"
    assert tasks["worker-0"].state is TaskState.STOPPED and tasks["worker-2"].state is TaskState.STOPPED
    assert transport.processes["worker-0"][0].signals == [signal.SIGTERM]


def test_a_task_ignoring_sigterm_gets_sigkill_when_the_grace_runs_out():
    scripts = {"worker-0": Script(stop_delay=None), "worker-1": Script(1.0, ExitStatus(code=1))}
    result, tasks, transport, _, clock = supervise(["worker-0", "worker-1"], scripts, failure_grace=0.5)
    assert transport.processes["worker-0"][0].signals == [signal.SIGTERM, signal.SIGKILL]
    assert tasks["worker-0"].status == ExitStatus(signal=signal.SIGKILL)
    assert 1.5 <= clock.now < 1.7  # failure at 1.0 s, SIGKILL when the 0.5 s grace ended


def test_with_ps_tasks_the_chief_decides_and_ps_and_workers_are_stopped():
    scripts = {"chief-0": Script(2.0), "worker-0": Script(), "ps-0": Script()}
    result, tasks, _, _, _ = supervise(["chief-0", "worker-0", "ps-0"], scripts)
    assert result.outcome is Outcome.SUCCEEDED
    assert tasks["worker-0"].state is TaskState.STOPPED and tasks["ps-0"].state is TaskState.STOPPED


def test_a_task_that_ended_on_its_own_keeps_its_exit_status_when_the_others_are_stopped():
    scripts = {"chief-0": Script(2.0), "worker-0": Script(2.0), "ps-0": Script()}
    result, tasks, transport, _, _ = supervise(["chief-0", "worker-0", "ps-0"], scripts)
    assert tasks["worker-0"].state is TaskState.SUCCEEDED and tasks["worker-0"].status.ok
    assert transport.processes["worker-0"][0].signals == []


@pytest.mark.parametrize("own, state", [(ExitStatus(code=4), TaskState.FAILED),
                                         (ExitStatus(signal=signal.SIGSEGV), TaskState.FAILED),
                                         (ExitStatus(code=0), TaskState.SUCCEEDED)])
def test_a_task_that_ended_on_its_own_just_before_the_stop_is_not_called_stopped(own, state):
    # Its exit (not one the stop caused: no "termed") was on its way when tflaunch asked it to stop.
    scripts = {"worker-0": Script(1.0, ExitStatus(code=3)), "worker-1": Script(ended_first=own), "worker-2": Script()}
    result, tasks, _, _, _ = supervise(["worker-0", "worker-1", "worker-2"], scripts,
                                       restart_policy={"worker": RestartPolicy.TASK})
    assert result.root_cause.name == "worker-0" and result.exit_code == 3
    assert (tasks["worker-1"].state, tasks["worker-1"].status) == (state, own)
    assert tasks["worker-1"].restarts == 0  # a task ending while the attempt stops is not restarted
    assert tasks["worker-2"].state is TaskState.STOPPED


class ChiefChanges:
    """Changes that report only the chief's end: another task's end is first seen by a later poll."""

    def __init__(self) -> None:
        self.transport: FakeTransport | None = None
        self.told: set[int] = set()

    def fileno(self) -> int:
        return -1

    def take(self) -> list[object]:
        ended = [p for p in self.transport.processes.get("chief-0", []) if p.poll() is not None and id(p) not in self.told]
        self.told.update(id(p) for p in ended)
        return ended


def test_a_task_found_ended_while_the_attempt_stops_is_not_restarted_in_place():
    # worker-0 failed in the same moment as the chief, but only the chief's end woke the
    # supervisor: the stop's first poll finds worker-0 ended. It failed; it is not restarted
    # (a restart then would start a process nobody stops).
    clock, changes = Clock(), ChiefChanges()
    transport = FakeTransport(clock, {"chief-0": Script(1.0, ExitStatus(code=3)),
                                      "worker-0": [Script(1.0, ExitStatus(code=4)), Script()]})
    changes.transport = transport
    pacing = Pacing(clock=clock, wall=clock, sleep=clock.sleep, changes=changes)
    result = Supervisor([launch("chief-0"), launch("worker-0")], lambda _l: transport, lambda _l: "/dev/null",
                        lambda _m: None, RunOptions(), {"worker": RestartPolicy.TASK}, DEFAULT_TASK_RESTARTS,
                        pacing).run()
    tasks = {t.name: t for t in result.tasks}
    assert result.root_cause.name == "chief-0" and clock.now < 5.0
    assert (tasks["worker-0"].state, tasks["worker-0"].status, tasks["worker-0"].restarts) == (
        TaskState.FAILED, ExitStatus(code=4), 0)
    assert len(transport.processes["worker-0"]) == 1


def test_a_worker_with_the_task_policy_restarts_alone_while_the_others_keep_running():
    scripts = {"chief-0": Script(10.0), "ps-0": Script(),
               "worker-0": [Script(3.0, ExitStatus(signal=signal.SIGKILL)), Script()]}
    result, tasks, transport, events, _ = supervise(
        ["chief-0", "worker-0", "ps-0"], scripts, restart_policy={"worker": RestartPolicy.TASK})
    assert result.outcome is Outcome.SUCCEEDED
    assert tasks["worker-0"].restarts == 1 and len(transport.processes["worker-0"]) == 2
    assert transport.started.count("chief-0") == 1 and transport.started.count("ps-0") == 1
    assert any("restarting it alone, in place (restart 1 of 3)" in e for e in events)
    assert [state for state, _ in tasks["worker-0"].history][:3] == ["running", "restarting", "running"]


def test_in_place_restarts_stop_at_the_budget_and_then_fail_the_attempt():
    crash = Script(1.0, ExitStatus(code=9))
    scripts = {"chief-0": Script(100.0), "ps-0": Script(), "worker-0": [crash]}
    result, tasks, transport, events, _ = supervise(["chief-0", "worker-0", "ps-0"], scripts,
                                                    restart_policy={"worker": RestartPolicy.TASK}, task_restarts=2)
    assert result.outcome is Outcome.FAILED and result.root_cause.name == "worker-0" and result.exit_code == 9
    assert len(transport.processes["worker-0"]) == 3  # the first start and two restarts
    assert any("after 2 in-place restarts: no restarts left" in e for e in events)


def test_a_chief_failure_is_never_restarted_in_place_under_the_default_policy():
    scripts = {"chief-0": Script(1.0, ExitStatus(code=2)), "ps-0": Script(), "worker-0": Script()}
    result, _, transport, _, _ = supervise(["chief-0", "worker-0", "ps-0"], scripts,
                                           restart_policy={"worker": RestartPolicy.TASK})
    assert result.outcome is Outcome.FAILED and len(transport.processes["chief-0"]) == 1


def test_an_evaluator_finishing_its_last_evaluation_is_waited_for_and_keeps_its_own_status():
    scripts = {"worker-0": Script(2.0), "evaluator-0": Script(5.0)}
    result, tasks, transport, events, clock = supervise(["worker-0", "evaluator-0"], scripts, evaluator_timeout=10)
    assert result.outcome is Outcome.SUCCEEDED
    assert tasks["evaluator-0"].state is TaskState.SUCCEEDED and transport.processes["evaluator-0"][0].signals == []
    assert "evaluator-0 finished on its own (exit code 0)" in result.notes
    assert 5.0 <= clock.now < 5.1


def test_an_evaluator_still_running_at_the_timeout_is_stopped_and_the_summary_says_so():
    scripts = {"worker-0": Script(2.0), "evaluator-0": Script()}
    result, tasks, _, _, clock = supervise(["worker-0", "evaluator-0"], scripts, evaluator_timeout=3)
    assert result.outcome is Outcome.SUCCEEDED and tasks["evaluator-0"].state is TaskState.STOPPED
    assert any("still running 3 s after training ended: stopped" in n for n in result.notes)
    assert 5.0 <= clock.now < 5.1


def test_an_evaluator_that_fails_after_training_fails_the_attempt():
    scripts = {"worker-0": Script(2.0), "evaluator-0": Script(4.0, ExitStatus(code=1))}
    result, _, _, _, _ = supervise(["worker-0", "evaluator-0"], scripts, evaluator_timeout=10)
    assert result.outcome is Outcome.FAILED and result.root_cause.name == "evaluator-0"


def test_a_start_that_raises_oserror_fails_that_task_with_one_line():
    scripts = {"worker-1": OSError(8, "Exec format error")}
    result, tasks, _, _, _ = supervise(["worker-0", "worker-1"], scripts)
    assert result.outcome is Outcome.FAILED and result.root_cause.name == "worker-1"
    assert tasks["worker-1"].status.describe() == "cannot start 'task': Exec format error"
    assert result.exit_code == 127


def deliver(signals: Signals, signum: int) -> None:
    """A signal arriving during a run: what the installed handler does when armed."""
    signals.armed = True
    signals._handle(signum, None)


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143),
                                          (signal.SIGHUP, 129), (signal.SIGQUIT, 131)])
def test_a_signal_stops_every_task_and_gives_128_plus_n(signum, code):
    signals = Signals()
    clock = Clock()

    def watchdog(tasks):  # the signal lands while the tasks run
        if clock.now >= 1.0 and not signals.received:
            deliver(signals, signum)
        return None

    result, tasks, _, events, _ = supervise(["worker-0", "worker-1"], {}, clock=clock, signals=signals,
                                            watchdog=watchdog)
    assert result.outcome is Outcome.INTERRUPTED and result.exit_code == code
    assert {t.state for t in tasks.values()} == {TaskState.STOPPED}
    assert events[0] == f"received {signal.Signals(signum).name}: stopping every task"


def test_a_signal_that_came_while_the_attempt_was_being_set_up_stops_it_before_any_task_starts():
    signals = Signals()
    deliver(signals, signal.SIGINT)  # after the launch checked for signals, before the supervisor existed
    result, tasks, transport, events, _ = supervise(["worker-0", "worker-1"], {}, signals=signals)
    assert result.outcome is Outcome.INTERRUPTED and result.exit_code == 130
    assert {t.state for t in tasks.values()} == {TaskState.STOPPED} and not transport.processes
    assert events == ["received SIGINT: stopping every task"]


def test_a_second_signal_while_stopping_skips_the_grace():
    signals = Signals()
    clock = Clock()
    scripts = {"worker-0": Script(stop_delay=None)}

    def watchdog(tasks):
        if clock.now >= 1.0 and not signals.received:
            deliver(signals, signal.SIGINT)
        return None

    original_sleep = clock.sleep

    def sleep(seconds):  # the second Ctrl-C comes 0.5 s into the 30 s grace
        original_sleep(seconds)
        if signals.count == 1 and clock.now >= 1.5:
            deliver(signals, signal.SIGINT)

    clock.sleep = sleep
    result, tasks, transport, _, _ = supervise(["worker-0"], scripts, clock=clock, signals=signals,
                                               watchdog=watchdog, grace=30.0)
    assert transport.processes["worker-0"][0].signals == [signal.SIGTERM, signal.SIGKILL]
    assert clock.now < 2.0 and result.exit_code == 130


def test_a_signal_during_the_starts_leaves_the_rest_unstarted_and_stops_the_started_ones():
    signals = Signals()
    clock = Clock()
    names = [f"worker-{i}" for i in range(5)]
    transport = FakeTransport(clock, {})
    original = transport.start

    def start(launch, fd, log_path=None):
        process = original(launch, fd)
        if launch.name == "worker-1":
            deliver(signals, signal.SIGINT)  # lands while worker-1 is being spawned
        return process

    transport.start = start
    import os
    supervisor = Supervisor([launch(n) for n in names], lambda _l: transport,
                            lambda _l: (os.open(os.devnull, os.O_WRONLY), "/dev/null"), lambda e: None,
                            RunOptions(), {}, DEFAULT_TASK_RESTARTS, Pacing(clock=clock, wall=clock, sleep=clock.sleep),
                            signals=signals)
    result = supervisor.run()
    assert result.outcome is Outcome.INTERRUPTED
    assert transport.started == ["worker-0", "worker-1"]
    assert all(p.signals[0] == signal.SIGTERM for n in ("worker-0", "worker-1") for p in transport.processes[n])
    assert {t.state for t in result.tasks} == {TaskState.STOPPED}


def test_a_watchdog_trip_fails_the_attempt_with_its_exit_code():
    trip = Trip("cannot write the run's logs: /x: No space left on device", exit_code=1)
    result, _, _, _, _ = supervise(["worker-0"], {}, watchdog=lambda tasks: trip)
    assert result.outcome is Outcome.FAILED and result.exit_code == 1 and result.reason.startswith("cannot write")


def test_leftovers_reported_by_the_transport_are_kept_on_the_task():
    scripts = {"worker-0": Script(1.0, leftovers=("sleep (pid 4711)",))}
    _, tasks, transport, _, _ = supervise(["worker-0"], scripts)
    assert transport.processes["worker-0"][0].cleaned
    assert tasks["worker-0"].leftovers == ("sleep (pid 4711)",)


def test_illegal_transitions_are_refused():
    result, tasks, _, _, _ = supervise(["worker-0"], {"worker-0": Script(1.0)})
    with pytest.raises(RuntimeError, match="illegal transition succeeded -> running"):
        tasks["worker-0"].to(TaskState.RUNNING, 0.0)
