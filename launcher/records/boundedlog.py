"""Log files that stop growing at a size limit: the start of the output, a marker line, the latest output.

A week-long run may print without end, so each task's log and ``merged.log`` have a limit
(``--log-max-size``, :data:`launcher.options.LOG_MAX_SIZE` by default, per task log, and the same
for ``debug.log``, :mod:`.trace`; :data:`MERGED_SHARE` times that for ``merged.log``). Up to its
limit a log is one plain file, as if there were none. Past it:

- the file keeps its first quarter of the limit (the head: start-up errors), cut after a line end,
  and then one marker line;
- the output from there on goes to part files beside it, ``<name>.part-<offset>`` (``offset``:
  where in the output the part starts), each an eighth of the other three quarters; the oldest part
  is deleted once the newer ones hold three quarters of the limit (the tail: the crash);
- when the log is closed the parts are stitched: the file becomes head + marker + tail (the last
  three quarters of the limit, from a line start), and the marker says exactly how many bytes of
  output were left out between the two.

A file is only ever appended to or replaced by a rename, so every file is readable text at every
moment; each byte is written once to a part, and the head is copied when the log first spills and
again, with the tail, when it is closed: the cost follows the bytes written, not the file's size. A
killed tflaunch leaves the head and a marker in the file and the latest output in its parts (shown
by :mod:`.logview` as head + marker + tail; the next writer of the file, e.g. a requeued Slurm job's
``merged.log``, stitches it first).

:data:`WRITING` lists the logs this process writes by their real path, so that relayed output (the
transports' log writer) and the pump that reads it back share one :class:`BoundedLog` per file.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Callable

from .files import NEW_FILE, create_beside, open_own
from .logformat import ALIGN, HEAD_LABEL, MARKER, copy_range, part_path, running_marker, stitch, stitch_leftovers

MERGED_SHARE = 4  # merged.log may grow to this many times the per-task limit: it carries every task, prefixed
HEAD_SHARE = 4  # the head is a quarter of the limit, the tail the rest
PARTS = 8  # the tail is kept in parts of an eighth of it
# Parts a reader (the pump) has not read yet are kept beyond the tail, up to this much or the limit,
# whichever is more (but not more than LAG_PARTS parts' worth): a reader that falls behind a burst
# catches up instead of skipping what it missed.
LAG_ALLOWANCE = 64 << 20
LAG_PARTS = 512

_APPEND = os.O_WRONLY | os.O_CREAT | os.O_APPEND
IOV_MAX = 1024  # pieces one writev takes on Linux
# A marker line of either kind; group 1: the count, group 2: " so far" on a live log's marker.


class BoundedLog:
    """One log file kept within ``max_size`` bytes (see the module docstring). Thread-safe: the
    transports append relayed output while the pump reads it back with a :class:`Reader`."""

    def __init__(self, path: Path | str, max_size: int, mode: int | None = None):
        self.path = Path(path)
        self.max_size = max_size
        self.mode = mode  # of every file it makes (None: its folder's file mode)
        self.head_size = max_size // HEAD_SHARE
        self.tail_size = max_size - self.head_size
        self.part_size = max(1, self.tail_size // PARTS)
        self.lock = threading.Lock()
        self.written = 0  # bytes of output so far
        self.head_end: int | None = None  # once spilled: where the head ends (the file holds it and the marker)
        self.parts: list[list[int]] = []  # [start, size] of the parts kept, oldest first; the last is written to
        self.closed = False
        self._fd: int | None = None  # write descriptor of the file or the newest part, when open
        self.generation = 0  # counts the files written to: a reader knows when its file is complete
        self.readers: list[Reader] = []  # parts they have not read yet are kept, up to ``lag_allowance`` more
        self.lag_allowance = max(max_size, min(LAG_ALLOWANCE, LAG_PARTS * self.part_size))
        self._kept = 0  # the bytes the parts hold
        self.key = ""  # its real path, once WRITING has it
        self.on_write: Callable[[], None] | None = None  # told after each write: the pump reads only what changed
        self.written = _size(self.path)  # an existing file's bytes count as the first output
        if self.written:  # only a file with bytes can be a killed writer's live log: made whole first
            stitch_leftovers(self.path, self.tail_size)
            self.written = _size(self.path)

    # -- writing ------------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        """Append ``data`` to the log; past the limit, to its parts."""
        view = memoryview(data)
        with self.lock:
            if self.closed:  # a late word after the close: appended as it is
                self._fd = open_own(self.path, _APPEND, self.mode)
                self._write_all(self._fd, view)
                self.release_locked()
                return
            while view:
                if self.head_end is None:
                    room = self.max_size - self.written
                    if room <= 0:
                        self._spill()
                        continue
                else:
                    room = self.part_size - self.parts[-1][1]
                    if room <= 0:
                        self._next_part()
                        continue
                piece = view[:room]
                self._write_all(self._current_fd(), piece)
                if self.head_end is not None:
                    self.parts[-1][1] += len(piece)
                    self._kept += len(piece)
                self.written += len(piece)
                view = view[len(piece):]
        if self.on_write is not None:
            self.on_write()

    def write_pieces(self, pieces: list[bytes | memoryview]) -> None:
        """Append several pieces: in one system call when they fit under the limit (the common case)."""
        with self.lock:
            fits = not self.closed and self.head_end is None and \
                self.written + sum(map(len, pieces)) <= self.max_size
            if fits:
                fd = self._current_fd()
                for start in range(0, len(pieces), IOV_MAX):
                    batch = pieces[start:start + IOV_MAX]
                    done = os.writev(fd, batch)
                    self.written += done
                    if done < sum(map(len, batch)):  # a short write: the rest one piece at a time
                        rest = memoryview(b"".join(batch))[done:]
                        self._write_all(fd, rest)
                        self.written += len(rest)
                return
        for piece in pieces:
            self.write(piece)

    def release(self) -> None:
        """Close the write descriptor until the next write (descriptors are kept for the busiest logs)."""
        with self.lock:
            self.release_locked()

    def release_locked(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def close(self) -> None:
        """Stitch head, marker and tail into the file and delete the parts; nothing to do under the limit."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            self.release_locked()
            if self.head_end is None:
                return
            # the same stitch that repairs a killed writer's log
            stitch(self.path, self.head_end, [(start, part_path(self.path, start)) for start, _ in self.parts],
                   self.written, self.tail_size, self.mode)
            self.parts = []

    def _current_fd(self) -> int:
        if self._fd is None:
            target = self.path if self.head_end is None else part_path(self.path, self.parts[-1][0])
            self._fd = open_own(target, _APPEND, self.mode)
        return self._fd

    @staticmethod
    def _write_all(fd: int, view: memoryview) -> None:
        while view:
            view = view[os.write(fd, view):]

    def _spill(self) -> None:
        """The file is full: its head and a marker go to a new file renamed over it, while the old
        file, kept under a part's name, holds the output until newer parts hold the tail."""
        self.release_locked()
        head_end = self._head_cut()
        fd, spare = create_beside(self.path, HEAD_LABEL, self.mode)
        with open(fd, "wb") as new, open(os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as old:
            copy_range(old.fileno(), 0, head_end, new.fileno())
            new.write(running_marker(0, self.path.name))
        first = part_path(self.path, 0)
        try:
            os.link(self.path, first)  # two names for a moment, so the file is never missing
        except OSError:
            os.rename(self.path, first)
        os.replace(spare, self.path)
        self.head_end = head_end
        self.parts, self._kept = [[0, self.written]], self.written
        self._next_part()

    def _head_cut(self) -> int:
        """Where the head ends: after the last line end in its last ALIGN bytes, else at its size;
        after a marker line the cut would split or drop (a file that was stitched before: its marker
        stays in the head, so the bytes it counts are still counted)."""
        end = self.head_size
        start = max(0, end - ALIGN)
        with open(self.path, "rb") as handle:
            window = os.pread(handle.fileno(), end - start + 256, start)
        for match in MARKER.finditer(window):
            at_line_start = match.start() == 0 or window[match.start() - 1] == 10
            if at_line_start and match.start() <= end - start < match.end():
                return start + match.end()
        cut = window.rfind(b"\n", 0, end - start)
        return start + cut + 1 if cut >= 0 else end

    def _next_part(self) -> None:
        """Start a part where the output is; delete the oldest while the newer ones hold the tail."""
        self.release_locked()
        self.parts.append([self.written, 0])
        self.generation += 1
        self._fd = open_own(part_path(self.path, self.written), NEW_FILE | os.O_APPEND, self.mode)
        dropped = False
        while len(self.parts) > 1 and self._kept - self.parts[0][1] >= self.tail_size:
            start, size = self.parts[0]
            unread = any(reader.offset < start + size for reader in self.readers)
            if unread and self._kept - self.tail_size <= self.lag_allowance:
                break
            self.parts.pop(0)
            self._kept -= size
            part_path(self.path, start).unlink(missing_ok=True)
            dropped = True
        if dropped:  # the marker says how much is gone so far: rewritten in place, same width
            fd = open_own(self.path, os.O_WRONLY)
            try:
                os.pwrite(fd, running_marker(max(0, self.parts[0][0] - self.head_end), self.path.name), self.head_end)
            finally:
                os.close(fd)

    # -- reading back (the pump) ----------------------------------------------------------------

    def reader(self) -> "Reader":
        """A reader of the output from its start; the parts it has not read are kept a while for it."""
        reader = Reader(self)
        with self.lock:
            self.readers.append(reader)
        return reader


class Reader:
    """Reads a :class:`BoundedLog`'s output back in order, from wherever it is kept now.

    A reader that falls so far behind that the bytes it needs were deleted with their part skips to
    the oldest part kept, and says how many bytes it skipped. Its one descriptor is closed with
    :meth:`release` (the pump keeps a few open) and reopened on the next read.
    """

    def __init__(self, log: BoundedLog):
        self.log = log
        self.offset = 0
        self._fd: int | None = None
        self._start = 0  # where in the output the open file starts
        self._end: int | None = None  # where it ends; None while it may still grow
        self._generation = -1  # the log's generation when the open file was its newest

    @property
    def is_open(self) -> bool:
        return self._fd is not None

    def available(self) -> bool:
        """Whether the log has output this reader has not read. Under the limit the file says (it
        may also be appended to directly); past it, the log's own count."""
        log = self.log
        if log.head_end is None:
            return _size(log.path) > self.offset
        return not log.closed and log.written > self.offset

    def read(self, size: int) -> tuple[int, bytes]:
        """(skipped, data): up to ``size`` bytes from where the reader is; empty when nothing is new."""
        log, skipped = self.log, 0
        with log.lock:
            while True:
                if self._fd is None:
                    skipped += self._open()
                    if self._fd is None:
                        return skipped, b""
                if self._end is not None and self.offset >= self._end:
                    self.release()
                    continue
                want = size if self._end is None else min(size, self._end - self.offset)
                data = os.pread(self._fd, want, self.offset - self._start)
                if data:
                    self.offset += len(data)
                    return skipped, data
                if self._end is None and self._generation != log.generation:
                    self._end = self.offset  # no longer written to: what it holds is all it will
                    continue
                return skipped, b""

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _open(self) -> int:
        """Open the file that holds the reader's offset (under the log's lock); returns bytes skipped."""
        log = self.log
        if log.head_end is None or log.closed:
            path, start, end = log.path, 0, None
            if log.closed and log.head_end is not None:
                return 0  # stitched: what the reader has not read is gone from the parts
        elif self.offset < log.head_end:
            path, start, end = log.path, 0, log.head_end
        else:
            skipped = 0
            first = log.parts[0][0]
            if self.offset < first:
                skipped, self.offset = first - self.offset, first
            start = next(s for s, size in reversed(log.parts) if s <= self.offset)
            newest = start == log.parts[-1][0]
            size = next(size for s, size in log.parts if s == start)
            path, end = part_path(log.path, start), (None if newest else start + size)
            self._open_path(path, start, end)
            return skipped
        self._open_path(path, start, end)
        return 0

    def _open_path(self, path: Path, start: int, end: int | None) -> None:
        try:
            self._fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:  # not created yet
            return
        self._start, self._end, self._generation = start, end, self.log.generation


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


class Writing:
    """The bounded logs this process writes, by real path (one per file, shared by its writers)."""

    def __init__(self) -> None:
        self._logs: dict[str, BoundedLog] = {}
        self._dirs: dict[str, str] = {}  # folder -> its real path: a run's task logs share a few folders
        self._lock = threading.Lock()

    def add(self, log: BoundedLog, real_path: str | None = None) -> None:
        with self._lock:  # under its real path: the caller's, when it has it (its writers name it so)
            log.key = real_path or self._real(log.path)
            self._logs[log.key] = log

    def remove(self, log: BoundedLog) -> None:
        with self._lock:
            if self._logs.get(log.key) is log:
                del self._logs[log.key]

    def get(self, path: str) -> BoundedLog | None:
        with self._lock:
            return self._logs.get(path) or self._logs.get(self._real(path))

    def _real(self, path: Path | str) -> str:
        folder, name = os.path.split(os.path.abspath(path))
        real = self._dirs.get(folder)
        if real is None:
            real = self._dirs[folder] = os.path.realpath(folder)
        full = os.path.join(real, name)
        return os.path.realpath(full) if os.path.islink(full) else full


WRITING = Writing()
