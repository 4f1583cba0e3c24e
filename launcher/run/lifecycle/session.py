"""One run from its first attempt to its final run record: attempts, restarts and the record.

A :class:`RunSession` owns the run folder while the run lasts. It plans each attempt, hands it to
a :class:`~.supervisor.Supervisor`, decides whether to restart the whole cluster, and keeps
``run.json`` (a :class:`~launcher.records.record.RunRecord`) true at every step. The record is
made final after the run's cleanups, whatever they do (one ``ExitStack``): whatever ends the run
(success, failure, a signal, a full disk, an unexpected error) leaves a run folder that says how
it ended.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping

from ... import __version__
from ...agent.protocol import sample_for
from ...cluster.plan import Plan, RunContext, TaskLaunch, tf_cluster
from ...cluster.spec import ClusterSpec, restarts_possible
from ...masking import masked_argv, masked_command
from ...errors import EnvironmentProblem
from ...options import RunOptions
from ...records.folder import RunFolder, iso_time
from ...records.folder import BACKUP
from ...records.logview import TAIL_LINES, tail_lines
from ...records.record import AttemptRecord, ExcludedHost, LauncherRecord, RootCause, RunRecord
from ...records.exits import signal_name
from ...records.states import Outcome, RunStatus, plural
from ...records.trace import tracer
from ...transports import TransportSet
from ...transports.base import Reading
from .hostpool import HostPool
from .recovery import Recovery
from .liverecord import LiveRecord, status_fields
from ..output.pump import OutputPump
from ..console.chatter import meaningful
from ..output.resources import ResourceSampler
from .signals import Signals
from ..faults.stragglers import StragglerWatch, look_every, status_words
from ..faults.stacks_server import ControlServer
from .supervisor import Pacing, Supervisor
from .task import AttemptResult, Task, Trip, reason_head
from ..faults.watchdog import Watchdog, WatchdogSettings, training_tasks

if TYPE_CHECKING:
    from ..console.writer import Console
    from ..faults.diagnose import Diagnosis

log = tracer("session")
# What costs a pass over every task is paced by the run's size, so that its cost per second stays
# flat (run.json and the status line: see .liverecord): the output pump sweeps the task logs every
# PUMP_INTERVAL for up to PUMP_TASKS tasks, a larger run's proportionally less often (at most
# PUMP_AT_MOST apart). A run of one host folds its agent's resource samples every second, a run of
# more every time its agents sample (launcher.agent.protocol.sample_for), and writes them 4 paces of
# run.json apart.
PUMP_INTERVAL, PUMP_TASKS, PUMP_AT_MOST = 0.02, 16, 1.0
DISK_FULL_EXIT = 1
# Seconds between the supervisor's turns when nothing waits for one: how soon a full disk stops
# a run that has no hang watchdog (with one, every Pacing.tick).
QUIET_TURN = 1.0


@dataclass
class RunResult:
    run_id: str
    run_dir: Path
    exit_code: int
    attempts: list[AttemptResult]
    root_cause_tail: list[str] = field(default_factory=list)
    diagnosis: Diagnosis | None = None  # the known problem the root cause's output matches
    record: RunRecord | None = None
    error: str | None = None  # the run folder could not be written (full disk, vanished folder): the root cause

    @property
    def final(self) -> AttemptResult:
        return self.attempts[-1]


@dataclass(eq=False)
class RunSession:
    """The state of one run while it executes: its folder, record and attempts."""

    spec: ClusterSpec
    # The run's options over its cluster file's (RunOptions.over_file): max_restarts and
    # restart_delay are set. The same object goes to the supervisor and the transports.
    options: RunOptions
    folder: RunFolder
    console: Console
    # The plan of an attempt's cluster (the whole one, or the one its hosts allow: see .hostpool).
    plan_attempt: Callable[[RunContext, ClusterSpec], Plan]
    signals: Signals
    # One agent per host for the whole run (the preflight may have started them already).
    transports: TransportSet | None = None
    refused_spares: Mapping[str, str] = field(default_factory=dict)  # spare hosts the preflight refused: why
    # Offer the tasks a backup folder even when no restart is allowed (a requeued batch job resumes from it).
    backup: bool = False

    def __post_init__(self) -> None:
        self.started_at = time.time()
        self.attempts: list[AttemptResult] = []
        self.transports = self.transports or TransportSet(self.options)
        self.watchdog = WatchdogSettings(self.options.start_timeout, self.options.hang_timeout)
        self.pump_interval = min(PUMP_AT_MOST, PUMP_INTERVAL * max(1.0, len(self.spec.tasks) / PUMP_TASKS))
        self.record = RunRecord(
            run_id=self.folder.run_id, source=self.spec.source, tflaunch_version=__version__,
            max_restarts=self.options.max_restarts, started_at=iso_time(self.started_at),
            launcher=LauncherRecord(pid=os.getpid(), host=os.uname().nodename, cwd=os.getcwd(),
                                    argv=masked_argv([os.path.basename(sys.argv[0]), *sys.argv[1:]])),
            cluster=tf_cluster(self.spec))
        self.live = LiveRecord(self.record, self.folder, self.console, len(self.spec.tasks))
        self.pool = HostPool(self.spec)
        self.record.excluded += [ExcludedHost(host, f"spare not used: {why}", 1) for host, why in self.refused_spares.items()]
        self.recovery = Recovery(self.spec, self.pool, self.transports, self.plan_attempt,
                                 lambda: RunContext(self.folder.run_id, str(self.folder.path.resolve())),
                                 lambda attempt, names: self.pump.progress.progressed(attempt, names))
        self._excluding: str | None = None  # the host of the straggler that ended the last attempt
        self.lock = self.live.lock  # the record is written from the supervisor and the pump's failure path

    # -- the run --------------------------------------------------------------------------

    def execute(self) -> RunResult:
        """Run every attempt; raises EnvironmentProblem, before any task starts, when run.json cannot be written.

        The run's cleanups are one :class:`contextlib.ExitStack`, the final run.json entered first:
        each cleanup runs whatever the others do, and the record is made final after them all, also
        when one raised (its error then names it, and the exception goes on to the caller)."""
        self.supervisor: Supervisor | None = None
        self.attempt_number = 1
        self.plan = self.whole = self._begin()  # the current attempt's plan; the whole cluster's
        self.pump: OutputPump | None = None
        ending = _Ending()
        with contextlib.ExitStack() as cleanups:
            cleanups.push(lambda kind, exc, tb: self._end(ending, exc))  # entered first: runs last
            self.pump = OutputPump(self.folder.merged_path, self.folder.metrics_path, self.console,
                                   interval=self.pump_interval, log_max_size=self.options.log_max_size).start()
            cleanups.callback(self.pump.close)
            cleanups.callback(self.transports.close)
            self.live.read_out = self.pump.read_out
            hosts = len({task.host for task in self.spec.tasks})
            every = 1.0 if hosts == 1 else sample_for(hosts)

            def readings() -> dict[str, Reading]:  # the current attempt's (a supervisor is only ever replaced)
                return self.supervisor.readings() if self.supervisor else {}

            sampler = ResourceSampler(readings, self.folder.path, interval=every,
                                      write_every=max(2.0, every, 4 * self.live.pace), attempt=lambda: self.attempt_number)
            sampler.start()
            cleanups.callback(sampler.stop)
            control = ControlServer(self.folder, lambda: self.supervisor).start()  # serves 'tflaunch stacks'
            cleanups.callback(control.close)
            try:
                for note in self.plan.notes:
                    self.message(note)
                self.message(f"run {self.folder.run_id}: {plural(len(self.plan.launches), 'task')} from "
                             f"{self.spec.source}; logs in {self.folder.path}")
                ending.result, ending.interrupted = self._attempts(self.plan)
            except OSError as exc:  # the run folder itself failed us (full disk, removed, read-only)
                ending.error = _describe_os_error(exc)
        return RunResult(self.folder.run_id, self.folder.path, ending.exit_code, self.attempts, ending.tail,
                         self.recovery.diagnosis, self.record, ending.error)

    def _end(self, ending: _Ending, exc: BaseException | None) -> bool:
        """The final record, after every cleanup; ``exc`` is what the run or a cleanup raised, if
        anything: the record names it, and it goes on."""
        ending.error = ending.error or self._storage_failure() or (
            f"tflaunch's own error: {type(exc).__name__}: {exc}" if isinstance(exc, Exception) else None)
        ending.exit_code, status = self._outcome(ending.result, ending.interrupted, ending.error)
        root = ending.result.root_cause if ending.result else None
        cause = None
        if root is not None:
            with contextlib.suppress(OSError):
                ending.tail = tail_lines(Path(root.log_path), TAIL_LINES, keep=meaningful())
            known = self.recovery.diagnosis
            cause = RootCause(task=root.name, host=root.launch.host, **status_fields(root), tail=ending.tail,
                              diagnosis=asdict(known) if known else None)
        self.live.finish(self.plan, ending.result.tasks if ending.result else [], status, ending.exit_code,
                         ending.error, cause, self.started_at)
        return False

    def _begin(self) -> Plan:
        """Plan the first attempt and write the first run.json: a run whose record cannot be kept never starts."""
        log.debug("run %s: tflaunch %s, %s, %d tasks, %s", self.folder.run_id, __version__, self.spec.source,
                  len(self.spec.tasks), self.options)
        try:
            plan = self._plan(1)
            self.record.command = shlex.join(masked_command(tuple(plan.launches[0].argv)))
            self.record.notes = list(plan.notes)
            self.record.tasks = self.live.tasks(plan, [])
            try:
                self.folder.write_record(self.record)
                self.live.wrote()
            except OSError as exc:
                raise EnvironmentProblem(f"{self.folder.record_path}: cannot write the run record: "
                                         f"{exc.strerror or exc}; no task was started") from None
        except BaseException:
            self.folder.discard_if_empty()
            raise
        return plan

    def _attempts(self, plan: Plan) -> tuple[AttemptResult, int | None]:
        attempt = 1
        while True:
            self.pump.attempt = attempt
            if attempt > 1:
                plan = self._plan(attempt)
                dropped = set(self.pool.placement.dropped)
                self.live.leave_out([l for l in self.whole.launches if l.name in dropped], attempt)
            self.plan = plan
            log.debug("attempt %d: %d tasks on hosts %s", attempt, len(plan.launches),
                      sorted({launch.host for launch in plan.launches}))
            result = self._attempt(plan, attempt)
            self.attempts.append(result)
            log.debug("attempt %d ended: %s, exit code %d, root cause %s, blamed %s: %s", attempt,
                      result.outcome.value, result.exit_code, result.root_cause.name if result.root_cause else None,
                      list(result.blamed), result.reason)
            if result.outcome is not Outcome.FAILED or attempt > self.options.max_restarts or self._storage_failure():
                return result, None
            alike = self.recovery.failed_alike(result, attempt)
            changed = self._next_cluster(plan, result, attempt + 1)
            if changed is None:
                return result, None
            if alike and not changed:
                self.message(f"attempt {attempt} failed exactly like attempt {attempt - 1} before any training "
                         f"progress ({reason_head(result.reason)}): not restarting")
                return result, None
            self.message(f"attempt {attempt} failed ({result.reason}); restarting the whole cluster in "
                     f"{self.options.restart_delay:g} s (restart {attempt} of {self.options.max_restarts})")
            self.live.write(plan, result.tasks, now=True)
            # Any signal during the run (also one that came while this attempt was stopping) ends it.
            signum = self.signals.wait(self.options.restart_delay)
            if signum is not None:
                self.message(f"received {signal_name(signum)} between attempts: not restarting")
                return result, signum
            attempt += 1

    def _next_cluster(self, plan: Plan, result: AttemptResult, attempt: int) -> bool | None:
        """Before attempt ``attempt``: the hosts it runs on (:mod:`.recovery`), kept in the record and
        said, one line per change. Whether a host was left out or came back; None when no attempt
        can run: the run ends."""
        straggler = None
        if self._excluding:
            straggler = (self._excluding, "left out as the straggler (the others kept waiting for it "
                                          f"for {self.options.straggler_timeout:g} s or more)")
        decision = self.recovery.next_cluster(plan, result, attempt, straggler)
        with self.lock:
            self.record.excluded += [ExcludedHost(out.host, out.reason, attempt) for out in decision.left_out]
            for entry in self.record.excluded:
                if entry.host in decision.rejoined and entry.rejoined is None:
                    entry.rejoined = attempt
        for line in decision.lines:
            self.message(line)
        return None if decision.ends_run else bool(decision.left_out or decision.rejoined)

    def _outcome(self, result: AttemptResult | None, interrupted: int | None,
                 error: str | None) -> tuple[int, RunStatus]:
        if error is not None:
            return DISK_FULL_EXIT if result is None or result.exit_code == 0 else result.exit_code, RunStatus.FAILED
        if interrupted is not None:
            return 128 + interrupted, RunStatus.STOPPED
        if result is None:  # ended before the first attempt: only a signal does that
            signum = self.signals.first
            return (128 + signum if signum else 1), RunStatus.STOPPED
        return result.exit_code, result.outcome.status

    def message(self, text: str) -> None:
        """One of tflaunch's own messages: on the console and in merged.log."""
        self.console.message(text)
        if self.pump is not None:
            self.pump.message(text)

    def _stopping(self, attempt: int, root: Task, text: str) -> None:
        """The message that ``root``'s failure stops the other tasks: the console folds their output from here."""
        self.console.stop_began(attempt, root.name, text)
        self.pump.message(text)

    def _plan(self, attempt: int) -> Plan:
        run_dir = self.folder.path.resolve()
        # With restarts, the trainer backs up into the run folder so a restarted cluster resumes;
        # in-place restarts of ParameterServer workers resume from it too.
        restarts = self.backup or restarts_possible(self.options.max_restarts, self.spec.restart_policy)
        backup = str(run_dir / BACKUP) if restarts else None
        return self.plan_attempt(RunContext(self.folder.run_id, str(run_dir), attempt, backup_dir=backup,
                                            watch_every=None if self.options.on_straggler == "off"
                                            else look_every(self.options.straggler_window)),
                                 self.pool.placement.spec)

    # -- one attempt ----------------------------------------------------------------------

    def _attempt(self, plan: Plan, attempt: int) -> AttemptResult:
        def create_log(launch: TaskLaunch) -> str:
            path = self.folder.create_task_log(launch.name, attempt)
            # Every transport relays a task's output through tflaunch, which writes it to this log.
            self.pump.follow(launch.name, path, attempt, created=True, relayed=True, mode=self.folder.log_mode)
            return path

        watchdog = None
        if self.watchdog.enabled:
            trainers = training_tasks([(l.name, l.role) for l in plan.launches])
            watchdog = Watchdog(self.watchdog, self.pump.progress, attempt, trainers,
                                self.folder.stacks_dir(attempt), self.message,
                                mesh_problems=self._stall_problems)
        stragglers = self._straggler_watch(plan, attempt)
        supervisor = Supervisor(plan.launches, self.transports.for_launch, create_log, self.message, self.options,
                                restart_policy=self.spec.restart_policy, task_restarts=self.spec.task_restarts,
                                pacing=Pacing(changes=self.transports.changes),
                                watchdog=lambda tasks: (self.live.due() or self._check_logging()
                                                        or (watchdog(tasks) if watchdog else None)
                                                        or (stragglers(tasks) if stragglers else None)),
                                listeners=[lambda tasks: self.live.changed(plan, tasks)],
                                signals=self.signals, stopping=lambda root, text: self._stopping(attempt, root, text),
                                # The hang watchdog looks every tick; without it, the next turn comes
                                # when run.json has a change due, else within QUIET_TURN.
                                watch_in=None if watchdog else (lambda: self.live.due_in(QUIET_TURN)))
        self.transports.prepare(plan.launches)
        started = time.time()
        self.supervisor, self.attempt_number, self.live.attempt = supervisor, attempt, attempt
        result = supervisor.run()
        if stragglers is not None:
            stragglers.close()
            self._excluding = stragglers.excluded
        self.record.root_cause = watchdog.root_cause if watchdog else None  # a hang's culprit; a failure's comes last
        # Every task of the attempt has ended: read their files to the end, so that a run folder
        # that could not take their last bytes is known before the attempt is judged.
        self.pump.finish_all()
        failure = self._storage_failure()
        if failure and result.outcome is not Outcome.INTERRUPTED:
            # The tasks' own failures follow from it (a task that cannot write its output dies of that).
            result = AttemptResult(Outcome.FAILED, DISK_FULL_EXIT, result.tasks,
                                   reason=f"cannot write the run folder: {failure}", notes=result.notes)
        for note in result.notes:
            self.pump.message(note)
        known = self.recovery.diagnose(result)
        self.record.attempts.append(AttemptRecord(
            attempt=attempt, started_at=iso_time(started), ended_at=iso_time(time.time()),
            outcome=result.outcome, exit_code=result.exit_code,
            failed_task=result.root_cause.name if result.root_cause else None, reason=result.reason,
            blamed_tasks=list(result.blamed), diagnosis=known.rule if known else None,
            hosts={launch.name: launch.host for launch in plan.launches}))
        return result

    def _straggler_watch(self, plan: Plan, attempt: int) -> StragglerWatch | None:
        """The straggler rule for the attempt, where its training tasks' threads are watched."""
        self._excluding = None
        if not any(launch.watch_every for launch in plan.launches):
            return None
        earlier = list(self.record.stragglers)
        by_name = {launch.name: launch for launch in plan.launches}

        def changed(records: list) -> None:
            with self.lock:
                self.record.stragglers = earlier + records
            self.console.note_status(status_words(records))
            self.live.write(plan, self.supervisor.tasks if self.supervisor else [], now=True)

        def excludable(name: str) -> str | None:
            launch = by_name[name]
            if launch.local:
                return "it runs on this machine, tflaunch's own, which a restart cannot leave out"
            if attempt > self.options.max_restarts:
                return f"no restart is left (max_restarts {self.options.max_restarts})"
            return self.pool.without(launch.host)

        exclude_after = self.options.straggler_timeout if self.options.on_straggler == "exclude" else None
        return StragglerWatch(attempt, {l.name: l.host for l in plan.launches}, self.message, changed,
                              exclude_after=exclude_after, excludable=excludable,
                              warm_up=self.options.straggler_warm_up, window=self.options.straggler_window)

    def _check_logging(self) -> Trip | None:
        """Stop the attempt when the run's files could not be written (a full disk)."""
        failure = self._storage_failure()
        return Trip(f"cannot write the run folder: {failure}", exit_code=DISK_FULL_EXIT) if failure else None

    def _storage_failure(self) -> str | None:
        """``<path>: <reason>`` when the logs or run.json could not be written; None while all is well."""
        with self.lock:
            return (self.pump.failure if self.pump else None) or self.live.failure

    def _stall_problems(self, launches: list[TaskLaunch]) -> list[str]:
        """The broken pairs of the live cluster, probed through the run's own agents."""
        from ..checks.mesh import stall_problems  # imported here: a local run never needs it

        return stall_problems(launches, self.transports)

@dataclass
class _Ending:
    """How the run ended, as the session learns it: kept for its final record."""

    result: AttemptResult | None = None
    interrupted: int | None = None  # the signal that came between attempts
    error: str | None = None  # what ended it from outside its tasks
    exit_code: int = 1
    tail: list[str] = field(default_factory=list)  # the root cause's last lines


def _describe_os_error(exc: OSError) -> str:
    where = f"{exc.filename}: " if exc.filename else ""
    return f"{where}{exc.strerror or exc}"


__all__ = ["RunResult", "RunSession"]
