"""When the supervisor looks at its tasks: which to poll, and how long to sleep in between.

Given ``changes`` (the link hub's record of the processes whose status changed, readable while
any did: :class:`launcher.transports.linkhub.Changes`), only the tasks whose process changed or
just started are polled, so a quiet run of thousands of tasks costs next to nothing and a failure
is seen at once; every task is still polled every ``full_poll`` seconds (a net under a change
that went unsaid, and while stopping, the KILL backstops), and the watchdog gets a turn every
``tick``, or when ``watch_in`` says its next turn is due: a run with no hang watchdog needs a turn
only when the run record has a change waiting (and now and then, to notice a full disk), so a
quiet supervisor wakes about once a second instead of four times. Without ``changes`` (processes
that say nothing of themselves, as in the unit tests) every task is polled every
``poll_interval``, and the watchdog every turn.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol, Sequence

if TYPE_CHECKING:
    from .task import Task


class Changes(Protocol):
    """Which processes changed status (see :class:`launcher.transports.linkhub.Changes`)."""

    def fileno(self) -> int:
        """A descriptor that is readable while a change waits to be taken."""

    def take(self) -> list[object]:
        """The processes whose status changed since the last call."""


class Wakeups:
    """The supervisor's waiting policy over ``tasks`` (their order is the order they are polled in)."""

    def __init__(self, tasks: Sequence[Task], changes: Changes | None, clock: Callable[[], float],
                 tick: float, full_poll: float, watch_in: Callable[[], float] | None = None):
        """``watch_in``: seconds until the watchdog next needs a turn, asked after each turn and before
        each sleep (a change that came meanwhile may bring it forward); None: every ``tick``."""
        self.tasks = tasks
        self.changes = changes
        self.clock = clock
        self.tick = tick
        self.full_poll = full_poll
        self.watch_in = watch_in
        self._task_of: dict[object, Task] = {}  # each task's current process -> the task
        self._order = {id(task): n for n, task in enumerate(tasks)}  # tasks are unhashable dataclasses
        self._due: dict[int, Task] = {}  # id -> a task to poll at the next turn (just started)
        self._last_full = float("-inf")  # clock time of the last poll of every task
        self._next_full = 0.0  # and of the next one
        self._next_watch = 0.0  # clock time of the watchdog's next turn

    def started(self, task: Task) -> None:
        """``task`` has a new process: poll it next turn (a start that failed says so without a change)."""
        self._task_of[task.process] = task
        self._due[id(task)] = task

    def due(self, tasks: Sequence[Task] | None = None, full_every: float | None = None) -> list[Task]:
        """Those of ``tasks`` (all by default) to poll now, in order: all of them without
        ``changes`` or every ``full_every`` seconds (``full_poll`` by default), else the ones
        whose process changed or just started."""
        tasks = self.tasks if tasks is None else tasks
        if self.changes is None:
            return list(tasks)
        due, self._due = self._due, {}
        due.update((id(task), task) for task in map(self._task_of.get, self.changes.take()) if task is not None)
        now = self.clock()
        every = self.full_poll if full_every is None else full_every
        if now >= min(self._next_full, self._last_full + every):  # a shorter period applies at once
            self._last_full, self._next_full = now, now + every
            return list(tasks)
        if tasks is not self.tasks:
            due = {key: due[key] for key in {id(task) for task in tasks} & due.keys()}
        return [due[key] for key in sorted(due, key=self._order.__getitem__)]

    def watch_due(self) -> bool:
        """Whether the watchdog gets a turn now."""
        if self.changes is None:
            return True
        now = self.clock()
        if now < self._next_watch:
            return False
        self._next_watch = now + (self.tick if self.watch_in is None else self.watch_in())
        return True

    def sleep(self, seconds: float, watching: bool) -> tuple[float, tuple[int, ...]]:
        """How long to sleep (at most ``seconds`` without ``changes``; with them, ``tick``, or until
        the turn ``watch_in`` asks for) and on which descriptors besides the signals' (``watching``:
        a watchdog waits for its turn)."""
        if self.changes is None:
            return seconds, ()
        if self._due:
            return 0.0, ()
        now, longest = self.clock(), self.tick
        if watching and self.watch_in is not None:  # its answer bounds the sleep, not the tick
            self._next_watch, longest = min(self._next_watch, now + self.watch_in()), float("inf")
        until = min(self._next_full, self._next_watch) if watching else self._next_full
        return min(longest, max(0.0, until - now)), (self.changes.fileno(),)
