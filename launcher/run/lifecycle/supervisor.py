"""Supervision of one attempt: start every task, watch them, and stop them all by one protocol.

Every task moves through the states of :class:`~launcher.records.states.TaskState` (their
transition graph is drawn there); :meth:`.task.Task.to` is the only place a state changes, and every
change is announced to the supervisor's listeners (the session writes run.json from it, the
console redraws its status line).

Run policy:
- by default the first task to fail is the root cause: every other task is stopped and the attempt
  fails with the root cause's exit code (128+N for signal N); the run may then restart the whole
  cluster (see :mod:`launcher.run.lifecycle.session`);
- a role whose restart policy is ``task`` (the default for workers of a ParameterServerStrategy
  cluster, whose coordinator tolerates a worker coming back) is restarted alone, in place, with
  the same launch, while the others keep running, up to ``task_restarts`` times per task;
- with ``ps`` tasks the chief decides: once it exits 0 the ps and worker tasks (blocked in
  ``server.join()``) are stopped and the attempt succeeds; otherwise the attempt succeeds when
  every chief and worker exited 0;
- a running evaluator is then given ``evaluator_timeout`` seconds to finish its last evaluation
  and end on its own before it is stopped;
- a signal to tflaunch (see :mod:`launcher.run.lifecycle.signals`) stops every task; the attempt ends as
  interrupted (exit 128+N: 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP, 131 for SIGQUIT).

Shutdown protocol: reap what already ended, SIGTERM to each remaining task's process group, one
monotonic deadline for all (the ``grace``; at most ``failure_grace`` when a failure triggered it),
SIGKILL to whatever is left, reap, then ``cleanup`` of every task (its leftovers are stopped).

Waiting: the supervisor sleeps until a signal or a task's change of status, and then polls only
the tasks that changed (:mod:`.wakeups` says which, and how long to sleep).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from ...cluster.plan import TaskLaunch
from ...cluster.ranks import deciding_roles
from ...cluster.spec import RestartPolicy
from ...records.states import Role
from ...options import RunOptions
from ...records.exits import signal_name
from ...records.states import AllFinal, Outcome, TaskState, plural
from ...records.trace import tracer
from ...transports.base import CANNOT_START, ExitStatus, FailedStart, Reading, Transport
from .signals import Signals
from .task import AttemptResult, Task, Trip, reason_head
from .wakeups import Changes, Wakeups

log = tracer("supervisor")


@dataclass
class Pacing:
    """How the supervisor waits and how long it gives survivors: its own workings, not run options
    (those come whole, as the run's :class:`~launcher.options.RunOptions`)."""

    # After a task failed, survivors get at most this long: the collective is broken, so they
    # cannot save together, and TensorFlow's preemption handler makes MWMS programs swallow SIGTERM.
    failure_grace: float = 1.0
    # How the supervisor waits (see .wakeups): without ``changes`` it polls every task every
    # ``poll_interval``; with them, the tasks that changed, every task every ``full_poll`` seconds
    # (``full_poll_stopping`` while stopping), and it sleeps at most ``tick``.
    poll_interval: float = 0.02
    changes: Changes | None = None
    tick: float = 0.25
    full_poll: float = 10.0
    full_poll_stopping: float = 0.1
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    sleep: Callable[[float], None] | None = None  # None: wait on the signal pipe (wakes on a signal)


class Supervisor:
    """Runs one attempt of a planned cluster to its end."""

    def __init__(self, launches: Sequence[TaskLaunch], transport_for: Callable[[TaskLaunch], Transport],
                 create_log: Callable[[TaskLaunch], str], message: Callable[[str], None],
                 options: RunOptions, restart_policy: Mapping[str, RestartPolicy], task_restarts: int,
                 pacing: Pacing | None = None,
                 watchdog: Callable[[list[Task]], Trip | None] | None = None,
                 listeners: Sequence[Callable[[list[Task]], None]] = (),
                 signals: Signals | None = None, watch_in: Callable[[], float] | None = None,
                 stopping: Callable[[Task, str], None] | None = None):
        """``options``: the run's (its grace and evaluator timeout); ``restart_policy``: by role
        (CLUSTER where a role has none), each task restarted in place up to ``task_restarts`` times.
        ``watch_in``: seconds until ``watchdog`` next needs a turn (see :class:`.wakeups.Wakeups`);
        None: every ``pacing.tick``. ``stopping(root, text)`` says the message ``text`` that a task's
        failure stops the others (the console folds what they print from then on); by default
        ``message(text)``."""
        self.tasks = [Task(launch) for launch in launches]
        self.transport_for = transport_for
        self.create_log = create_log  # a task's log, made for this start: its path
        self.message = message  # one of tflaunch's own messages, for the console and merged.log
        self.stopping = stopping or (lambda root, text: message(text))
        self.options = options
        self.restart_policy = restart_policy
        self.task_restarts = task_restarts
        self.pacing = pacing or Pacing()
        self.watchdog = watchdog  # returns a Trip to stop the attempt, or None
        self.listeners = tuple(listeners)  # called after tasks start and after any task's state changes
        # Any signal of the run counts, also one that came before this attempt was set up: it
        # stops the attempt before a task starts. A private instance receives nothing: no signals.
        self.signals = signals or Signals()
        self.has_ps = any(t.role == Role.PS for t in self.tasks)
        # Training is done when every chief and worker succeeded (with parameter servers: the chief).
        roles = deciding_roles(self.has_ps)
        self._training_done = AllFinal([t for t in self.tasks if t.role in roles],
                                       lambda t: t.state is TaskState.SUCCEEDED)
        self._notes: list[str] = []
        self._stopping = False  # the attempt is being stopped (see _shutdown)
        self.wakeups = Wakeups(self.tasks, self.pacing.changes, self.pacing.clock, self.pacing.tick,
                               self.pacing.full_poll, watch_in)

    # -- the attempt --------------------------------------------------------------------

    def run(self) -> AttemptResult:
        try:
            self._start_all()
            self._changed()
            result = self._interrupted() or self._watch()
        finally:
            self._shutdown()
        result.notes = self._notes
        return result

    def readings(self) -> dict[str, Reading]:
        """{task: newest resource reading} of the running tasks (safe to call from another thread)."""
        found = {}
        for task in list(self.tasks):
            reading = task.process.reading() if task.state is TaskState.RUNNING and task.process else None
            if reading is not None:
                found[task.name] = reading
        return found

    def _start_all(self) -> None:
        for task in self.tasks:
            if self._signal():
                return  # the rest stay PENDING; the shutdown marks them STOPPED
            self._start(task)
            task.to(TaskState.RUNNING, self.pacing.wall())

    def _start(self, task: Task) -> None:
        """Start (or restart) a task's process; a start that fails becomes a failed process."""
        try:
            task.log_path = self.create_log(task.launch)
        except OSError as exc:
            task.process = FailedStart(f"cannot open its log file: {exc.strerror or exc}")
            return
        try:
            task.process = self.transport_for(task.launch).start(task.launch, task.log_path)
        except OSError as exc:  # exec format error, too many open files, ...
            program = task.launch.argv[0] if task.launch.argv else "?"
            task.process = FailedStart(f"cannot start {program!r}: {exc.strerror or exc}")
        finally:
            if task.process is not None:
                self.wakeups.started(task)

    def _interrupted(self) -> AttemptResult | None:
        signum = self._signal()
        if signum is None:
            return None
        self.message(f"received {signal_name(signum)}: stopping every task")
        self._shutdown()
        return AttemptResult(Outcome.INTERRUPTED, 128 + signum, self.tasks, signal=signum,
                             reason=f"interrupted by {signal_name(signum)}")

    def _signal(self) -> int | None:
        return self.signals.first

    def _changed(self) -> None:
        for listener in self.listeners:
            listener(self.tasks)

    def _watch(self) -> AttemptResult:
        first = True
        while True:
            interrupted = self._interrupted()
            if interrupted:
                return interrupted
            due = [t for t in self.wakeups.due() if t.state is TaskState.RUNNING]
            changed = any([self._poll(t) for t in due])
            if changed or self._pids_learned(due):
                self._changed()
            failed = [t for t in due if t.state is TaskState.FAILED]
            if failed:
                root = min(failed, key=lambda t: (t.ended_at or 0.0))
                log.debug("failed: %s; root cause %s", [t.launch.name for t in failed], root.launch.name)
                self.stopping(root, f"{root.name} on {root.launch.host} failed ({root.status.describe()}): "
                                    "stopping the cluster")
                self._shutdown(min(self.options.grace, self.pacing.failure_grace))
                return AttemptResult(Outcome.FAILED, root.status.shell_code, self.tasks, root_cause=root,
                                     reason=f"{root.name} {root.status.describe()}")
            if (changed or first) and self._training_done():
                return self._finish_evaluators() or AttemptResult(Outcome.SUCCEEDED, 0, self.tasks)
            first = False
            if self.watchdog and self.wakeups.watch_due():
                trip = self.watchdog(self.tasks)
                if trip:
                    log.debug("tripped: %s (blamed %s, exit code %d)", trip.reason, trip.tasks, trip.exit_code)
                    # the details (a hang's verdict) come once: in the restart's message or the summary
                    self.message(f"{reason_head(trip.reason)}: stopping the cluster")
                    self._shutdown()
                    return AttemptResult(Outcome.FAILED, trip.exit_code, self.tasks, reason=trip.reason,
                                         blamed=trip.tasks)
            self._sleep(self.pacing.poll_interval)

    def _sleep(self, seconds: float) -> None:
        if self.pacing.sleep is not None:
            self.pacing.sleep(seconds)
        else:
            self.signals.wait(*self.wakeups.sleep(seconds, watching=self.watchdog is not None))

    def _finish_evaluators(self) -> AttemptResult | None:
        """Training succeeded: let running evaluators end on their own, up to the timeout."""
        evaluators = [t for t in self.tasks if t.role == Role.EVALUATOR and t.state is TaskState.RUNNING]
        if not evaluators:
            return None
        timeout = self.options.evaluator_timeout
        names = ", ".join(t.name for t in evaluators)
        self.message(f"training finished; waiting up to {timeout:g} s for {names} to finish its last evaluation")
        deadline = self.pacing.clock() + timeout
        while evaluators and self.pacing.clock() < deadline:
            interrupted = self._interrupted()
            if interrupted:
                return interrupted
            if any([self._poll(t) for t in self.wakeups.due(evaluators)]):
                self._changed()
            evaluators = [t for t in evaluators if t.state is TaskState.RUNNING]
            if evaluators:
                self._sleep(self.pacing.poll_interval)
        for task in self.tasks:
            if task.role == Role.EVALUATOR and task.status is not None and task.state.ended:
                note = f"{task.name} finished on its own ({task.status.describe()})"
                self._notes.append(note)
                self.message(note)
        for task in evaluators:
            note = f"{task.name} was still running {timeout:g} s after training ended: stopped (see --evaluator-timeout)"
            self._notes.append(note)
            self.message(note)
        failed = [t for t in self.tasks if t.role == Role.EVALUATOR and t.state is TaskState.FAILED]
        if failed:
            root = failed[0]
            self.stopping(root, f"{root.name} on {root.launch.host} failed ({root.status.describe()}): "
                                "stopping the other tasks")
            self._shutdown(min(self.options.grace, self.pacing.failure_grace))
            return AttemptResult(Outcome.FAILED, root.status.shell_code, self.tasks, root_cause=root,
                                 reason=f"{root.name} {root.status.describe()}")
        return None

    def _poll(self, task: Task) -> bool:
        """Reap ``task`` if it ended (or restart it in place); True when its state changed."""
        if task.process is None:
            return False
        status = task.process.poll()
        if status is None:
            return False
        task.status = status
        # Stopped: tflaunch's stop ended it (or its host went with it). A task asked to stop
        # that exited on its own first (in the same moment as the root cause) keeps its own end.
        if task.stop_requested and (status.termed or status.error is not None):
            task.to(TaskState.STOPPED, self.pacing.wall())
        elif status.ok:
            task.to(TaskState.SUCCEEDED, self.pacing.wall())
        elif not self._stopping and self._restarts_in_place(task, status):
            self._restart_in_place(task)
        else:
            task.to(TaskState.FAILED, self.pacing.wall())
        return True

    def _pids_learned(self, tasks: Sequence[Task]) -> bool:
        """Whether the agent of one of ``tasks`` (running) reported its pid since the listeners last heard."""
        learned = False
        for task in tasks:
            if task.state is TaskState.RUNNING and task.process is not None and task.process.pid != task.known_pid:
                task.known_pid = task.process.pid
                learned = True
        return learned

    def _restarts_in_place(self, task: Task, status: ExitStatus) -> bool:
        policy = self.restart_policy.get(task.role, RestartPolicy.CLUSTER)
        if policy is not RestartPolicy.TASK or status.error_code == CANNOT_START and status.error:
            return False
        if task.restarts >= self.task_restarts:
            self.message(f"{task.name} failed again ({status.describe()}) after "
                         f"{plural(task.restarts, 'in-place restart')}: no restarts left for it")
            return False
        return True

    def _restart_in_place(self, task: Task) -> None:
        task.to(TaskState.RESTARTING, self.pacing.wall())
        task.restarts += 1
        note = (f"{task.name} on {task.launch.host} failed ({task.status.describe()}): restarting it alone, "
                f"in place (restart {task.restarts} of {self.task_restarts}); the others keep running")
        self._notes.append(note)
        self.message(note)
        if task.process is not None:
            task.process.cleanup()
            task.leftovers += tuple(task.process.leftovers)
        task.status = None
        self._start(task)
        task.to(TaskState.RUNNING, self.pacing.wall())

    # -- shutdown -----------------------------------------------------------------------

    def _shutdown(self, grace: float | None = None) -> None:
        """The one shutdown protocol; safe to call more than once."""
        self._stopping = True  # from here a task that fails has failed: none is restarted in place
        for task in self.tasks:
            if task.state in (TaskState.PENDING, TaskState.RESTARTING):
                task.to(TaskState.STOPPED, self.pacing.wall())
        # Reap first: a task that already ended on its own keeps its own exit status.
        running = [t for t in self.tasks if t.state is TaskState.RUNNING and not self._poll(t)]
        running = [t for t in running if t.state is TaskState.RUNNING]
        for task in running:
            task.stop_requested = True
            task.process.terminate()
        grace = self.options.grace if grace is None else grace
        deadline = self.pacing.clock() + grace
        stop_signals = self.signals.count
        stopping = self.pacing.full_poll_stopping
        while running and self.pacing.clock() < deadline and not self._hurry(stop_signals):
            ended = {id(t) for t in self.wakeups.due(running, stopping) if self._poll(t)}
            running = [t for t in running if id(t) not in ended]
            if running:
                self._sleep(self.pacing.poll_interval)
        for task in running:
            task.process.kill()
        reap_deadline = self.pacing.clock() + max(5.0, grace)
        while running:
            ended = {id(t) for t in self.wakeups.due(running, stopping) if self._poll(t)}
            running = [t for t in running if id(t) not in ended]
            if running and self.pacing.clock() > reap_deadline:
                for task in running:  # cannot happen for local tasks; a wedged transport at worst
                    task.status = ExitStatus(error="did not exit after SIGKILL")
                    task.to(TaskState.STOPPED, self.pacing.wall())
                break
            if running:
                self._sleep(self.pacing.poll_interval)
        for task in self.tasks:
            if task.process is not None:
                task.process.cleanup()
                found = tuple(task.process.leftovers)
                task.leftovers += tuple(p for p in found if p not in task.leftovers)
        self._changed()

    def _hurry(self, signals_at_start: int) -> bool:
        """A signal that arrived while stopping: skip the rest of the grace period."""
        return self.signals.count > signals_at_start
