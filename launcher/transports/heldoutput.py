"""A child's output held in memory within a bound: its start, its latest lines, and the lines that matter.

What a carrier says is read to say why a host was lost or an agent never started: srun's own
output (its errors, ``Node failure on ...``), an ssh client's or the local agent's stderr. However
much the child prints, what is held (:class:`HeldText`) is at most a head of its start, a tail of
its latest lines and :data:`KEPT` lines that ``keep`` picks (each cut at :data:`LINE_MAX`), plus
the count of bytes left out between the head and the tail, as a task's log keeps its start, a
marker and its end. srun writes into a pipe that a thread drains (:class:`HeldOutput`); an ssh
client's or the local agent's stderr is a pipe the link hub drains with the agent's channel
(:class:`launcher.transports.carriers.ProcessCarrier`).
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


class HeldText:
    """A child's output, fed with :meth:`take`, held as at most ``head`` bytes of its start,
    ``tail`` bytes of its latest lines and the lines ``keep`` picks. Thread-safe."""

    def __init__(self, keep: Callable[[str], bool] | None = None, head: int = HEAD, tail: int = TAIL):
        self.keep = keep
        self.head_size, self.tail_size = head, tail
        self.head = b""
        self.tail: deque[bytes] = deque()  # the latest lines, ``\n`` included
        self._tail_size = 0
        self.left_out = 0  # bytes between the head and the tail
        self.kept: list[str] = []
        self._partial = b""
        self._lock = threading.Lock()

    def take(self, data: bytes) -> None:
        with self._lock:
            self._take(data)

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

    def _take(self, data: bytes) -> None:
        *lines, self._partial = (self._partial + data).split(b"\n")
        if len(self._partial) > LINE_MAX:  # a line without end: its start is kept, the rest left out
            self.left_out += len(self._partial) - LINE_MAX
            self._partial = self._partial[:LINE_MAX]
        for line in lines:
            if self.keep is not None and len(self.kept) < KEPT:
                text = line[:LINE_MAX].decode("utf-8", "replace")
                if self.keep(text):
                    self.kept.append(text)
            line += b"\n"
            if not self.tail and len(self.head) + len(line) <= self.head_size:
                self.head += line
                continue
            self.tail.append(line[-self.tail_size:])
            self.left_out += len(line) - len(self.tail[-1])
            self._tail_size += len(self.tail[-1])
            while self._tail_size > self.tail_size and len(self.tail) > 1:
                dropped = self.tail.popleft()
                self._tail_size -= len(dropped)
                self.left_out += len(dropped)


class HeldOutput(HeldText):
    """Give :attr:`fd` to the child as its stdout and stderr, then call :meth:`started`: a thread
    drains the pipe into what is held."""

    def __init__(self, keep: Callable[[str], bool]):
        super().__init__(keep)
        self._read, self.fd = os.pipe()
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

    def _drain(self) -> None:
        try:
            while data := os.read(self._read, 1 << 16):
                self.take(data)
        except OSError:
            pass
        finally:
            os.close(self._read)
