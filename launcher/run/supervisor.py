"""Supervision of one attempt: start every task, watch them, and stop them all by one protocol.

Task states and their transitions (``Task.to`` is the only place a state changes)::

    PENDING --started--> RUNNING --exit 0--> SUCCEEDED
       |                    |----exit != 0, signal, lost host--> FAILED
       |--could not start--> FAILED
       |                    '----ended after tflaunch asked it to stop--> STOPPED
       '--never started (run stopped first)--> STOPPED

Run policy:
- the first task to fail is the root cause; every other task is stopped and the attempt fails
  with the root cause's exit code (128+N for signal N);
- with ``ps`` tasks the chief decides: once it exits 0 the ps and worker tasks (blocked in
  ``server.join()``) are stopped and the attempt succeeds; otherwise the attempt succeeds when
  every chief and worker exited 0 (an evaluator still running is then stopped);
- SIGINT/SIGTERM to tflaunch stop every task; the attempt ends as interrupted (exit 130/143).

Shutdown protocol: SIGTERM to each task's process group, one monotonic deadline for all (the
``grace``; at most ``failure_grace`` when a task's failure triggered it), SIGKILL to whatever is
left, reap, then a final SIGKILL to every group for leftovers.
"""

from __future__ import annotations

import enum
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ..cluster.plan import TaskLaunch
from ..transports.base import ExitStatus, TaskProcess, Transport


