"""The console's end of a stream: written straight to its file descriptor, never blocking the run's exit.

:class:`Sink` is one stream the console's writer thread writes to; a closed pipe or a hung-up
terminal silences it (and points the descriptor at /dev/null, so the interpreter's exit flush stays
quiet). :func:`wants_colour` says whether a stream gets colour.

A sink that writes to a regular file (the ``slurm-<job>.out`` of ``tflaunch submit``, ``tflaunch
... > out.txt``) can be given a limit: it writes the file up to a quarter of the limit (bytes
already in it count: a requeued job appends), cut at a line end, then one line saying that the
task lines from there on are left out of it; it keeps the last :data:`FILE_TAIL` bytes of them
in memory (or three quarters of the limit, when less), and when the console closes writes a
marker line saying how many bytes were left out, then those last lines. Writes marked ``always``
(tflaunch's own messages) go to the file as they come. A tflaunch killed before it closes leaves
no tail: merged.log has every line.
"""

from __future__ import annotations

import os
import select
import stat
from collections import deque
from typing import IO, Any, Mapping

from ...records.boundedlog import HEAD_SHARE
from ...records.logformat import final_marker, format_size
from ...records.folder import MERGED

FILE_TAIL = 1 << 20  # the last task lines a console file gets at the end, held in memory until then


def wants_colour(stream: IO[Any], environ: Mapping[str, str] = os.environ) -> bool:
    """Colour on a terminal, unless ``NO_COLOR`` is set to anything (https://no-color.org)."""
    return _isatty(stream) and not environ.get("NO_COLOR")


def _isatty(stream: IO[Any]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


class Sink:
    """One stream the writer thread writes to: straight to its file descriptor when it has one.

    Raw descriptor writes hold no lock of the stream object, so a write stuck on a stalled
    terminal cannot block the interpreter's own flush of ``sys.stdout`` at exit.
    """

    def __init__(self, stream: IO[str], file_limit: int | None = None):
        self.stream = stream
        self.tty = _isatty(stream)
        self.closed = False
        self.encoding = getattr(stream, "encoding", None) or "utf-8"
        self.utf8 = self.encoding.lower().replace("-", "").replace("_", "") == "utf8"
        self.fd: int | None = None
        try:
            stream.flush()
            self.fd = stream.fileno()
        except (AttributeError, OSError, ValueError):
            pass
        self.bound: FileBound | None = None
        if file_limit and self.fd is not None and not self.tty:
            try:
                info = os.fstat(self.fd)
            except OSError:
                info = None
            if info is not None and stat.S_ISREG(info.st_mode):
                self.bound = FileBound(file_limit, info.st_size)

    def write(self, data: bytes, always: bool = False) -> None:
        """Write UTF-8 ``data`` (re-encoded when the stream wants another encoding); to a bounded
        file, within its limit unless ``always``."""
        if self.closed or not data:
            return
        if self.bound is not None and not always:
            data = self.bound.take(data)
            if not data:
                return
        self._write(data)

    def finish(self) -> None:
        """The console is closing: a bounded file gets its marker and the last task lines."""
        bound, self.bound = self.bound, None
        if bound is not None and not self.closed:
            self._write(bound.ending())

    def _write(self, data: bytes) -> None:
        try:
            if self.fd is None:
                self.stream.write(data.decode("utf-8", "replace"))
                self.stream.flush()
                return
            if not self.utf8:
                data = data.decode("utf-8", "replace").encode(self.encoding, "replace")
            view = memoryview(data)
            while view:
                try:
                    view = view[os.write(self.fd, view):]
                except BlockingIOError:  # a descriptor someone set non-blocking: wait until it drains
                    select.select([], [self.fd], [], 1.0)
        except (OSError, ValueError):
            # Closed pipe (EPIPE), hung-up terminal (EIO), closed stream: nobody reads any more.
            self.closed = True
            self._silence()

    def _silence(self) -> None:
        """Point a closed stdout or stderr at /dev/null, so the interpreter's exit flush stays quiet."""
        if self.fd not in (1, 2):
            return
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.fd)
            os.close(devnull)
        except OSError:
            pass


def terminal_width(sink: Sink) -> int:
    try:
        return os.get_terminal_size(sink.fd).columns if sink.fd is not None else 80
    except OSError:
        return 80


class FileBound:
    """What of a console's task lines a regular file gets: its head as they come, then (at the end)
    a marker and their tail (see the module docstring). Only the console's writer thread uses it."""

    def __init__(self, limit: int, already: int):
        self.head_room = max(0, limit // HEAD_SHARE - already)
        self.tail_size = min(FILE_TAIL, limit - limit // HEAD_SHARE)
        self.full = False
        self.left_out = 0  # bytes past the head, the tail among them
        self.tail: deque[bytes] = deque()
        self.tail_held = 0

    def take(self, data: bytes) -> bytes:
        """The part of ``data`` to write now (the rest is held or left out)."""
        if not self.full:
            if len(data) <= self.head_room:
                self.head_room -= len(data)
                return data
            cut = data.rfind(b"\n", 0, self.head_room) + 1
            self.full, now, data = True, data[:cut], data[cut:]
            self._hold(data)
            return now + (f"tflaunch: this file reached its size limit: the task lines from here on are left out "
                          f"of it ({MERGED} has them all); the last {format_size(self.tail_size)} of them follow "
                          f"at the end\n").encode()
        self._hold(data)
        return b""

    def _hold(self, data: bytes) -> None:
        self.left_out += len(data)
        data = data[-self.tail_size:]
        self.tail.append(data)
        self.tail_held += len(data)
        while self.tail_held - len(self.tail[0]) >= self.tail_size:
            self.tail_held -= len(self.tail.popleft())

    def ending(self) -> bytes:
        """The marker and the tail, from a line start; empty when the head was never full."""
        if not self.full:
            return b""
        tail = b"".join(self.tail)[-self.tail_size:]
        if len(tail) < self.left_out:
            tail = tail[tail.find(b"\n") + 1:]  # its first line may be cut: left out too
        return final_marker(self.left_out - len(tail)) + tail
