"""One signal path: SIGINT, SIGTERM, SIGHUP and SIGQUIT handled in one place, from start to exit.

Until the tflaunch command starts a run, nothing exists that a signal must stop: from the
package's first statements (see :mod:`launcher`) a watched signal ends the process at once with
128+N. A run (and ``tflaunch tensorboard``) installs :data:`SIGNALS`, whose handler then does one
of two things, depending on whether the run is under way:

- **armed** (from the moment a run starts until it has finished its run folder): it never raises.
  It records the signal and writes a byte to a wakeup pipe. The supervisor, the restart delay
  and every other wait of a run block on :meth:`Signals.wait`, so they wake at once, stop the
  tasks by the shutdown protocol and finish the run folder; a second signal while stopping
  skips the grace period;
- **idle** (after the run, while its summary is written; an instance made for one call, such as
  the Python API's, before its run): it raises :class:`Interrupted`, which the CLI's error
  boundary turns into a quiet exit 128+N.

An exception raised from a handler lands at whatever bytecode runs: between ``Popen`` returning
and its handle being stored, in a ``finally``, inside a library, in a callback where Python prints
and drops it (an import's module-lock callback), or wrapped in another error (``__set_name__``).
A flag cannot lose a task, and before a run an exit at once has nothing to lose.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
from typing import Iterator

from ... import WATCHED_SIGNALS

WATCHED = tuple(signal.Signals(signum) for signum in WATCHED_SIGNALS)


class Interrupted(Exception):
    """A signal arrived while no run was under way; the process should exit 128+N."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def wait_readable(fds: tuple[int, ...], seconds: float | None) -> set[int]:
    """Those of ``fds`` with something to read (or at their end), once one has or ``seconds`` have
    passed (None: however long it takes). poll, not select: select refuses a descriptor numbered
    1024 or more, and a run of many hosts holds thousands (three per host)."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return {fd for fd, _ in poller.poll(None if seconds is None else seconds * 1000)}


class Signals:
    """The signals received so far, and a pipe that becomes readable when one arrives."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.armed = False
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)
        self._installed = False

    # -- installing -----------------------------------------------------------------------

    def install(self) -> None:
        """Take over the watched signals (main thread only; elsewhere a no-op)."""
        if self._installed or threading.current_thread() is not threading.main_thread():
            return
        for signum in WATCHED:
            signal.signal(signum, self._handle)
        self._installed = True

    def watch(self, *signums: int) -> None:
        """Route further signals through the same path (e.g. a batch scheduler's warning signal).

        Like the watched ones, they raise :class:`Interrupted` while idle and only record and wake
        waiters during a run. Main thread only; elsewhere a no-op.
        """
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in signums:
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        self.received.append(signum)
        try:
            os.write(self._write_fd, b"!")
        except OSError:
            pass  # the pipe is full: it is readable already, which is all a waiter needs
        if not self.armed:
            raise Interrupted(signum)

    @contextlib.contextmanager
    def armed_for_run(self) -> Iterator["Signals"]:
        """While a run is under way: record signals, never raise."""
        self.armed = True  # before the handler is in: from its first moment it only records
        try:
            self.install()
            yield self
        finally:
            self.armed = False

    # -- asking ---------------------------------------------------------------------------

    @property
    def first(self) -> int | None:
        """The first signal received, which decides the exit code; None when none came."""
        return self.received[0] if self.received else None

    @property
    def count(self) -> int:
        return len(self.received)

    def wait(self, seconds: float, also: tuple[int, ...] = ()) -> int | None:
        """Sleep up to ``seconds``, waking at once when a signal arrives (or any of the descriptors
        ``also`` becomes readable); the first signal or None."""
        if not self.received and seconds > 0:
            try:
                wait_readable((self._read_fd, *also), seconds)
            except InterruptedError:
                pass
        self._drain()
        return self.first

    def close(self) -> None:
        """Close the wakeup pipe (an instance made for one call; the process-wide one stays open)."""
        for fd in (self._read_fd, self._write_fd):
            try:
                os.close(fd)
            except OSError:
                pass

    def _drain(self) -> None:
        try:
            while os.read(self._read_fd, 4096):
                pass
        except (BlockingIOError, OSError):
            pass


SIGNALS = Signals()  # the process-wide instance the CLI installs first thing
