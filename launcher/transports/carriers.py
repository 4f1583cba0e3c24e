"""How a host agent's channel is carried (a local pipe, one ssh connection, a connection back
from a Slurm step), how a link's failures are worded for that carrier, and how a carrier process
is started (:func:`spawn_carrier`)."""

from __future__ import annotations

import os
import subprocess
import threading

from .base import ExitStatus
from .heldoutput import HeldText

# What is held of a carrier's stderr (an ssh client's, the local agent's): its start and its latest
# lines, as a task's log keeps them, small enough for a thousand hosts (16 KiB each at most).
STDERR_HEAD = 4 << 10
STDERR_TAIL = 12 << 10


class Carrier:
    """How a link's channel is carried; subclasses word the link's failures."""

    kind = "agent"
    stderr_fd: int | None = None  # a descriptor the link hub reads with the channel (:meth:`drain`)
    said_all = True  # whether nothing more can come on it

    def __init__(self, host: str):
        self.host = host

    def drain(self) -> None:
        """Take what came on :attr:`stderr_fd`."""

    def release(self) -> None:
        """Close :attr:`stderr_fd` (the hub's thread, once nothing polls it)."""

    def ended(self) -> int | None:
        """The carrier process's exit code once it ended (None while it runs or has none)."""
        return None

    def detail(self) -> str | None:
        """The carrier's own last message (ssh's, srun's), if any."""
        return None

    def close(self, wait: float) -> None:
        """End the carrier: its channel is closed already, so the agent stops what is left."""

    def where(self, reason: str) -> str:
        """An agent's reason for not starting a process, naming the host where that says more."""
        return f"{reason} on {self.host}"

    def not_started(self, detail: str) -> ExitStatus:
        return ExitStatus(error=f"could not start on {self.host} ({detail})")

    def lost(self, detail: str) -> ExitStatus:
        return ExitStatus(error=f"lost the agent on {self.host} ({detail})")

    def extra_backstop(self, pid: int | None, ident: int) -> None:
        """The task ``ident`` (its leader's pid as the agent reported it) ignored KILL, or its agent
        is gone: what tflaunch itself can still do about it."""


class NodeCarrier(Carrier):
    """A carrier of an agent that dialled in from a node of its own (a joined node, a Ray node): its
    messages name the node as ``{name} ({where})``."""

    def __init__(self, host: str, name: str, where: str):
        super().__init__(host)
        self.name, self.place = name, where

    def where(self, reason: str) -> str:
        return f"{reason} on {self.name} ({self.place})"

    def not_started(self, detail: str) -> ExitStatus:
        return ExitStatus(error=f"could not start on {self.name} ({self.place}): {detail}")

    def lost(self, detail: str) -> ExitStatus:
        return ExitStatus(error=f"lost {self.name} ({self.place}: {detail})")


class ProcessCarrier(Carrier):
    """A carrier that is a child process of tflaunch (the local agent, an ssh client), whose stderr
    (its own messages) is a pipe held within a bound (:class:`.heldoutput.HeldText`): the link hub
    reads it whenever it has bytes (:meth:`drain`), with the agent's channel."""

    def __init__(self, host: str, popen, stderr_fd: int):
        """``stderr_fd``: the read end of the process's stderr, non-blocking."""
        super().__init__(host)
        self.popen = popen
        self.stderr_fd: int | None = stderr_fd
        self.said = HeldText(head=STDERR_HEAD, tail=STDERR_TAIL)
        self.said_all = False  # the process closed its stderr
        self._unwatched = False  # the hub let go of the pipe (see release)
        self._lock = threading.Lock()

    def ended(self) -> int | None:
        return self.popen.poll()

    def drain(self) -> None:
        """Take what the process has written to its stderr so far."""
        with self._lock:
            self.drain_locked()

    def drain_locked(self) -> None:
        while self.stderr_fd is not None and not self.said_all:
            try:
                data = os.read(self.stderr_fd, 1 << 16)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.said_all = True
                return
            self.said.take(data)

    def release(self) -> None:
        """The hub no longer watches the stderr pipe: closed once the process has ended (closed
        earlier, the process would meet a broken pipe on its way out), else by :meth:`close`."""
        with self._lock:
            self._unwatched = True
            if self.popen.poll() is not None:
                self._close_stderr()

    def _close_stderr(self) -> None:
        if self.stderr_fd is not None:
            self.drain_locked()
            os.close(self.stderr_fd)
            self.stderr_fd = None

    def detail(self) -> str | None:
        self.drain()
        lines = [line for line in self.said.lines() if line.strip()]
        return lines[-1].strip() if lines else None

    def close(self, wait: float) -> None:
        """Wait for the process to end (its channel is closed already); kill it if it does not."""
        try:
            self.popen.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            self.popen.kill()  # an ssh client: the connection closes and the agent sees EOF
            self.popen.wait()
        with self._lock:
            if self._unwatched:
                self._close_stderr()


def spawn_carrier(argv: list[str], **popen_options) -> tuple[subprocess.Popen, int, int, int]:
    """Start a carrier process (an ssh client, an agent) with its stdin and stdout as the channel:
    (its Popen, the read end of its stderr, the channel's read end, its write end), all three
    non-blocking.

    The descriptors are made by hand rather than by Popen's PIPE (which wraps each end in a file
    object, only for tflaunch to copy it and close it again): three system calls fewer per host.
    Its stderr (what an ssh client says about a failed connection: a few lines; whatever a host's
    login prints there, without end if it so chooses) is a pipe: no inode per host, and what it
    holds is bounded (:class:`ProcessCarrier`)."""
    said, stderr = os.pipe2(os.O_CLOEXEC)
    to_read, from_carrier = os.pipe2(os.O_CLOEXEC)
    to_carrier, to_write = os.pipe2(os.O_CLOEXEC)
    try:
        popen = subprocess.Popen(argv, stdin=to_carrier, stdout=from_carrier, stderr=stderr,
                                 start_new_session=True,  # terminal signals reach tflaunch only
                                 close_fds=True, **popen_options)
    except BaseException:
        for fd in (to_read, to_write, said):
            os.close(fd)
        raise
    finally:
        for fd in (from_carrier, to_carrier, stderr):
            os.close(fd)
    for fd in (said, to_read, to_write):
        os.set_blocking(fd, False)
    return popen, said, to_read, to_write
