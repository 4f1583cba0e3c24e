"""A run's logs as lines: the merged log or one task's output, filtered, read once or followed.

``merged.log`` lines read ``<date> <time> [<attempt>] <task> | <text>``; a task's own log holds its
output as it wrote it: ``<task>.log`` in the run folder is its latest attempt's, and an earlier
attempt's moves into ``attempt-<k>/`` when the next attempt starts.
A log that outgrew its size limit reads as its head, a marker line saying how many bytes were left
out, and its latest output (:mod:`launcher.records.logview`); marker lines pass every filter.

A pattern keeps a line when it matches the line as the log holds it (folded as a terminal shows
it, :mod:`launcher.records.lines`) or as the console showed it: the task's text alone, and a
metric line (a ``TFLAUNCH_METRIC`` line, or a Keras epoch line read as one) as the epoch line
the console printed for it (:mod:`launcher.records.metrictext`), alone and after ``<task> | ``
(with ``--task``, that task's name).
The line printed is always the log's.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from ..records.kerasepochs import KerasState
from ..records.lines import LineSplitter
from ..records.logview import Follower, is_marker, read_view
from ..records.metrics import metric_lines
from ..records.metrictext import record_text
from .runs import Run, TaskNotFoundError

_MERGED_LINE = re.compile(r"^\S+ \S+ \[(\d+)\] (\S+) \| ")


@dataclass(frozen=True)
class LogQuery:
    """Which log lines to show: the merged log or one task's, one attempt or all, matching a pattern."""

    task: str | None = None
    attempt: int | None = None
    pattern: re.Pattern[str] | None = None


def log_path(run: Run, query: LogQuery) -> Path:
    """The file a query reads: merged.log, the task's latest log, or the task's log of one attempt."""
    if query.attempt is not None and not 1 <= query.attempt <= run.attempt:
        raise TaskNotFoundError(f"run {run.run_id} has no attempt {query.attempt} "
                                f"(its attempts: {', '.join(str(n) for n in range(1, run.attempt + 1))})")
    if query.task is None:
        return run.folder.merged_path
    run.require_task(query.task)
    if query.attempt is not None:
        return run.folder.task_log(query.task, query.attempt)
    return run.folder.latest_task_log(query.task)


class _Filter:
    """Which lines of one log a query keeps; it reads every line in order, to know each task's
    Keras epochs as the console did (:func:`launcher.records.metrics.metric_lines`)."""

    def __init__(self, query: LogQuery):
        self.query = query
        self._keras: dict[tuple[str | None, str | None], KerasState] = {}  # by (attempt, task) in merged.log

    def __call__(self, line: str) -> bool:
        query = self.query
        if is_marker(line):
            return True
        match = _MERGED_LINE.match(line) if query.task is None else None
        if query.task is None and query.attempt is not None:
            if match is None or int(match.group(1)) != query.attempt:
                return False
        if query.pattern is None:
            return True
        return any(query.pattern.search(text) is not None for text in self.forms(line, match))

    def forms(self, line: str, match: re.Match[str] | None) -> list[str]:
        """The line as the log holds it, then as the console showed it."""
        key, text = (match.groups(), line[match.end():]) if match else ((None, self.query.task), line)
        state, found = metric_lines(text.encode("utf-8", "surrogateescape") + b"\n",
                                    self._keras.get(key, KerasState()))
        self._keras[key] = state
        shown = record_text(found[0][1]) if found and found[0][1] is not None else text
        return [line, text, shown] + ([f"{key[1]} | {shown}"] if key[1] else [])


def read_log(run: Run, query: LogQuery) -> Iterator[str]:
    """The lines of the query's log as they are now."""
    path = log_path(run, query)
    try:
        data = read_view(path)
    except FileNotFoundError:
        return
    splitter = LineSplitter()
    wanted = _Filter(query)
    for raw in splitter.feed(data) + splitter.flush():
        line = raw.decode("utf-8", "replace")
        if wanted(line):
            yield line


def follow_log(run: Run, query: LogQuery, poll: float = 0.25,
               sleep: Callable[[float], None] = time.sleep) -> Iterator[str]:
    """The query's log from its start, then new lines as they come, until the run ends.

    The run has ended when run.json no longer says ``running`` or its launcher is gone; since
    tflaunch finishes writing the logs before it records the end, everything is read by then.
    A task's log moves into its attempt's folder when the next attempt starts: the follower reads
    the moved file to its end, then (following the latest log) goes on with the new one.
    """
    reader: _Tail | None = None
    wanted = _Filter(query)
    later = 1  # the attempt a new reader of the latest log reads at least (run.json may lag behind)
    while True:
        ended = not run.reload().live
        path = log_path(run, query)
        if reader is not None and query.task is not None:
            reader.moved_to(run.folder.task_log(query.task, reader.attempt))
        current = path.resolve() if path.exists() else None
        if reader is not None and current is not None and current != reader.path:
            yield from (line for line in reader.finish() if wanted(line))
            later, reader = reader.attempt + 1, None
            wanted = _Filter(query)  # a new attempt's log: its Keras epochs start afresh
        if reader is None and current is not None:
            reader = _Tail(current, query.attempt or max(run.attempt, later))
        if reader is not None:
            yield from (line for line in reader.read() if wanted(line))
        if ended:
            if reader is not None:
                yield from (line for line in reader.finish() if wanted(line))
            return
        sleep(poll)


class _Tail:
    """Complete lines added to one log since the last read (through its changes of shape)."""

    def __init__(self, path: Path, attempt: int):
        self.path, self.attempt = path, attempt  # the attempt whose log it reads
        self.follower = Follower(path)
        self.splitter = LineSplitter()

    def moved_to(self, path: Path) -> None:
        """Read on from where the log now is (the same file, moved into its attempt's folder)."""
        where = path.resolve() if path.exists() else self.path
        if where != self.path:
            self.path = self.follower.path = where

    def read(self) -> list[str]:
        try:
            data = self.follower.read()
        except FileNotFoundError:
            return []
        return [raw.decode("utf-8", "replace") for raw in self.splitter.feed(data)]

    def finish(self) -> list[str]:
        return self.read() + [raw.decode("utf-8", "replace") for raw in self.splitter.flush()]
