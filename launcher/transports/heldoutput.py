"""A child's output held in memory within a bound: its start, its latest lines, and the lines that matter.

srun's own output (its errors, ``Node failure on ...``) is read to say why a node was lost or an
agent never connected. The child writes into a pipe that a thread drains, so however much it
prints, what is held is at most :data:`HEAD` bytes of its start, :data:`TAIL` bytes of its latest
lines and :data:`KEPT` lines that ``keep`` picks (each cut at :data:`LINE_MAX`), plus the count of
bytes left out between the head and the tail.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from typing import Callable

HEAD = 64 << 10
TAIL = 64 << 10
KEPT = 256  # lines picked by ``keep`` (srun names each lost node once)
LINE_MAX = 4096  # of a picked line, and of the line being read when it has no end yet


class HeldOutput:
    """Give :attr:`fd` to the child as its stdout and stderr, then call :meth:`started`."""

    def __init__(self, keep: Callable[[str], bool]):
        self._read, self.fd = os.pipe()
        self.keep = keep
        self.head = b""
        self.tail: deque[bytes] = deque()  # the latest lines, ``\n`` included
        self._tail_size = 0
        self.left_out = 0  # bytes between the head and the tail
        self.kept: list[str] = []
        self._partial = b""
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._drain, name="tflaunch-srun-output", daemon=True)

    def started(self) -> None:
        """The child has the write end: close ours (its end is the pipe's EOF), start draining."""
        os.close(self.fd)
        self._thread.start()

    def close(self) -> None:
        """Only when the child could not be started: no thread will close the read end."""
        for fd in (self.fd, self._read):
            try:
                os.close(fd)
            except OSError:
                pass

    def wait(self, timeout: float) -> None:
        """The child has ended: let the thread read what it wrote last (at most ``timeout`` seconds)."""
        if self._thread.is_alive():
            self._thread.join(timeout)

    def lines(self) -> list[str]:
        """Head, a marker when bytes were left out, then the latest lines."""
        with self._lock:
            head, tail, left_out, partial = self.head, b"".join(self.tail), self.left_out, self._partial
        marker = [f"[... {left_out:,} bytes left out here ...]"] if left_out else []
        return head.decode("utf-8", "replace").splitlines() + marker + \
            (tail + partial).decode("utf-8", "replace").splitlines()

    def picked(self) -> list[str]:
        with self._lock:
            return list(self.kept)

    def _drain(self) -> None:
        try:
            while data := os.read(self._read, 1 << 16):
                with self._lock:
                    self._take(data)
        except OSError:
            pass
        finally:
            os.close(self._read)

    def _take(self, data: bytes) -> None:
        *lines, self._partial = (self._partial + data).split(b"\n")
        if len(self._partial) > LINE_MAX:  # a line without end: its start is kept, the rest left out
            self.left_out += len(self._partial) - LINE_MAX
            self._partial = self._partial[:LINE_MAX]
        for line in lines:
            text = line[:LINE_MAX].decode("utf-8", "replace")
            if len(self.kept) < KEPT and self.keep(text):
                self.kept.append(text)
            line += b"\n"
            if not self.tail and len(self.head) + len(line) <= HEAD:
                self.head += line
                continue
            self.tail.append(line[-TAIL:])
            self.left_out += len(line) - len(self.tail[-1])
            self._tail_size += len(self.tail[-1])
            while self._tail_size > TAIL and len(self.tail) > 1:
                dropped = self.tail.popleft()
                self._tail_size -= len(dropped)
                self.left_out += len(dropped)
