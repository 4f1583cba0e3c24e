"""What the tasks' output says about progress, shared between the output pump and its readers.

The pump's thread writes it as lines arrive; the watchdog (on the supervisor's thread) and the
session read it. The object owns its lock, so no reader ever looks at another thread's
attributes while they change.
"""

from __future__ import annotations

import threading
from typing import Iterable


class Progress:
    """When any task last wrote anything, and when each task of each attempt first reported a metric."""

    def __init__(self, now: float):
        self._lock = threading.Lock()
        self._last_output = now
        self._first_metric: dict[tuple[int, str], float] = {}

    # -- written by the pump ----------------------------------------------------------------------

    def output(self, when: float) -> None:
        """A task wrote something (any byte, also a progress bar that has not finished its line)."""
        with self._lock:
            self._last_output = when

    def metric(self, attempt: int, task: str, when: float) -> None:
        """A task reported a metric record."""
        with self._lock:
            self._first_metric.setdefault((attempt, task), when)

    # -- read by the watchdog and the session -------------------------------------------------------

    @property
    def last_output(self) -> float:
        with self._lock:
            return self._last_output

    def silent(self, attempt: int, tasks: Iterable[str]) -> list[str]:
        """Those of ``tasks`` that have reported no metric in ``attempt`` yet."""
        with self._lock:
            return [task for task in tasks if (attempt, task) not in self._first_metric]

    def progressed(self, attempt: int, tasks: Iterable[str]) -> bool:
        """Whether any of ``tasks`` reported a metric in ``attempt``."""
        with self._lock:
            return any((attempt, task) in self._first_metric for task in tasks)
