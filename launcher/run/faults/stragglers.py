"""The straggler rule: the training task the others keep waiting for, named while the run goes on.

In synchronous training (MultiWorkerMirroredStrategy: every step ends in an all-reduce across the
training tasks) a step lasts as long as its slowest task takes, so every task's step time is the
same and cannot tell who holds the others back. What sets the slowest apart is what its threads
do meanwhile. Each training task's host agent watches its threads (the agent's ``ThreadWatch``)
and sends running totals with its resource readings, from which, over the last window of readings
(:data:`WINDOW` seconds):

- ``stall``: how many of its threads sleep on purpose or wait for a disk, on average (an input
  pipeline that sleeps per batch or reads from a slow disk);
- ``gpu``: on a host with NVML, how much slower than its peak clock its slowest GPU ran while
  throttled (a power cap, heat, a hardware slowdown): a slow GPU's task computes longer while
  every thread of it waits for the device, as the others' wait for the network.
- ``cpu``: the share of its CPUs that others took while its threads waited for one (another
  user's program on its cores, other tasks, a hypervisor's other guests), or the share of the time
  its cgroup's CPU quota held it back (the agent's ``CpuShare``).

Each task's figures are compared with the other training tasks' typical figures (see
:func:`shares`); the largest difference estimates the share of each step the others spend
waiting for it (its ``share``), taken over each half of the window and the lesser kept
(:func:`steady_shares`), so that a short burst never stands for a straggler. A task is confirmed a straggler once its share stayed at or above
:data:`CONFIRM_SHARE` for :data:`CONFIRM_PART` of the window while it was one of a clear minority (at most
half of the others show the same), and never in an attempt's warm-up (``--straggler-warm-up``). It
stops being one once its share stayed under :data:`END_SHARE` for :data:`END_PART` of it, or when
its attempt ends. Once one training task ended (the others no longer step together) no new
straggler is named. The rules are pure functions (:func:`figures_over`, :func:`shares`, :func:`steady_shares`); the
:class:`StragglerWatch` keeps the history, says each change in one line and records it.

What it cannot see: a slow link, or a GPU slow for reasons other than its clocks. A task
whose input threads sleep while its prefetch still keeps up is named with the share it would hold
back.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ...cluster.ranks import TRAINING_ROLES
from ...options import STRAGGLER_WINDOW
from ...records.folder import iso_time
from ...records.record import StragglerRecord
from ...records.states import TaskState, clock_text
from ...records.trace import tracer
from ...transports.base import ThreadTimes
from ..lifecycle.task import Task, Trip
from .readings import TaskReadings

log = tracer("stragglers")

# Seconds of readings a task's figures are taken over: each half holds several looks at its threads
# (a tenth of a window apart on average, drawn between half and one and a half of that) and mostly
# a census of its CPU (every five looks: launcher/agent/threads.py); a half without one takes the
# census before it (figures_over).
WINDOW = STRAGGLER_WINDOW  # the default; --straggler-window sets a run's
LOOKS_PER_WINDOW = 10  # the agents' looks at a watched task's threads in a window: 2 s apart by default
CONFIRM_SHARE = 0.2
CONFIRM_PART = 0.75  # of the window: how long a task stands out before it is named
CONFIRM_FOR = CONFIRM_PART * WINDOW
END_SHARE = 0.15
SHARE_DIGITS = 9  # a share's decimals: far finer than any figure, coarser than floating point's error
END_PART = 0.5  # of the window: how long a straggler stays calm before its end is said
END_FOR = END_PART * WINDOW
JUDGE_EVERY = 2.0  # seconds between two judgements at the default window, a tenth of a shorter one
READINGS_EVERY = 1.0  # the readings come every second at the most: judging more often sees nothing new
CAUSES = {"stall": "its threads sleep or wait for a disk (its input pipeline?)",
          "gpu": "its GPU runs throttled, below its peak clock (power cap, heat or a hardware slowdown?)",
          "cpu": "others take its CPUs while it waits for one, or its CPU quota holds it back"}


def look_every(window: float) -> float:
    """Seconds between the agents' looks at a watched task's threads, on average, for a rule that
    weighs ``window`` seconds of readings: :data:`LOOKS_PER_WINDOW` looks a window, whatever its length."""
    return window / LOOKS_PER_WINDOW


class Figures(NamedTuple):
    """One task's figures over a window: its stalled threads on average, and how much slower than
    its peak its slowest GPU ran, throttled (0 without GPUs). A named tuple: each judgement makes
    two per task."""

    stall: float
    gpu: float = 0.0
    cpu: float = 0.0


def figures_over(history: Sequence[tuple[float, ThreadTimes]], now: float, window: float = WINDOW) -> Figures | None:
    """A task's :class:`Figures` from its readings (oldest first) over the ``window`` seconds up to
    ``now``; None while they span less than half of it."""
    # Walked from its newest end, without a copy: judged every JUDGE_EVERY seconds for every task
    # twice, this is most of what the rule costs tflaunch.
    last_place = len(history) - 1
    while last_place >= 0 and history[last_place][0] > now:
        last_place -= 1
    if last_place < 1:
        return None
    start = now - window
    place = last_place
    while place >= 0 and history[place][0] > start:
        place -= 1
    base_at, base = history[max(place, 0)]
    last_at, last = history[last_place]
    if last_at - base_at < 0.5 * window or last.looks <= base.looks:
        return None
    stall = last.stalled - base.stalled
    stall = stall / (last.looks - base.looks) if stall > 0.0 else 0.0
    cpu_base = gpu_base = base
    # The CPU and GPU figures come at a census of the task's threads, every few looks: 5 to 15 s
    # apart, as the looks are drawn apart (launcher/agent/threads.py). A span of half a window
    # may hold none; the newest census before it then stands for it, if it came within ``window``
    # before the span (never an older one: a GPU whose readings went stale is not stood in for).
    want_cpu, want_gpu = last.cpu_looks == base.cpu_looks, 0 < last.gpu_looks == base.gpu_looks
    place, floor = max(place, 0), start - window
    while (want_cpu or want_gpu) and place > 0 and history[place - 1][0] >= floor:
        place -= 1
        earlier = history[place][1]
        if want_cpu and earlier.cpu_looks < last.cpu_looks:
            cpu_base, want_cpu = earlier, False
        if want_gpu and earlier.gpu_looks < last.gpu_looks:
            gpu_base, want_gpu = earlier, False
    cpu_looks, cpu = last.cpu_looks - cpu_base.cpu_looks, last.cpu_lost - cpu_base.cpu_lost
    cpu = cpu / cpu_looks if cpu_looks > 0 and cpu > 0.0 else 0.0
    gpu_looks, gpu = last.gpu_looks - gpu_base.gpu_looks, last.gpu_slowdown - gpu_base.gpu_slowdown
    gpu = gpu / gpu_looks if gpu_looks > 0 and gpu > 0.0 else 0.0
    return Figures(stall, gpu, cpu)


def shares(figures: Mapping[str, Figures]) -> dict[str, tuple[float, str]]:
    """Each task's share of the step the others spend waiting for it, and which figure says so
    (``stall`` or ``gpu``): how far its figure stands above the others' typical one (the higher
    median: one odd task among the others never makes their baseline)."""
    if len(figures) < 2:
        return {}
    names, values = list(figures), list(figures.values())
    stall = _others_median_high([mine.stall for mine in values])
    gpu = _others_median_high([mine.gpu for mine in values])
    cpu = _others_median_high([mine.cpu for mine in values])
    found = {}
    for i, mine in enumerate(values):
        # The largest difference; on a tie, stall before gpu before cpu.
        share, cause = mine.stall - stall[i], "stall"
        by_gpu, by_cpu = mine.gpu - gpu[i], mine.cpu - cpu[i]
        if by_gpu > share:
            share, cause = by_gpu, "gpu"
        if by_cpu > share:
            share, cause = by_cpu, "cpu"
        # Rounded: the figures are fractions of looks, and their difference in floating point falls
        # short of the threshold it equals (0.6 - 0.4 is 0.19999999999999996, under CONFIRM_SHARE).
        share = round(share, SHARE_DIGITS)
        found[names[i]] = (0.0 if share < 0.0 else 1.0 if share > 1.0 else share, cause)
    return found


def _others_median_high(values: Sequence[float]) -> list[float]:
    """For each value, the higher median of all the other values: one sort for all of them, so a
    judgement costs n log n, not n sorts of n (16 ms every 2 s at 256 tasks)."""
    ranked = sorted(range(len(values)), key=values.__getitem__)
    ordered = [values[i] for i in ranked]
    middle = (len(values) - 1) // 2  # the higher median's place among the n - 1 others
    found = [0.0] * len(values)
    for place, i in enumerate(ranked):
        found[i] = ordered[middle] if middle < place else ordered[middle + 1]
    return found


def steady_shares(histories: Mapping[str, Sequence[tuple[float, ThreadTimes]]],
                  now: float, window: float = WINDOW) -> dict[str, tuple[float, str]]:
    """Each task's share over the last ``window``, as the lesser of its :func:`shares` over the
    window's two halves, and the later half's cause: a task must stand out in both to stand out.
    Over the whole window, a burst of stalls a few seconds long (a checkpoint written, a last
    evaluation, a task's own end of training) holds its task's figure up for as long as the burst
    stays in the window, longer than the rule's :data:`CONFIRM_FOR`; a burst shorter than that
    never fills both halves at once. Tasks whose readings span too little yet are left out."""
    half = window / 2
    earlier, later = {}, {}
    for name, history in histories.items():
        first, second = figures_over(history, now - half, half), figures_over(history, now, half)
        if first is not None and second is not None:
            earlier[name], later[name] = first, second
    if len(later) < 2:
        return {}
    before, after = shares(earlier), shares(later)
    return {name: (min(before[name][0], share), cause) for name, (share, cause) in after.items()}


def minority(tasks: int) -> int:
    """How many tasks at most may stand out at once for any of them to be named: at most half of
    the others (one of two or three, two of five)."""
    return max(1, (tasks - 1) // 2)


@dataclass
class _Suspect:
    since: float  # when its share first reached CONFIRM_SHARE in this streak
    shares: list[float]
    cause: str


class StragglerWatch:
    """The straggler rule for one attempt, called on every supervisor turn like a watchdog.

    ``hosts`` names each task's host; ``message`` says a change in one line; ``changed`` gets the
    attempt's :class:`StragglerRecord` list whenever it changes (for run.json and the status line).
    With ``exclude_after`` (``--on-straggler exclude``), a straggler that lasted that long stops
    the attempt with a :class:`Trip`, when ``excludable`` (asked with the task's name) returns
    None; otherwise what it returns is said once, and the run goes on. No straggler is named in the
    attempt's first ``warm_up`` seconds (``--straggler-warm-up``). Each judgement takes the last
    ``window`` seconds of readings; a task is named once it stood out for
    :data:`CONFIRM_PART` of them and its end said once it was calm for :data:`END_PART` of them.
    """

    def __init__(self, attempt: int, hosts: Mapping[str, str], message: Callable[[str], None],
                 changed: Callable[[list[StragglerRecord]], None], *, warm_up: float, window: float = WINDOW,
                 exclude_after: float | None = None, excludable: Callable[[str], str | None] = lambda name: None,
                 clock: Callable[[], float] = time.time):
        self.attempt = attempt
        self.warm_up = warm_up
        self.window = window
        self.confirm_for = CONFIRM_PART * window
        self.end_for = END_PART * window
        self.judge_every = max(READINGS_EVERY, min(JUDGE_EVERY, window / 10))
        self.hosts = dict(hosts)
        self.message = message
        self.changed = changed
        self.exclude_after = exclude_after
        self.excludable = excludable
        self.clock = clock
        self.started = clock()
        self.next_judgement = self.started
        self.history: TaskReadings[ThreadTimes] = TaskReadings(lambda reading: reading.threads)
        self.suspects: dict[str, _Suspect] = {}
        self.calm_since: dict[str, float] = {}
        self.records: dict[str, StragglerRecord] = {}  # the confirmed ones still going, by task
        self.since_at: dict[str, float] = {}  # when each of those began
        self.ended: list[StragglerRecord] = []
        self.refused: set[str] = set()  # stragglers that could not be excluded (said once)
        self.excluded: str | None = None
        # Once one training task ended, the others no longer step together: the last ones wait at
        # the end of training (polling, sleeping), which would look like a straggler.
        self.finishing = False

    @property
    def all_records(self) -> list[StragglerRecord]:
        return self.ended + list(self.records.values())

    def __call__(self, tasks: list[Task]) -> Trip | None:
        now = self.clock()
        if now < self.next_judgement:
            return None
        self.next_judgement = now + self.judge_every
        if not self.finishing and any(task.role in TRAINING_ROLES and task.state.ended for task in tasks):
            self.finishing = True
            log.debug("attempt %d: a training task ended; no straggler is named from now on", self.attempt)
        self._read(tasks, now)
        found = steady_shares(dict(self.history.items()), now, self.window)
        if len(found) < 2:
            return None
        return self.judge(found, now)

    def _read(self, tasks: list[Task], now: float) -> None:
        for task in tasks:
            if task.role not in TRAINING_ROLES or task.state is not TaskState.RUNNING or task.process is None:
                self.history.drop(task.name)
                continue
            self.history.add(task.name, task.process.reading())
            self.history.trim(task.name, now - 2 * self.window, keep=2)

    def judge(self, found: Mapping[str, tuple[float, str]], now: float) -> Trip | None:
        """Fold one judgement of every task's share in: confirm, update and end stragglers."""
        standing = {name: value for name, value in found.items() if value[0] >= CONFIRM_SHARE}
        if len(standing) > minority(len(found)):
            standing = {}  # most of the cluster stands out: that is the cluster, not a straggler
        for name in list(self.suspects):
            if name not in standing:
                del self.suspects[name]
        for name, (share, cause) in standing.items():
            suspect = self.suspects.setdefault(name, _Suspect(now, [], cause))
            suspect.shares.append(share)
            suspect.cause = cause
            if (name not in self.records and now - suspect.since >= self.confirm_for
                    and now - self.started >= self.warm_up and not self.finishing):
                self._confirm(name, suspect)
        for name, record in list(self.records.items()):
            share = found.get(name, (0.0, ""))[0]
            if share >= END_SHARE:
                self.calm_since.pop(name, None)
                if name in self.suspects:
                    shares_seen = self.suspects[name].shares
                    record.share = round(sum(shares_seen) / len(shares_seen), 3)
                continue
            calm = self.calm_since.setdefault(name, now)
            if now - calm >= self.end_for:
                self._end(name, calm)
        log.debug("attempt %d: shares %s; standing out %s; suspects %s; stragglers %s", self.attempt, found,
                  list(standing), list(self.suspects), list(self.records))
        return self._exclusion(now)

    def _confirm(self, name: str, suspect: _Suspect) -> None:
        share = round(sum(suspect.shares) / len(suspect.shares), 3)
        record = StragglerRecord(task=name, host=self.hosts.get(name, "?"), since=iso_time(suspect.since),
                                 share=share, attempt=self.attempt, cause=CAUSES[suspect.cause])
        self.records[name] = record
        self.since_at[name] = suspect.since
        self.changed(self.all_records)  # the record first: whoever reads the line finds it there
        self.message(f"straggler: {name} on {record.host} holds the others back: they wait for it about "
                     f"{share:.0%} of each step since {clock_text(suspect.since)}; {record.cause}")

    def _end(self, name: str, until: float) -> None:
        record = self.records.pop(name)
        self.calm_since.pop(name, None)
        record.until = iso_time(until)
        self.ended.append(record)
        self.changed(self.all_records)
        self.message(f"straggler: {name} on {record.host} no longer holds the others back (since "
                     f"{clock_text(until)}; they waited for it about {record.share:.0%} of each step from "
                     f"{clock_text(self.since_at.pop(name))})")

    def close(self) -> list[StragglerRecord]:
        """The attempt ended: every straggler still going ends with it. The attempt's records."""
        if self.records:  # else nothing changed since the last call of ``changed``
            now = self.clock()
            for record in self.records.values():
                record.until = iso_time(now)
                self.ended.append(record)
            self.records = {}
            self.changed(self.all_records)
        return self.ended

    def _exclusion(self, now: float) -> Trip | None:
        if self.exclude_after is None:
            return None
        for name, record in self.records.items():
            since = self.since_at[name]
            if now - since < self.exclude_after or name in self.refused:
                continue
            why_not = self.excludable(name)
            if why_not is not None:
                self.refused.add(name)
                self.message(f"straggler: {name} on {record.host} held the others back for {now - since:.0f} s; "
                             f"not left out: {why_not}")
                continue
            self.excluded = record.host
            return Trip(f"straggler: {name} on {record.host} held the others back for {now - since:.0f} s "
                        f"(about {record.share:.0%} of each step); restarting without {record.host}", (name,))
        return None


def status_words(records: Sequence[StragglerRecord]) -> str | None:
    """The status line's few words on the stragglers still going, or None."""
    going = [r for r in records if r.until is None]
    if not going:
        return None
    return "straggler " + ", ".join(f"{r.task} ({r.share:.0%})" for r in going)
