"""How a host agent's channel is carried (a local pipe, one ssh connection, a connection back
from a Slurm step), and how a link's failures are worded for that carrier."""

from __future__ import annotations

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

    def extra_backstop(self, pid: int | None) -> None:
        """A task ignored KILL: what tflaunch itself can still do about it."""


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
