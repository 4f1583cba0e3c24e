"""Task output: per-task files tailed into ``merged.log``, ``metrics.jsonl`` and the console.

Tasks never write into a pipe of ours. Each task's stdout and stderr go straight to its own log
file (opened with O_APPEND, so the two streams interleave in write order), and a single pump
thread tails those files. A slow console or a busy launcher therefore can never block a task,
and a task's file is complete even if tflaunch dies.

Each merged line reads ``<date> <time> [<attempt>] <task> | <text>``.

Lines end at ``\\n`` (or ``\\r\\n``). Within a line, carriage returns and backspaces are applied the
way a terminal shows them, so a progress bar redrawn in place becomes the one line a person saw,
and the empty lines such redraws leave are dropped (:mod:`launcher.records.lines`). Everything else
is kept byte for byte: ``merged.log`` holds the task's bytes after the prefix, and only the
console decodes them, replacing what is not UTF-8. The task's own file is never changed.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..records.lines import LineSplitter
from ..records.metrics import parse_block
from .progress import Progress

if TYPE_CHECKING:
    from .console import Console

LAUNCHER_NAME = "tflaunch"
_READ_SIZE = 1 << 20


# Descriptors the pump keeps open at once: the files that wrote most recently. Every other file is
# looked at (one stat) every IDLE_CHECK seconds and reopened once it has grown, so a run of
# thousands of tasks tails them all within a small, fixed number of descriptors.
OPEN_FILES = 64
IDLE_CHECK = 0.25


@dataclass
class _Source:
    name: str
    attempt: int
    path: Path
    offset: int = 0
    fd: int | None = None
    last_output: float = 0.0  # monotonic time it last produced bytes
    next_check: float = 0.0  # when a closed source is looked at again
    splitter: LineSplitter = field(default_factory=LineSplitter)


class OutputPump:
    """Tails every task's log file on one thread into merged.log, metrics.jsonl and the console."""

    def __init__(self, merged_path: Path, metrics_path: Path, console: Console,
                 interval: float = 0.02, clock=time.time):
        self._merged = open(merged_path, "ab")
        self._metrics = open(metrics_path, "ab")
        self.console = console
        self.interval = interval
        self.clock = clock
        self._sources: list[_Source] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.progress = Progress()  # read by the watchdog and the session
        self.attempt = 1  # the attempt tflaunch's own messages belong to
        # Why the run's own files could not be written (a full disk, a removed folder): the run
        # stops its tasks and reports it. Set once; the pump then only drains the task files.
        self._failure: str | None = None
        self._failure_lock = threading.Lock()

    # -- sources ------------------------------------------------------------------------

    def follow(self, name: str, path: Path, attempt: int = 1) -> None:
        """Start tailing a task's log file (which the task writes to).

        A task restarted in place appends to the file already followed: it is not read twice.
        """
        with self._lock:
            if any(s.name == name and s.attempt == attempt for s in self._sources):
                return
            os.close(os.open(path, os.O_RDONLY | os.O_CREAT, 0o644))
            self._sources.append(_Source(name, attempt, Path(path)))
        self.console.register([name])

    def finish_all(self) -> None:
        """Read every source to its end, emit partial last lines, and stop following them."""
        with self._lock:
            for source in self._sources:
                try:
                    self._read(source, force=True)
                    self._emit(source, source.splitter.flush_block())
                except OSError as exc:
                    self._failed(exc)
                self._close_source(source)
            self._sources.clear()
            try:
                self._flush_files()
            except OSError as exc:
                self._failed(exc)

    # -- thread -------------------------------------------------------------------------

    def start(self) -> "OutputPump":
        self._thread = threading.Thread(target=self._run, name="tflaunch-output", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()
        self.finish_all()
        for stream in (self._merged, self._metrics):
            try:
                stream.close()
            except OSError as exc:  # the last buffered bytes did not fit on the disk
                self._failed(exc)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with self._lock:
                    busy = any([self._read(source) for source in self._sources])
                    self._flush_files()
            except OSError as exc:
                self._failed(exc)
                busy = False
            if not busy:
                self._stop.wait(self.interval)

    @property
    def failure(self) -> str | None:
        """``<path>: <reason>`` of the first write to the run's files that failed; None while all is well."""
        with self._failure_lock:
            return self._failure

    def _failed(self, exc: OSError) -> None:
        """Remember the first write failure."""
        with self._failure_lock:
            if self._failure is None:
                where = exc.filename or self._merged.name
                self._failure = f"{where}: {exc.strerror or exc}"

    # -- lines --------------------------------------------------------------------------

    def message(self, text: str) -> None:
        """Record one of tflaunch's own messages in merged.log (the console shows it separately)."""
        with self._lock:
            try:
                self._write_merged(LAUNCHER_NAME, self.attempt, text.encode() + b"\n")
                self._flush_files()
            except OSError as exc:
                self._failed(exc)

    def _read(self, source: _Source, force: bool = False) -> bool:
        """Read what ``source`` wrote since last time; a closed source only when it has grown."""
        now = time.monotonic()
        if source.fd is None:
            if not force and now < source.next_check:
                return False
            source.next_check = now + IDLE_CHECK
            try:
                if os.stat(source.path).st_size <= source.offset:
                    return False
            except FileNotFoundError:
                return False
            self._open_source(source, now)
        got = False
        while True:
            chunk = os.pread(source.fd, _READ_SIZE, source.offset)
            if not chunk:
                break
            got = True
            source.offset += len(chunk)
            source.last_output = now
            self._emit(source, source.splitter.feed_block(chunk))
        if force:
            self._close_source(source)
        return got

    def _open_source(self, source: _Source, now: float) -> None:
        open_sources = [s for s in self._sources if s.fd is not None]
        if len(open_sources) >= OPEN_FILES:
            self._close_source(min(open_sources, key=lambda s: s.last_output))
        source.fd = os.open(source.path, os.O_RDONLY)
        source.last_output = now

    @staticmethod
    def _close_source(source: _Source) -> None:
        if source.fd is not None:
            os.close(source.fd)
            source.fd = None

    def _emit(self, source: _Source, block: bytes) -> None:
        """Route a block of complete lines: merged.log, metrics.jsonl, console."""
        if not block:
            return
        self._write_merged(source.name, source.attempt, block)
        records = parse_block(block)  # the one place metric lines are parsed
        if records:
            self._record_metrics(source, records)
        # Only queued here: the console's own thread writes it, so a closed or stalled terminal
        # never holds up the files, the metrics or the supervisor.
        self.console.task_block(source.name, block, source.attempt, records)

    def _write_merged(self, name: str, attempt: int, block: bytes) -> None:
        now = self.clock()
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"
        prefix = f"{stamp} [{attempt}] {name} | ".encode()
        # One replace over the block; the prefix it leaves after the final newline is cut off.
        self._merged.write(prefix)
        self._merged.write(memoryview(block.replace(b"\n", b"\n" + prefix))[:-len(prefix)])

    def _record_metrics(self, source: _Source, records: list[dict | None]) -> None:
        """Complete each record (task, attempt, time) and append it to metrics.jsonl."""
        for record in records:
            if record is None:
                continue  # a malformed record stays in the logs, but is no metric
            record.setdefault("task", source.name)
            record["attempt"] = source.attempt
            record.setdefault("time", round(self.clock(), 3))
            self.progress.metric(source.attempt, source.name, record["time"])
            self._metrics.write(json.dumps(record, separators=(",", ":")).encode() + b"\n")

    def _flush_files(self) -> None:
        self._merged.flush()
        self._metrics.flush()


def tail_lines(path: Path, count: int = 20, max_bytes: int = 1 << 16) -> list[str]:
    """The last ``count`` lines of a task's log, decoded for display."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            data = handle.read()
    except OSError:
        return []
    splitter = LineSplitter()
    lines = splitter.feed(data) + splitter.flush()
    if size > max_bytes and lines:
        lines = lines[1:]  # the first one is probably cut
    return [line.decode("utf-8", "replace") for line in lines[-count:]] if count > 0 else []
