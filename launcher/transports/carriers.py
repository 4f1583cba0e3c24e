"""How a host agent's channel is carried (a local pipe, one ssh connection, a connection back
from a Slurm step), how a link's failures are worded for that carrier, and how a carrier process
is started (:func:`spawn_carrier`)."""

from __future__ import annotations

import os
import subprocess

from .base import ExitStatus


class Carrier:
    """How a link's channel is carried; subclasses word the link's failures."""

    kind = "agent"

    def __init__(self, host: str):
        self.host = host

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


class ProcessCarrier(Carrier):
    """A carrier that is a child process of tflaunch (the local agent, an ssh client) with its own
    messages in a file."""

    def __init__(self, host: str, popen, stderr):
        super().__init__(host)
        self.popen = popen
        self.stderr = stderr

    def ended(self) -> int | None:
        return self.popen.poll()

    def detail(self) -> str | None:
        self.stderr.seek(0)
        lines = [line for line in self.stderr.read().decode("utf-8", "replace").splitlines() if line.strip()]
        return lines[-1].strip() if lines else None

    def close(self, wait: float) -> None:
        """Wait for the process to end (its channel is closed already); kill it if it does not."""
        try:
            self.popen.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            self.popen.kill()  # an ssh client: the connection closes and the agent sees EOF
            self.popen.wait()


def spawn_carrier(argv: list[str], **popen_options) -> tuple[subprocess.Popen, object, int, int]:
    """Start a carrier process (an ssh client, an agent) with its stdin and stdout as the channel:
    (its Popen, its stderr file, the channel's read end, its write end), both non-blocking.

    The descriptors are made by hand rather than by Popen's PIPE (which wraps each end in a file
    object, only for tflaunch to copy it and close it again): three system calls fewer per host.
    Its stderr (what an ssh client says about a failed connection: a few lines) goes to a file in
    memory: a file on disk costs an inode per host, which on a filesystem that has just freed many
    (ext4 without a journal passes over each) takes a quarter of a millisecond and more."""
    stderr = open(os.memfd_create("tflaunch-carrier-stderr", os.MFD_CLOEXEC), "w+b")
    to_read, from_carrier = os.pipe2(os.O_CLOEXEC)
    to_carrier, to_write = os.pipe2(os.O_CLOEXEC)
    try:
        popen = subprocess.Popen(argv, stdin=to_carrier, stdout=from_carrier, stderr=stderr,
                                 start_new_session=True,  # terminal signals reach tflaunch only
                                 close_fds=True, **popen_options)
    except BaseException:
        for fd in (to_read, to_write):
            os.close(fd)
        stderr.close()
        raise
    finally:
        os.close(from_carrier)
        os.close(to_carrier)
    os.set_blocking(to_read, False)
    os.set_blocking(to_write, False)
    return popen, stderr, to_read, to_write
