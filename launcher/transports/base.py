"""The one interface every transport implements, and the facts a run needs of every transport.

A run (:mod:`launcher.run`) sees a transport only through what is here and the package's
:class:`~launcher.transports.TransportSet`: :class:`Transport` and the :class:`HostLink` it gives
for a host, the :class:`TaskProcess` it starts, the :class:`ExitStatus` and :class:`Reading` such a
process reports, and the descriptors a transport keeps open (:data:`OPEN_LOGS`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from ..records.exits import exit_words

if TYPE_CHECKING:
    from ..cluster.plan import TaskLaunch

# Exit code for a task that could not be started or reached (as shells use 127 and ssh 255).
CANNOT_START = 127
UNREACHABLE = 255
OPEN_LOGS = 16  # log files of relayed tasks a transport keeps open at once; the others are reopened on output


@dataclass(frozen=True)
class ExitStatus:
    """How a task ended: an exit code, a signal, or a transport error (never two of them)."""

    code: int | None = None
    signal: int | None = None
    error: str | None = None  # the task never ran or its host was lost: not the task's own exit
    error_code: int = UNREACHABLE
    # tflaunch's stop (SIGTERM) is what ended the process; False: it ended on its own
    termed: bool = field(default=False, compare=False)

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

    def describe(self, stopped: bool = False) -> str:
        """In words (:func:`launcher.records.exits.exit_words`); ``stopped``: tflaunch stopped the task."""
        return exit_words(self.code, self.signal, self.error, stopped)


# ThreadTimes and Reading are named tuples: a run makes one of each per task per sample, and a
# frozen dataclass takes three times as long to make.
class ThreadTimes(NamedTuple):
    """A watched task's threads since its agent began watching them (see the agent's ``ThreadWatch``)."""

    looks: int
    stalled: float  # over the looks, the sum of its threads seen sleeping on purpose or waiting for a disk
    cpu_looks: int = 0  # looks at its CPUs (every census of its threads but the first)
    cpu_lost: float = 0.0  # over them, the sum of the share of its CPUs others took while it waited for one
    gpu_looks: int = 0  # looks at its GPUs (none without GPUs or NVML)
    gpu_slowdown: float = 0.0  # over them, the sum of how much slower than its peak its slowest GPU ran, throttled
    gpu_stale: int = 0  # looks at its GPUs at which NVML had not answered within its deadline


class Reading(NamedTuple):
    """One sample of a task's process tree, as its host agent took it."""

    pid: int | None
    rss_bytes: int
    cpu_seconds: float  # CPU time the tree has used so far (its reaped children's included)
    processes: int
    at: float  # time.time() when it arrived
    threads: ThreadTimes | None = None  # a task watched for the straggler rule
    waited_seconds: float = 0.0  # time its processes' main threads were runnable but waited for a CPU, so far


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

    def cleanup(self) -> None:
        """After the task ended: make sure nothing it started is left running."""

    def dump_stacks(self, timeout: float = 10.0) -> str:
        """The Python stacks of every thread of the task's processes, without changing the task."""

    def reading(self) -> Reading | None:
        """The newest sample of the task's CPU and memory (its host agent takes them), if any."""


class HostLink(Protocol):
    """tflaunch's end of one host's agent (:class:`launcher.transports.hostlink.AgentLink`), as far
    as a run uses it besides starting tasks."""

    def pick_ports(self, count: int, timeout: float, stopped: Callable[[], bool] = lambda: False) -> list[int]:
        """``count`` free ports on the host, picked by its agent and held there until the tasks that
        use them start; OSError when the agent cannot answer within ``timeout`` seconds, or once
        ``stopped()`` says the run was stopped meanwhile."""

    def start(self, process: Any, fields: dict[str, object]) -> None:
        """Start ``process`` (a task or a helper such as a probe) on the agent with ``fields``."""


class Transport(Protocol):
    """Starts tasks of one kind (local, ssh, srun), whose stdout and stderr its agents relay to
    tflaunch, which appends them to each task's log. A transport holds one agent per host for the
    whole run."""

    def prepare(self, launches: Sequence[TaskLaunch]) -> None:
        """Before an attempt starts its tasks: bring up every host's agent at once."""

    def start(self, launch: TaskLaunch, log_path: str) -> TaskProcess:
        """Start ``launch`` through its host's agent, its output appended to the regular file at
        ``log_path`` (opened only while written to: a task costs tflaunch no descriptor); a task that
        cannot even be created is a :class:`FailedStart`, never an exception."""

    def link_for(self, launch: TaskLaunch) -> HostLink:
        """The link to the agent on ``launch``'s host, brought up first if it is not up yet."""

    def addresses(self) -> Mapping[str, str]:
        """{host: address} where a host's tasks are reached now, for hosts whose address may change
        during a run (a node that joined again from a new one); the next attempt is planned there."""

    def close(self) -> None:
        """End of the run: every agent and connection goes; nothing is left on any host."""
