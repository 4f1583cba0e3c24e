"""The one process interface every transport implements, and the exit status it reports."""

from __future__ import annotations

import signal as signal_module
from dataclasses import dataclass
from collections.abc import Sequence
from typing import Protocol

from ..cluster.plan import TaskLaunch

# Exit code for a task that could not be started or reached (as shells use 127 and ssh 255).
CANNOT_START = 127
UNREACHABLE = 255


@dataclass(frozen=True)
class ExitStatus:
    """How a task ended: an exit code, a signal, or a transport error (never two of them)."""

    code: int | None = None
    signal: int | None = None
    error: str | None = None  # the task never ran or its host was lost: not the task's own exit
    error_code: int = UNREACHABLE

    @property
    def ok(self) -> bool:
        return self.code == 0

    @property
    def shell_code(self) -> int:
        """The exit code a shell would report: 128+N for signal N."""
        if self.signal is not None:
            return 128 + self.signal
        if self.error is not None:
            return self.error_code
        return int(self.code or 0)

    def describe(self) -> str:
        if self.signal is not None:
            return f"killed by {signal_name(self.signal)}"
        if self.error is not None:
            return self.error
        return f"exit code {self.code}"


def signal_name(number: int) -> str:
    try:
        return signal_module.Signals(number).name
    except ValueError:
        return f"signal {number}"


@dataclass(frozen=True)
class Reading:
    """One sample of a task's process tree, as its host agent took it."""

    pid: int | None
    rss_bytes: int
    cpu_seconds: float  # CPU time the tree has used so far (its reaped children's included)
    processes: int
    at: float  # time.time() when it arrived


class FailedStart:
    """A task whose process could not even be created (missing program, missing workdir)."""

    pid = None
    leftovers: tuple[str, ...] = ()

    def __init__(self, reason: str):
        self.status = ExitStatus(error=reason, error_code=CANNOT_START)

    def poll(self) -> ExitStatus:
        return self.status

    def terminate(self) -> None:
        pass

    kill = cleanup = terminate

    def send_signal(self, signum: int) -> None:
        pass

    def dump_stacks(self, timeout: float = 10.0) -> str:
        return ""

    def reading(self) -> None:
        return None


class TaskProcess(Protocol):
    """A started task, wherever it runs."""

    pid: int | None  # the task's own process where tflaunch can see it (what CPU and memory are about)
    # Processes that outlived the task's main process and were stopped with it, as "sleep (pid
    # 4711)"; set once the task has ended and been cleaned up.
    leftovers: tuple[str, ...]

    def poll(self) -> ExitStatus | None:
        """The exit status once the task has ended (reaping it), else None."""

    def terminate(self) -> None:
        """Ask the whole task (its process group) to stop: SIGTERM."""

    def kill(self) -> None:
        """Stop the whole task now: SIGKILL."""

    def send_signal(self, signum: int) -> None:
        """Deliver ``signum`` to the task's main process (e.g. SIGUSR1 for stack dumps)."""

    def cleanup(self) -> None:
        """After the task ended: make sure nothing it started is left running."""

    def dump_stacks(self, timeout: float = 10.0) -> str:
        """The Python stacks of every thread of the task's processes, without changing the task."""

    def reading(self) -> Reading | None:
        """The newest sample of the task's CPU and memory (its host agent takes them), if any."""


class Transport(Protocol):
    """Starts tasks of one kind (local, ssh, srun) with stdout and stderr going to ``output_fd``
    (which the caller keeps and closes). A transport holds one agent per host for the whole run."""

    def prepare(self, launches: Sequence[TaskLaunch]) -> None:
        """Before an attempt starts its tasks: bring up every host's agent at once."""

    def start(self, launch: TaskLaunch, output_fd: int) -> TaskProcess:
        ...

    def close(self) -> None:
        """End of the run: every agent and connection goes; nothing is left on any host."""
