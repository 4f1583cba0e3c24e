"""What the tasks' metric lines say about progress, shared between the output pump and its readers.

The pump's thread writes it as lines arrive; the watchdog (on the supervisor's thread) and the
session read it. The object owns its lock, so no reader ever looks at another thread's
attributes while they change.
"""

from __future__ import annotations

import threading
from typing import Iterable


class Progress:
    """When each task of each attempt first and last reported a metric (plain output is no progress)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._first_metric: dict[tuple[int, str], float] = {}
        self._last_metric: dict[tuple[int, str], float] = {}

    # -- written by the pump ----------------------------------------------------------------------

    def metric(self, attempt: int, task: str, when: float) -> None:
        """A task reported a metric record."""
        with self._lock:
            self._first_metric.setdefault((attempt, task), when)
            self._last_metric[(attempt, task)] = when

    # -- read by the watchdog and the session -------------------------------------------------------

    def last_metric(self, attempt: int, task: str) -> float | None:
        """When ``task`` last reported a metric in ``attempt`` (None: not yet)."""
        with self._lock:
            return self._last_metric.get((attempt, task))

    def silent(self, attempt: int, tasks: Iterable[str]) -> list[str]:
        """Those of ``tasks`` that have reported no metric in ``attempt`` yet."""
        with self._lock:
            return [task for task in tasks if (attempt, task) not in self._first_metric]

    def progressed(self, attempt: int, tasks: Iterable[str]) -> bool:
        """Whether any of ``tasks`` reported a metric in ``attempt``."""
        with self._lock:
            return any((attempt, task) in self._first_metric for task in tasks)