class TaskState(enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"

    @property
    def ended(self) -> bool:
        return self in (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.STOPPED)


_ALLOWED = {
    TaskState.PENDING: {TaskState.RUNNING, TaskState.FAILED, TaskState.STOPPED},
    TaskState.RUNNING: {TaskState.SUCCEEDED, TaskState.FAILED, TaskState.STOPPED},
}


class Outcome(enum.Enum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


class Interrupted(Exception):
    """tflaunch received SIGINT or SIGTERM."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass
class Task:
    """One task's live record: its launch, its process, its state and its history."""

    launch: TaskLaunch
    log_path: str = ""
    state: TaskState = TaskState.PENDING
    process: TaskProcess | None = None
    status: ExitStatus | None = None
    started_at: float | None = None
    ended_at: float | None = None
    stop_requested: bool = False
    history: list[tuple[str, float]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.launch.name

    def to(self, state: TaskState, when: float) -> None:
        if state not in _ALLOWED.get(self.state, set()):
            raise RuntimeError(f"{self.name}: illegal transition {self.state.value} -> {state.value}")
        self.state = state
        self.history.append((state.value, when))
        if state is TaskState.RUNNING:
            self.started_at = when
        elif state.ended:
            self.ended_at = when


@dataclass(frozen=True)
class Trip:
    """A watchdog's verdict: stop the attempt, blaming these tasks."""

    reason: str
    tasks: tuple[str, ...] = ()


WATCHDOG_EXIT = 124  # as timeout(1) reports a command it had to stop


@dataclass
class AttemptResult:
    outcome: Outcome
    exit_code: int
    tasks: list[Task]
    root_cause: Task | None = None
    signal: int | None = None  # the signal that interrupted tflaunch
    reason: str = ""
    blamed: tuple[str, ...] = ()  # tasks a watchdog stopped the attempt for


@dataclass
class SupervisorOptions:
    grace: float = 5.0  # seconds between SIGTERM and SIGKILL
    # After a task failed, survivors get at most this long: the collective is broken, so they
    # cannot save together, and TensorFlow's preemption handler makes MWMS programs swallow SIGTERM.
    failure_grace: float = 1.0
    poll_interval: float = 0.02
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep


class Supervisor:
    """Runs one attempt of a planned cluster to its end."""

    def __init__(self, launches: Sequence[TaskLaunch], transport_for: Callable[[TaskLaunch], Transport],
                 open_output: Callable[[TaskLaunch], tuple[int, str]], on_event: Callable[[str], None],
                 options: SupervisorOptions | None = None,
                 watchdog: Callable[[list[Task]], Trip | None] | None = None,
                 on_change: Callable[[list[Task]], None] | None = None):
        self.tasks = [Task(launch) for launch in launches]
        self.transport_for = transport_for
        self.open_output = open_output
        self.on_event = on_event
        self.options = options or SupervisorOptions()
        self.watchdog = watchdog  # returns a Trip to stop the attempt, or None
        self.on_change = on_change  # called after tasks start and after any task's state changes
        self.has_ps = any(t.launch.role == "ps" for t in self.tasks)
        self._hurry = False

    # -- the attempt --------------------------------------------------------------------

    def run(self) -> AttemptResult:
        restore = self._install_signal_handlers()
        try:
            self._start_all()
            self._changed()
            return self._watch()
        except Interrupted as interrupt:
            self.on_event(f"received {interrupt}: stopping every task")
            self._shutdown()
            return AttemptResult(Outcome.INTERRUPTED, 128 + interrupt.signum, self.tasks,
                                 signal=interrupt.signum, reason=f"interrupted by {interrupt}")
        finally:
            self._shutdown()
            restore()

    def _start_all(self) -> None:
        for task in self.tasks:
            fd, task.log_path = self.open_output(task.launch)
            try:
                task.process = self.transport_for(task.launch).start(task.launch, fd)
            finally:
                os.close(fd)  # the child (or ssh client) holds its own copy
            task.to(TaskState.RUNNING, self.options.wall())

    def _changed(self) -> None:
        if self.on_change:
            self.on_change(self.tasks)

    def _watch(self) -> AttemptResult:
        while True:
            if any([self._poll(t) for t in self.tasks if t.state is TaskState.RUNNING]):
                self._changed()
            failed = [t for t in self.tasks if t.state is TaskState.FAILED]
            if failed:
                root = min(failed, key=lambda t: (t.ended_at or 0.0))
                self.on_event(f"{root.name} on {root.launch.host} failed ({root.status.describe()}): stopping the cluster")
                self._shutdown(min(self.options.grace, self.options.failure_grace))
                return AttemptResult(Outcome.FAILED, root.status.shell_code, self.tasks, root_cause=root,
                                     reason=f"{root.name} {root.status.describe()}")
            if self._training_done():
                self._shutdown()
                return AttemptResult(Outcome.SUCCEEDED, 0, self.tasks)
            if self.watchdog:
                trip = self.watchdog(self.tasks)
                if trip:
                    self.on_event(f"{trip.reason}: stopping the cluster")
                    self._shutdown()
                    return AttemptResult(Outcome.FAILED, WATCHDOG_EXIT, self.tasks, reason=trip.reason,
                                         blamed=trip.tasks)
            self.options.sleep(self.options.poll_interval)

    def _training_done(self) -> bool:
        if self.has_ps:
            deciders = [t for t in self.tasks if t.launch.role == "chief"]
        else:
            deciders = [t for t in self.tasks if t.launch.role in ("chief", "worker")]
        return all(t.state is TaskState.SUCCEEDED for t in deciders)

    def _poll(self, task: Task) -> bool:
        """Reap ``task`` if it ended; True when it did."""
        assert task.process is not None
        status = task.process.poll()
        if status is None:
            return False
        task.status = status
        if task.stop_requested:
            task.to(TaskState.STOPPED, self.options.wall())
        elif status.ok:
            task.to(TaskState.SUCCEEDED, self.options.wall())
        else:
            task.to(TaskState.FAILED, self.options.wall())
        return True

    # -- shutdown -----------------------------------------------------------------------

    def _shutdown(self, grace: float | None = None) -> None:
        """The one shutdown protocol; safe to call more than once."""
        running = [t for t in self.tasks if t.state is TaskState.RUNNING]
        for task in self.tasks:
            if task.state is TaskState.PENDING:
                task.to(TaskState.STOPPED, self.options.wall())
        for task in running:
            task.stop_requested = True
            task.process.terminate()
        grace = self.options.grace if grace is None else grace
        deadline = self.options.clock() + grace
        while running and self.options.clock() < deadline and not self._hurry:
            running = [t for t in running if not self._poll(t)]
            if running:
                self.options.sleep(self.options.poll_interval)
        for task in running:
            task.process.kill()
        reap_deadline = self.options.clock() + max(5.0, grace)
        while running:
            running = [t for t in running if not self._poll(t)]
            if running and self.options.clock() > reap_deadline:
                for task in running:  # cannot happen for local tasks; a wedged transport at worst
                    task.status = ExitStatus(error="did not exit after SIGKILL")
                    task.to(TaskState.STOPPED, self.options.wall())
                break
            if running:
                self.options.sleep(self.options.poll_interval)
        for task in self.tasks:
            if task.process is not None:
                task.process.cleanup()
        self._changed()

    # -- signals ------------------------------------------------------------------------

    def _install_signal_handlers(self) -> Callable[[], None]:
        if threading.current_thread() is not threading.main_thread():
            return lambda: None

        def handler(signum: int, frame: object) -> None:
            if any(t.stop_requested for t in self.tasks):
                self._hurry = True  # a second signal while stopping: skip the grace period
                return
            raise Interrupted(signum)

        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}

        def restore() -> None:
            for sig, old in previous.items():
                signal.signal(sig, old)

        return restore
