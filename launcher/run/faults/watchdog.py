"""Watchdogs for one attempt: a cluster that never forms, and a cluster that hangs.

- start timeout: every training task (the chief with ``ps`` tasks, else the chief and workers)
  must show progress within S seconds of the start (:func:`never_formed`): a metric line (see
  :mod:`launcher.records.metrics`), or, as the hang rule counts it, more than :data:`CPU_SHARE` of
  one core over the timeout's second half, so that a script that prints no metric lines is judged
  by its work. A task's share counts the time it waited for a CPU (its processes' main threads'
  run-queue time) with the time it ran: on a machine whose cores others keep busy, a task that
  computes may get under a tenth of one, yet it wants to run, where a task waiting for its peers
  sleeps and does not. The first half is left out: importing TensorFlow and building a model take seconds
  of CPU even in a cluster that then waits forever for a peer.
  When it trips on a cluster that spans hosts, the mesh probe (:mod:`launcher.run.checks.mesh`) checks,
  while the tasks still hold their ports, that every host reaches every task, and the reason
  names the pairs that cannot connect;
- hang timeout: the attempt hangs when no chief or worker made progress for S seconds
  (:func:`stalled`). A task made progress when it printed a new metric line (any kind: a step,
  an epoch) or when its process tree used (or waited for) more than :data:`CPU_SHARE` of one core over those
  S seconds. Output never counts: a stuck task that keeps logging must not hide the hang, and
  tasks blocked in a collective print nothing and use almost no CPU. ``ps`` tasks and
  evaluators are idle by design and not watched. When it trips, every running task's stacks
  are sampled at once (py-spy through the agents) into ``attempt-<k>/stacks/<task>.txt``, and
  the verdict (:mod:`launcher.run.faults.hang_verdict`: which task differs from the rest, and where) goes
  into the reason, into ``stacks/verdict.json`` and, when a task is to blame, into the run
  record's root cause, before the attempt is stopped.

The supervisor calls the watchdog on every poll; it returns a :class:`Trip` to stop the attempt.
It reads what the output pump saw through the shared :class:`~launcher.run.output.progress.Progress` and each
task's CPU through its agent's readings (:meth:`TaskProcess.reading`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from ...cluster.plan import TaskLaunch
from ...records.files import make_folder, write_atomically
from ...records.folder import STACKS_SUFFIX, VERDICT, iso_time
from ...records.logview import TAIL_LINES, tail_lines
from ...records.record import RootCause
from ...records.states import TaskState, plural
from ...records.trace import tracer
from ..output.progress import Progress
from ..console.chatter import meaningful
from ..lifecycle.task import Task, Trip
from .readings import TaskReadings
from ...cluster.ranks import TRAINING_ROLES, deciding_roles
from ...records.states import Role

log = tracer("watchdog")

if TYPE_CHECKING:
    from .hang_verdict import Verdict

CPU_SHARE = 0.10  # of one core, used or waited for, over the window: below it a task waits for others rather than works
UNSAMPLED_GRACE = 10.0  # seconds past the window after which a task never sampled is judged by metrics alone
DUMP_TIMEOUT = 15.0  # seconds to wait for every task's stacks once a hang is declared


@dataclass(frozen=True)
class Activity:
    """What one running task showed: its newest metric line and its CPU readings."""

    role: str
    last_metric: float | None = None  # when its newest metric line of this attempt came
    cpu: tuple[tuple[float, float], ...] = ()  # (when, CPU seconds its process tree used or waited for so far), oldest first


@dataclass(frozen=True)
class Stall:
    """No watched task progressed over the window: each one's CPU used or waited for over it, in cores
    (None: never sampled)."""

    cpu: Mapping[str, float | None]


def stalled(tasks: Mapping[str, Activity], now: float, since: float, window: float,
            share: float = CPU_SHARE) -> Stall | None:
    """The hang rule: a :class:`Stall` when, over the last ``window`` seconds, no chief or worker
    printed a metric line or used (or waited for) more than ``share`` of a core; None while any did (or cannot
    be judged yet). ``since`` is when the attempt started: it cannot hang in its first window.
    """
    if now - since <= window:
        return None
    start = now - window
    # ps tasks and evaluators wait by design
    watched = {name: activity for name, activity in tasks.items() if activity.role in TRAINING_ROLES}
    if not watched:
        return None
    cpu: dict[str, float | None] = {}
    for name, activity in watched.items():
        if activity.last_metric is not None and activity.last_metric >= start:
            return None
        used = cpu_over(activity.cpu, start, window)
        if used is None and (activity.cpu or now - since <= window + UNSAMPLED_GRACE):
            return None  # not sampled over enough of the window yet: cannot tell
        if used is not None and used > share:
            return None
        cpu[name] = used
    return Stall(cpu)


def never_formed(silent: Mapping[str, Sequence[tuple[float, float]]], now: float, since: float, timeout: float,
                 share: float = CPU_SHARE) -> list[str] | None:
    """The start rule, for the training tasks that printed no metric line yet (``silent``: each one's
    CPU readings, as :class:`Activity` holds them): once ``timeout`` seconds have passed since
    ``since``, those that did not use (or wait for) more than ``share`` of a core over the timeout's second half.
    None before then, or while a task's readings cover too little of that half to tell (a task
    never sampled is judged by metrics alone after :data:`UNSAMPLED_GRACE`); [] when every one worked.
    """
    if now - since <= timeout:
        return None
    window = timeout / 2
    idle = []
    for name, readings in silent.items():
        used = cpu_over(readings, now - window, window)
        if used is None:
            if readings or now - since <= timeout + UNSAMPLED_GRACE:
                return None
        elif used > share:
            continue
        idle.append(name)
    return idle


def cpu_over(readings: Sequence[tuple[float, float]], start: float, window: float) -> float | None:
    """Cores used from ``start`` (or the first reading after it) to the newest reading; None when
    the readings cover less than half the window."""
    if not readings:
        return None
    base = next((r for r in reversed(readings) if r[0] <= start), readings[0])
    last = readings[-1]
    span = last[0] - base[0]
    if span < window / 2:
        return None
    return max(0.0, last[1] - base[1]) / span


@dataclass(frozen=True)
class WatchdogSettings:
    start_timeout: float | None = None
    hang_timeout: float | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.start_timeout or self.hang_timeout)


class Watchdog:
    def __init__(self, settings: WatchdogSettings, progress: Progress, attempt: int, trainers: Sequence[str],
                 stacks_dir: Path, message: Callable[[str], None], clock: Callable[[], float] = time.time,
                 mesh_problems: Callable[[list[TaskLaunch]], list[str]] | None = None):
        self.settings = settings
        self.progress = progress
        self.attempt = attempt
        self.trainers = list(trainers)
        self.stacks_dir = stacks_dir
        self.message = message
        self.clock = clock  # the same clock as the readings' and metric records' times (time.time)
        self.started = clock()
        self.formed = not settings.start_timeout
        self.mesh_problems = mesh_problems or _mesh_problems  # the broken pairs of a live cluster
        self.verdict: Verdict | None = None  # once a hang was declared
        self.root_cause: RootCause | None = None  # the hang's culprit, when one task is to blame
        self._cpu: TaskReadings[float] = TaskReadings(lambda reading: reading.cpu_seconds + reading.waited_seconds)

    def __call__(self, tasks: list[Task]) -> Trip | None:
        now = self.clock()
        if not self.formed:
            trip = self._check_start(tasks, now)
            if trip is not None:
                return trip
        hang = self.settings.hang_timeout
        if not hang:
            return None
        running = [t for t in tasks if t.state is TaskState.RUNNING and t.process is not None]
        activity = {t.name: Activity(t.role, self.progress.last_metric(self.attempt, t.name),
                                     self._readings(t, self._keep_from(now))) for t in running}
        stall = stalled(activity, now, self.started, hang)
        return self.declare(running, stall, hang) if stall else None

    def _check_start(self, tasks: list[Task], now: float) -> Trip | None:
        """The start rule (:func:`never_formed`): sets :attr:`formed` once every training task
        progressed, or trips naming those that did not."""
        timeout = self.settings.start_timeout
        silent = set(self.progress.silent(self.attempt, self.trainers))
        # Their CPU is read on every turn, so that the readings cover the timeout's second half.
        readings = {t.name: self._readings(t, self._keep_from(now)) for t in tasks
                    if t.name in silent and t.state is TaskState.RUNNING and t.process is not None}
        if not silent:
            self.formed = True
            return None
        idle = never_formed({name: readings.get(name, ()) for name in sorted(silent)}, now, self.started, timeout)
        if idle is None:
            return None
        log.debug("start timer (%g s) ended: silent %s, idle %s", timeout, sorted(silent), idle)
        if not idle:
            self.formed = True  # every silent task works: from here on, a stall is the hang rule's
            return None
        missing = [name for name in self.trainers if name in idle]
        reason = (f"start timeout: {', '.join(missing)} made no training progress within {timeout:g} s "
                  f"(no metric line, and under {CPU_SHARE:.0%} of a core used or waited for over its last {timeout / 2:g} s: "
                  "the cluster never formed)")
        return Trip(reason + self.explain_stall(tasks), tuple(missing))

    def _keep_from(self, now: float) -> float:
        """The start of the longest window a rule still reads: readings older than it can go."""
        windows = [self.settings.hang_timeout or 0.0]
        if not self.formed:
            windows.append(self.settings.start_timeout / 2)
        return now - max(windows)

    def _readings(self, task: Task, start: float) -> tuple[tuple[float, float], ...]:
        """The task's CPU readings that the window needs (the newest one before it, and those after)."""
        self._cpu.add(task.name, task.process.reading())
        return self._cpu.trim(task.name, start)

    def declare(self, running: list[Task], stall: Stall, hang: float) -> Trip:
        """A hang: sample every task's stacks at once, compare them, file them, and blame the odd ones out."""
        log.debug("hang timer (%g s) fired: CPU over the window %s", hang, stall.cpu)
        self.message(f"no training progress from any task for {hang:g} s (no new metric line, under "
                     f"{CPU_SHARE:.0%} of a core used or waited for): sampling every task's stacks")
        # Here, not at the top: every run arms the watchdog, and few ever hang.
        from .hang_verdict import sample_stacks, verdict
        from .pyspy import parse_dump

        texts = sample_stacks({t.name: t.process for t in running}, DUMP_TIMEOUT) or {}
        found = verdict({name: parse_dump(text) for name, text in texts.items()}, {t.name: t.role for t in running})
        self.verdict = found
        self.file_stacks(texts, found, stall, hang)
        by_name = {t.name: t for t in running}
        if found.culprits:
            self.root_cause = self.blame(by_name[found.culprits[0].task], found)
        return Trip(f"hang timeout: no training progress for {hang:g} s; {found.summary()}; stack traces of "
                    f"{plural(len(texts), 'task')} in {self.stacks_dir}", found.tasks)

    def file_stacks(self, texts: Mapping[str, str], found: Verdict, stall: Stall, hang: float) -> None:
        """Each task's stacks in ``<task>.txt`` and the verdict in ``verdict.json``; a failed write costs only itself."""
        try:
            make_folder(self.stacks_dir)
            for name, text in texts.items():
                write_atomically(self.stacks_dir / f"{name}{STACKS_SUFFIX}", text)
            detail = {"declared_at": iso_time(self.clock()), "hang_timeout": hang, "cpu_share_limit": CPU_SHARE,
                      "cpu_share": {n: None if v is None else round(v, 4) for n, v in stall.cpu.items()},
                      **found.to_json()}
            write_atomically(self.stacks_dir / VERDICT, json.dumps(detail, indent=2) + "\n")
        except OSError as exc:
            self.message(f"could not file the stacks in {self.stacks_dir}: {exc.strerror or exc}")

    def blame(self, task: Task, found: Verdict) -> RootCause:
        """The run record's root cause for a hang: the first culprit, with the verdict as its evidence."""

        place = found.culprits[0].places[0]
        where = place.user or place.owner
        diagnosis = {"rule": "hang", "summary": found.summary(),
                     "fix": f"look at {where} in {task.name} ({place.thread}): the task stopped there while the "
                            f"others waited for it; every task's stacks are in {self.stacks_dir}",
                     "peer": None, "evidence": found.to_json(), "stacks": str(self.stacks_dir)}
        tail = tail_lines(Path(task.log_path), TAIL_LINES, keep=meaningful()) if task.log_path else []
        return RootCause(task=task.name, host=task.launch.host, tail=tail, diagnosis=diagnosis)

    def explain_stall(self, tasks: list[Task]) -> str:
        """What the mesh probe finds while the tasks hold their ports, as a reason's tail ('' if not run)."""
        launches = [t.launch for t in tasks]
        if all(launch.local for launch in launches):
            return ""  # one machine: no network between its tasks to blame
        self.message("start timeout: probing the mesh (every host to every task's address)")
        try:
            problems = self.mesh_problems(launches)
        except OSError as exc:
            return f"; the mesh probe could not run ({exc})"
        for line in problems:
            self.message(f"mesh: {line}")
        if not problems:
            return "; every host reaches every task's address"
        return f"; the mesh is broken: {'; '.join(problems)}"


def _mesh_problems(launches: list[TaskLaunch]) -> list[str]:
    from ..checks.mesh import stall_problems  # imported here: a local run never needs it

    return stall_problems(launches)


def training_tasks(names_and_roles: Sequence[tuple[str, str]]) -> list[str]:
    """The tasks whose progress shows the cluster formed: the chief with ps tasks, else chief and workers."""
    roles = {role for _, role in names_and_roles}
    wanted = deciding_roles(Role.PS in roles)
    return [name for name, role in names_and_roles if role in wanted]
