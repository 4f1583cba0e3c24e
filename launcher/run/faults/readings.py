"""Each task's recent readings, as a rule over a window reads them: one history per task, started
afresh when the task's process changes (a restart in place counts its totals from zero again).

The hang and start rules (:mod:`.watchdog`) read a task's CPU seconds, the straggler rule
(:mod:`.stragglers`) its threads' times: each keeps a :class:`TaskReadings` of the value it reads.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Generic, Iterator, TypeVar

from ...transports.base import Reading

Value = TypeVar("Value")


class TaskReadings(Generic[Value]):
    """{task name: [(when, value), ...]}, oldest first, one entry per new reading of the task."""

    def __init__(self, value: Callable[[Reading], Value | None]):
        self.value = value  # what a rule reads of a reading (None: this reading has none)
        self._history: dict[str, deque[tuple[float, Value]]] = {}
        self._pids: dict[str, int | None] = {}

    def add(self, name: str, reading: Reading | None) -> None:
        """Take ``reading`` into the task's history, unless it has nothing to read or is not newer
        than the last one."""
        history = self._history.get(name)
        if history is None:
            history = self._history[name] = deque()
        value = self.value(reading) if reading is not None else None
        if reading is None or value is None:
            return
        if self._pids.get(name, reading.pid) != reading.pid:
            history.clear()  # restarted in place: its totals count from zero again
        self._pids[name] = reading.pid
        if not history or reading.at > history[-1][0]:
            history.append((reading.at, value))

    def trim(self, name: str, start: float, keep: int = 1) -> tuple[tuple[float, Value], ...]:
        """The task's history from the newest reading at or before ``start`` on (those before it are
        dropped, leaving at least ``keep``): what a window from ``start`` needs."""
        history = self._history.get(name, deque())
        while len(history) > keep and history[1][0] <= start:
            history.popleft()
        return tuple(history)

    def drop(self, name: str) -> None:
        """Forget a task that no longer runs (its process is remembered, to tell a restart)."""
        self._history.pop(name, None)

    def items(self) -> Iterator[tuple[str, deque[tuple[float, Value]]]]:
        return iter(self._history.items())
