"""Task output: each task's log read back into ``merged.log``, ``metrics.jsonl`` and the console.

Every task's output reaches tflaunch through its host's agent (the local one too) and is appended
to the task's log by the transports' log writer; a single pump thread reads those logs back.
A slow console therefore never holds up a task or its log, and the pump falls behind rather than
anything waiting for it.

Every log is kept within its size limit (:mod:`launcher.records.boundedlog`): each task's log
within ``log_max_size``, ``merged.log`` and ``metrics.jsonl`` as :mod:`.merged` says. The pump owns each
task log's :class:`~launcher.records.boundedlog.BoundedLog` from :meth:`OutputPump.follow` until the
attempt ends, when it stitches it (head, marker, tail). Should the pump fall so far behind a flood
that part of a task's output is gone from its log before it was read, merged.log says how many bytes
it left out there. A metric line over its size limit (:mod:`launcher.records.metrics`) is no
metric: the pump says so once per task.

Lines end at ``\\n`` (or ``\\r\\n``). Within a line, carriage returns and backspaces are applied the
way a terminal shows them, so a progress bar redrawn in place becomes the one line a person saw,
and the empty lines such redraws leave are dropped (:mod:`launcher.records.lines`). Everything else
is kept byte for byte: ``merged.log`` holds the task's bytes after the prefix, and only the
console decodes them, replacing what is not UTF-8. Nothing of this folding touches the task's own log.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from ...records.boundedlog import WRITING, BoundedLog, Reader
from ...records.logformat import format_size
from ...records.files import open_own
from ...records.folder import MERGED, METRICS
from ...records.lines import LineSplitter
from ...records.kerasepochs import KerasState
from ...records.metrics import LINE_MAX, metric_lines, oversized, scalars
from . import OPEN_FILES
from .merged import MergedFiles
from .progress import Progress

if TYPE_CHECKING:
    from ..console.writer import Console

LAUNCHER_NAME = "tflaunch"
_READ_SIZE = 1 << 20
# What one sweep reads of one log, and of all of them, at most: floods never keep a sweep going, so
# tflaunch's messages and the callers waiting on the pump's lock (a task's start, an attempt's end)
# get their turn, and the logs take turns (what a log had no turn for waits for the next sweep).
_READ_PER_SWEEP, _SWEEP_AT_MOST = 4 * _READ_SIZE, 16 * _READ_SIZE


# A sweep reads the logs the transports wrote to since the last one (their BoundedLog says so).
# Every log is also looked at now and then, for output appended to it by another writer: every
# IDLE_CHECK seconds while it was heard from within the last QUIET seconds, else every QUIET_CHECK
# seconds; a log whose writes are announced (a relayed one: the agent's output comes through
# tflaunch, which is every task's in a run) every RELAYED_CHECK seconds, as nothing but a hand
# appending to the file writes to it otherwise. A look visits only the logs due.
IDLE_CHECK = 0.25
QUIET, QUIET_CHECK = 10.0, 2.0
RELAYED_CHECK = 30.0
# A run of many tasks spaces the looks out so that the pump makes about this many a second,
# whatever its size (2,048 tasks: each looked at every 64 s); output that tflaunch relays is read
# when it is announced, so only another writer's waits longer. A look is a stat of the file: 128 a
# second were the most of the pump's running cost, and of tflaunch's at a run's start.
LOOKS_PER_SECOND = 32


@dataclass(eq=False)  # kept in a set: one per followed log, compared by identity
class _Source:
    name: str
    attempt: int
    log: BoundedLog
    reader: Reader
    last_output: float = 0.0  # monotonic time it last produced bytes
    splitter: LineSplitter = field(default_factory=LineSplitter)
    keras: KerasState = KerasState()  # what its Keras epoch lines said so far (records.kerasepochs)
    done: bool = False  # no longer followed (its attempt ended)
    relayed: bool = False  # written to through its BoundedLog: its writes are announced
    queued: bool = False  # waiting in the pump's line of logs to read
    oversized: bool = False  # it printed a metric line over LINE_MAX (said once)


class OutputPump:
    """Tails every task's log file on one thread into merged.log, metrics.jsonl and the console."""

    def __init__(self, merged_path: Path, metrics_path: Path, console: Console, log_max_size: int,
                 interval: float = 0.02, clock=time.time):
        self.log_max_size = log_max_size
        self.progress = Progress()  # read by the watchdog and the session
        self.files = MergedFiles(merged_path, metrics_path, log_max_size, self.progress, clock)
        self.console = console
        self.interval = interval
        self.clock = clock
        self._sources: list[_Source] = []
        self._followed: set[tuple[str, int]] = set()  # (task, attempt) of every source: one lookup per new task
        self._changed: set[_Source] = set()  # written to since the last sweep (added to by the writers' threads)
        self._queue: deque[_Source] = deque()  # the logs to read, in turn (the pump's thread only)
        # Whose reader may hold a descriptor (at most OPEN_FILES + 1), least recently active first.
        self._open: dict[_Source, None] = {}
        self._looks: list[tuple[float, int, _Source]] = []  # a heap: when each source is looked at next
        self._look_order = itertools.count()  # breaks ties in the heap
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._written = threading.Event()  # a log was written to since the pump last looked
        self._thread: threading.Thread | None = None
        self.attempt = 1  # the attempt tflaunch's own messages belong to
        # tflaunch's own messages waiting for the pump's thread: (time, attempt, text). The supervisor
        # that says one never waits for a sweep, however far behind a flood the pump is.
        self._messages: deque[tuple[float, int, bytes]] = deque()
        # Why the run's own files could not be written (a full disk, a removed folder): the run
        # stops its tasks and reports it. Set once; the pump then only drains the task files.
        self._failure: str | None = None
        self._failure_lock = threading.Lock()

    # -- sources ------------------------------------------------------------------------

    def follow(self, name: str, path: Path | str, attempt: int = 1, created: bool = False,
               relayed: bool = False, mode: int | None = None) -> None:
        """Start reading a task's log back, and keep it within the size limit from now on (whoever
        appends to it through :data:`~launcher.records.boundedlog.WRITING`). ``created``: the file
        was just made by :meth:`RunFolder.create_task_log`, whose path the transports name it by too;
        otherwise it is made here if missing, and its path resolved.
        ``relayed``: its output will come through tflaunch (a transport relays it), so its writes are
        announced from the first: it is looked at for other writers only every RELAYED_CHECK.
        ``mode``: of the files its log makes (None: its folder's file mode, looked up at each).

        A task restarted in place appends to the file already followed: it is not read twice.
        """
        with self._lock:
            if (name, attempt) in self._followed:
                return
            if not created:
                os.close(open_own(path, os.O_RDONLY | os.O_CREAT))
            log = BoundedLog(path, self.log_max_size, mode)
            source = _Source(name, attempt, log, log.reader(), last_output=time.monotonic(), relayed=relayed)
            log.on_write = functools.partial(self._announce, source)
            WRITING.add(log, str(path) if created else None)
            self._sources.append(source)
            self._followed.add((name, attempt))
            heapq.heappush(self._looks, (0.0, next(self._look_order), source))
        self._written.set()  # looked at once at the next sweep
        self.console.register([name])

    def finish_all(self) -> None:
        """Read every source to its end, emit partial last lines, stitch each log, stop following them."""
        with self._lock:
            try:
                self._write_messages()
            except OSError as exc:
                self._failed(exc)
            for source in self._sources:
                source.log.on_write, source.done = None, True
                try:
                    self._read(source, force=True)
                    self._emit(source, source.splitter.flush_block())
                except OSError as exc:
                    self._failed(exc)
                source.reader.release()
                WRITING.remove(source.log)
                try:
                    source.log.close()
                except OSError as exc:
                    self._failed(exc)
            self._sources.clear()
            self._followed.clear()
            self._changed.clear()
            self._queue.clear()
            self._open.clear()
            self._looks.clear()
            try:
                self.files.flush()
            except OSError as exc:
                self._failed(exc)

    def read_out(self, names: Iterable[str], attempt: int) -> None:
        """Read now what the tasks ``names`` of ``attempt`` wrote: they ended, and their output must
        reach the console before their end does (the console then shows what waited on them). Their
        agent sent all of it before word of the end, so all of it is in their logs by now."""
        wanted = set(names)
        with self._lock:
            for source in self._sources:
                if source.attempt == attempt and source.name in wanted and not source.done:
                    try:
                        self._read(source, force=True)
                    except OSError as exc:
                        self._failed(exc)

    # -- thread -------------------------------------------------------------------------

    def start(self) -> "OutputPump":
        self._thread = threading.Thread(target=self._run, name="tflaunch-output", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._written.set()
        if self._thread:
            self._thread.join()
        self.finish_all()
        for exc in self.files.close():  # the last buffered bytes did not fit on the disk
            self._failed(exc)

    def _run(self) -> None:
        # At most one sweep per interval, busy or not: a flood is then read in large blocks, each
        # costing one prefix, one metric scan and one console entry however many lines it holds.
        # A quiet run wakes only when a log is written to or a look is due.
        while not self._stop.is_set():
            self._written.clear()  # before the sweep: a write announced during it wakes the next one
            try:
                with self._lock:
                    self._write_messages()
                    self._sweep()
                    self._write_messages()
                    self.files.flush()
            except OSError as exc:
                self._failed(exc)
            self._stop.wait(self.interval)
            looks = self._looks
            self._written.wait(max(0.0, looks[0][0] - time.monotonic()) if looks else QUIET_CHECK)

    def _announce(self, source: _Source) -> None:
        """A writer's thread wrote to ``source``'s log: read it at the next sweep, and wake the pump."""
        self._changed.add(source)
        if not self._written.is_set():
            self._written.set()

    def _sweep(self) -> None:
        """Read the logs written to since the last sweep, and look at those due a look (see IDLE_CHECK)."""
        changed, queue = self._changed, self._queue
        while changed:
            source = changed.pop()  # the writers' threads only add: what they add now is read now or next time
            if not source.queued and not source.done:
                source.queued, source.relayed = True, True
                queue.append(source)
        budget = _SWEEP_AT_MOST
        while queue and budget > 0:
            source = queue.popleft()
            source.queued = False
            if not source.done:
                budget -= self._read(source)
        now, looks, due = time.monotonic(), self._looks, []
        while looks and looks[0][0] <= now:
            due.append(heapq.heappop(looks)[2])
        spacing = len(self._sources) / LOOKS_PER_SECOND
        for source in due:
            if source.done:
                continue
            self._read(source)
            if source.relayed:
                wait = max(RELAYED_CHECK, spacing)
            else:
                wait = max(QUIET_CHECK, spacing) if now - source.last_output >= QUIET else IDLE_CHECK
            heapq.heappush(looks, (now + wait, next(self._look_order), source))
        if queue:
            self._written.set()  # the next sweep comes without waiting for a write

    @property
    def failure(self) -> str | None:
        """``<path>: <reason>`` of the first write to the run's files that failed; None while all is well."""
        with self._failure_lock:
            return self._failure

    def _failed(self, exc: OSError) -> None:
        """Remember the first write failure."""
        with self._failure_lock:
            if self._failure is None:
                where = exc.filename or self.files.merged.path
                self._failure = f"{where}: {exc.strerror or exc}"

    # -- lines --------------------------------------------------------------------------

    def message(self, text: str) -> None:
        """Record one of tflaunch's own messages in merged.log (the console shows it separately): by
        the pump's thread at its next turn, or at once when that thread is not running."""
        self._messages.append((self.clock(), self.attempt, text.encode() + b"\n"))
        thread = self._thread
        if thread is not None and thread.is_alive() and not self._stop.is_set():
            self._written.set()
            return
        with self._lock:
            try:
                self._write_messages()
                self.files.flush()
            except OSError as exc:
                self._failed(exc)

    def _write_messages(self) -> None:
        """Write the messages said since the last turn into merged.log (under the pump's lock)."""
        messages = self._messages
        while messages:
            said_at, attempt, text = messages.popleft()
            self.files.lines(LAUNCHER_NAME, attempt, text, said_at)

    def _read(self, source: _Source, force: bool = False) -> int:
        """Read what ``source`` wrote since last time, up to its share of a sweep (``force``: all of
        it, then close it); returns how many bytes. A log with more to read waits in line again."""
        now = time.monotonic()
        reader = source.reader
        active = False  # opened or read from now: it moves to the end of the open ones
        if not reader.is_open:
            if not reader.available():
                return 0
            self._make_room()
            source.last_output, active = now, True
        budget = _READ_PER_SWEEP
        while force or budget > 0:
            skipped, chunk = reader.read(_READ_SIZE if force else min(_READ_SIZE, budget))
            if skipped:
                self._skipped(source, skipped)
            if not chunk:
                break
            active = True
            source.last_output = now
            budget -= len(chunk)
            self._emit(source, source.splitter.feed_block(chunk))
            if self._messages:  # said while this log was read: in merged.log where they were said
                self._write_messages()
        else:
            if not source.queued:  # its share of this sweep is read: the rest at a later one
                source.queued = True
                self._queue.append(source)
        if force:
            reader.release()
        elif reader.is_open and active:
            self._open.pop(source, None)
            self._open[source] = None
        return _READ_PER_SWEEP - budget

    def _make_room(self) -> None:
        """Before a reader opens its file: close the least recently active one if OPEN_FILES are open
        (the first in :attr:`_open`; a reader that closed itself is only dropped from it)."""
        while len(self._open) >= OPEN_FILES:
            oldest = next(iter(self._open))
            del self._open[oldest]
            if oldest.reader.is_open:
                oldest.reader.release()

    def _skipped(self, source: _Source, count: int) -> None:
        """Output gone from the task's log before the pump read it: merged.log says so, in place."""
        self._emit(source, source.splitter.flush_block())
        self.files.lines(LAUNCHER_NAME, source.attempt,
                         f"{source.name}: {count:,} bytes ({format_size(count)}) of its output left out here: "
                         f"{MERGED} fell behind, and {source.name}'s log keeps its latest output\n".encode())

    def _emit(self, source: _Source, block: bytes) -> None:
        """Route a block of complete lines: merged.log, metrics.jsonl, console."""
        if not block:
            return
        self.files.lines(source.name, source.attempt, block)
        # the one place metric lines are read; the arrival time times Keras's epochs where it rounds
        source.keras, records = metric_lines(block, source.keras, time.time())
        if records:
            self.files.records(source.name, source.attempt, records)
            if not source.oversized and (size := oversized(block, records)):
                source.oversized = True
                self._say(f"{source.name} printed a metric line of {size:,} bytes, over the limit of "
                          f"{format_size(LINE_MAX)}: such lines are no metrics (not in {METRICS} nor "
                          f"shown as figures); the logs keep them")
            # The console needs a record's single figures only: a list of 10,000 values is no figure.
            records = [(index, record if record is None else scalars(record)) for index, record in records]
        # Only queued here: the console's own thread writes it, so a closed or stalled terminal
        # never holds up the files, the metrics or the supervisor.
        self.console.task_block(source.name, block, source.attempt, records)

    def _say(self, text: str) -> None:
        """One of tflaunch's messages said by the pump (its thread): on the console and in merged.log."""
        self.console.message(text)
        self.files.lines(LAUNCHER_NAME, self.attempt, text.encode() + b"\n")
