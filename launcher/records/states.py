"""The words a run record uses for how things stand: a run's status, a task's state, an attempt's outcome,
how long something took (:func:`duration_text`) and how many (:func:`plural`).

The supervisor changes task states, the session decides outcomes and statuses, the console shows
them and the inspection commands read them back: all of them take these enums from here.

A task's states and the only transitions between them (``TaskState.can_become``)::

    PENDING --started--> RUNNING --exit 0--> SUCCEEDED
       |                   |  |---exit != 0, signal, lost host--> FAILED
       |                   |  '---ended by tflaunch's stop (SIGTERM, SIGKILL)--> STOPPED
       |                   '---failed, restart policy "task", budget left--> RESTARTING
       |                                          RESTARTING --started again--> RUNNING
       |--could not start--> FAILED
       '--never started (run stopped first)--> STOPPED

A task that exits on its own, even while tflaunch is stopping the others (it failed in the same
moment as the root cause), is FAILED (or SUCCEEDED) by its own exit, not STOPPED.

``LEFT_OUT`` is no state of an attempt's task: it is the record's word for a task of the cluster
that the latest attempt ran without (its host was left out and no spare could take it, so the
cluster shrank to ``min_workers``). No transition leads to it or from it.
"""

from __future__ import annotations

import enum
import math
from typing import Any, Callable, Generic, Sequence, TypeVar

T = TypeVar("T")


class _Word(str, enum.Enum):
    """A record's word: shown as itself, and read back leniently (an unknown word means it did not succeed)."""

    def __str__(self) -> str:  # the word itself, in f-strings and tables too
        return self.value

    @classmethod
    def parse(cls, value: Any):
        try:
            return cls(value)
        except ValueError:
            return cls("failed")  # an unknown word is no reason to hide the run; it did not succeed


class Role(str, enum.Enum):
    """A task's TensorFlow role: compared with these members, never with the words they are spelled
    with. A task's ``role`` stays the plain word (a cluster file's key, TF_CONFIG's task type, a
    record's), which a member compares equal to. Not a :class:`_Word`: an unknown role is no failure."""

    CHIEF = "chief"
    WORKER = "worker"
    PS = "ps"
    EVALUATOR = "evaluator"

    def __str__(self) -> str:  # the word itself, in f-strings and messages
        return self.value

class RunStatus(_Word):
    """A run's status. ``LAUNCHER_LOST`` and ``UNREADABLE`` are never written: readers infer them
    (see ``Run.status`` in :mod:`launcher.inspect.runs`)."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    LAUNCHER_LOST = "launcher-lost"  # run.json says running, but its launcher is gone
    UNREADABLE = "unreadable"  # run.json is not a run record (damaged, or edited by hand)

    @classmethod
    def parse(cls, value: Any) -> "RunStatus":
        if value == "died":  # how earlier readers spelled a lost launcher
            return cls.LAUNCHER_LOST
        if value == cls.UNREADABLE.value:  # a file that says so is readable; it did not succeed
            return cls.FAILED
        return super().parse(value)

    @property
    def ended(self) -> bool:
        return self not in (RunStatus.RUNNING, RunStatus.LAUNCHER_LOST)

    def describe(self) -> str:
        return "launcher lost" if self is RunStatus.LAUNCHER_LOST else self.value


class TaskState(_Word):
    """One task's state within an attempt (transitions in the module docstring)."""

    PENDING = "pending"
    RUNNING = "running"
    RESTARTING = "restarting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    LEFT_OUT = "left-out"  # in the record only: the latest attempt ran without it

    @property
    def ended(self) -> bool:
        return self in (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.STOPPED)

    def can_become(self, state: "TaskState") -> bool:
        return state in _NEXT.get(self, ())


_NEXT = {
    TaskState.PENDING: (TaskState.RUNNING, TaskState.FAILED, TaskState.STOPPED),
    TaskState.RUNNING: (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.STOPPED, TaskState.RESTARTING),
    TaskState.RESTARTING: (TaskState.RUNNING, TaskState.FAILED, TaskState.STOPPED),
}


class Outcome(_Word):
    """How one attempt ended."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"

    @property
    def status(self) -> RunStatus:
        """The run's status when this attempt is its last."""
        return {Outcome.SUCCEEDED: RunStatus.SUCCEEDED, Outcome.FAILED: RunStatus.FAILED,
                Outcome.INTERRUPTED: RunStatus.STOPPED}[self]


class AllFinal(Generic[T]):
    """Whether every item of ``items`` passes ``test``, a test of a final state (one a task never
    leaves within an attempt: ended, succeeded). The items that passed stay passed, so asking after
    every change costs one pass over the items in all, not one per change: an attempt's exit wave
    of a thousand tasks is not a million looks."""

    def __init__(self, items: Sequence[T], test: Callable[[T], bool]):
        self.items = items
        self.test = test
        self._passed = 0  # items[:_passed] passed

    def __call__(self) -> bool:
        items, test, passed = self.items, self.test, self._passed
        while passed < len(items) and test(items[passed]):
            passed += 1
        self._passed = passed
        return passed == len(items)


def duration_text(seconds: float | None) -> str:
    """``8.1 s``, ``2m05s``, ``1h03m``: every view of a run's or task's time says it this way."""
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not math.isfinite(seconds):
        return "-" if seconds is None else str(seconds)
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


CLOCK_FORMAT = "%Y-%m-%d %H:%M:%S"  # a moment as every view shows it, in this machine's zone


def clock_text(when: float | str | None) -> str:
    """``2026-12-02 14:02:11``: a moment (seconds since the epoch, or an ISO time as run.json holds
    it) as the console, ``status``, ``runs`` and ``report`` all show it; ``-`` for none, and text
    that is no time as it is."""
    import datetime  # here: the cluster's pure modules read the states without needing it

    if when is None or when == "":
        return "-"
    try:
        moment = (datetime.datetime.fromtimestamp(when) if isinstance(when, (int, float))
                  else datetime.datetime.fromisoformat(when).astimezone())
    except (ValueError, OverflowError, OSError, TypeError):
        return str(when)
    return moment.strftime(CLOCK_FORMAT)


def plural(count: int, word: str, many: str | None = None) -> str:
    """``1 task``, ``2 tasks``, ``0 tasks`` (``many`` for a word that takes more than an s)."""
    return f"{count:,} {word if count == 1 else many or word + 's'}"
