"""A run's two shared output files, ``merged.log`` and ``metrics.jsonl``, written a sweep at a time.

The output pump (:mod:`.pump`) hands a :class:`MergedFiles` every block of lines it reads from a
task's log and every metric record it finds in one, from its one thread and under its lock; this
module prefixes the lines, completes the records and writes both files within their size limits
(:mod:`launcher.records.boundedlog`): ``merged.log`` within ``MERGED_SHARE`` times a task log's
limit, ``metrics.jsonl`` within the smaller of that limit and ``METRICS_MAX_SIZE``.

Each merged line reads ``<date> <time> [<attempt>] <task> | <text>``: the block's bytes after the
prefix are kept as the task wrote them. A sweep's bytes are written at once, or as soon as they
reach ``WRITE_AT``, so a sweep that finds a flood in every log does not hold all of it in memory.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Callable

from ...records.boundedlog import MERGED_SHARE, BoundedLog
from ...records.files import open_own
from ...records.metrics import METRICS_MAX_SIZE, MetricLines
from .progress import Progress

WRITE_AT = 4 << 20


class MergedFiles:
    """``merged.log`` and ``metrics.jsonl``, made at once (empty) and kept within their limits."""

    def __init__(self, merged_path: Path, metrics_path: Path, log_max_size: int, progress: Progress,
                 clock: Callable[[], float] = time.time) -> None:
        os.close(open_own(merged_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND))  # there from the start
        self.merged = BoundedLog(merged_path, MERGED_SHARE * log_max_size)
        os.close(open_own(metrics_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND))
        self.metrics = BoundedLog(metrics_path, min(METRICS_MAX_SIZE, log_max_size))
        self.progress, self.clock = progress, clock
        self._merged_out: list[bytes | memoryview] = []  # merged.log's bytes of this sweep, written at once
        self._merged_size = 0  # their length
        self._metrics_out: list[bytes] = []  # metrics.jsonl's lines of this sweep, written at once

    def lines(self, name: str, attempt: int, block: bytes, now: float | None = None) -> None:
        """A block of complete lines of task ``name`` (or tflaunch's), each prefixed, into merged.log."""
        now = self.clock() if now is None else now
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"
        prefix = f"{stamp} [{attempt}] {name} | ".encode()
        # One replace over the block; the prefix it leaves after the final newline is cut off.
        prefixed = memoryview(block.replace(b"\n", b"\n" + prefix))[:-len(prefix)]
        self._merged_out += (prefix, prefixed)
        self._merged_size += len(prefix) + len(prefixed)
        if self._merged_size >= WRITE_AT:
            self.flush()

    def records(self, name: str, attempt: int, records: MetricLines) -> None:
        """Complete each metric record (task, attempt, time), note the progress, and add it to metrics.jsonl."""
        for _, record in records:
            if record is None:
                continue  # a malformed record stays in the logs, but is no metric
            record.setdefault("task", name)
            record["attempt"] = attempt
            record.setdefault("time", round(self.clock(), 3))
            self.progress.metric(attempt, name, record["time"])
            self._metrics_out.append(json.dumps(record, separators=(",", ":")).encode() + b"\n")

    def flush(self) -> None:
        """Write what this sweep gathered; raises OSError when a file cannot take it."""
        out, self._merged_out, self._merged_size = self._merged_out, [], 0
        if out:
            self.merged.write_pieces(out)
        metrics, self._metrics_out = self._metrics_out, []
        if metrics:
            self.metrics.write_pieces(metrics)

    def close(self) -> list[OSError]:
        """Close both files; the errors of those whose last buffered bytes did not fit on the disk."""
        errors = []
        for stream in (self.merged, self.metrics):
            try:
                stream.close()
            except OSError as exc:
                errors.append(exc)
        return errors


__all__ = ["MergedFiles", "WRITE_AT"]
