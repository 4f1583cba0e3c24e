"""What the other tasks print once a failure stops the cluster: one line per task on the console.

When a task fails, the supervisor stops every other task. What those print from then on (gRPC
``UnavailableError`` and ``CancelledError``, aborted collectives, tracebacks) follows from the
failure rather than explaining it, and would bury the root cause under a wall of errors. So from
the stop on, a :class:`StopFold` counts those tasks' lines instead of showing them, and the
console shows one line per task before its next message (the run's summary, or the restart):

    worker-0 | … 94 lines since worker-1 failed, not shown here (worker-0.log has them all)

The console also folds a task's lines that were still waiting for their twins when the stop
began, from its first error on (:func:`.chatter.starts_error`): a failure's errors reach the other
tasks a few milliseconds before tflaunch sees it fail. The failed task's own lines stay on the
console, and every line stays in the logs and merged.log.
Pure: the console's writer thread owns one and alone calls it.
"""

from __future__ import annotations

from ...records.folder import task_log_name


def folded_text(count: int, task: str, root: str) -> str:
    """The console's line for ``count`` lines ``task`` wrote since ``root`` failed."""
    return (f"… {count:,} line{'s' if count != 1 else ''} since {root} failed, not shown here "
            f"({task_log_name(task)} has them all)")


class StopFold:
    """The stop of one attempt, begun by one task's failure, and the lines the others wrote since."""

    def __init__(self) -> None:
        self._attempt: int | None = None
        self._root = ""
        self._counts: dict[str, int] = {}  # in the order the tasks first wrote after the stop

    def began(self, attempt: int, root: str) -> None:
        """``root`` failed and the stop of ``attempt`` began: the other tasks' lines fold from now on."""
        self._attempt, self._root = attempt, root

    def folds(self, task: str, attempt: int) -> bool:
        """Whether ``task``'s lines of ``attempt`` are folded: written by another task than the root
        cause, after the stop began (an attempt after it starts afresh)."""
        return attempt == self._attempt and task != self._root

    def count(self, task: str, lines: int) -> None:
        if lines > 0:
            self._counts[task] = self._counts.get(task, 0) + lines

    def due(self) -> list[tuple[str, str]]:
        """The console's lines for what was folded since the last call, ``(task, text)``, one per task."""
        lines = [(task, folded_text(count, task, self._root)) for task, count in self._counts.items()]
        self._counts.clear()
        return lines
