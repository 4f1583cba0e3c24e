"""Tasks on this machine: each runs under the agent (:mod:`.agent`), a child of tflaunch.

The agent is what a remote task has in front of it too, so local and remote tasks end the same
way: its stdin is a pipe only tflaunch writes to, and when tflaunch dies (even by SIGKILL) the
agent reads EOF and stops the task's whole tree within ``EOF_GRACE``. As a child subreaper it
also finds processes the task started in sessions of their own, and stops them when the task ends.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from ..cluster.plan import TaskLaunch
from .agentclient import AGENT_PATH, AgentProcess, AgentReport, agent_spec, parse_agent_output, status_file
from .base import ExitStatus, FailedStart

EOF_GRACE = 1.0  # tflaunch is gone: the task's tree is gone within about this long (issue target: 2 s)
HEARTBEAT_TIMEOUT = 30.0  # a tflaunch that is alive but stopped answering (wedged, suspended)
STARTED_WAIT = 2.0  # how long ``pid`` waits for the agent to report the task's pid
# The agent imported as a module rather than run as a script, so that its compiled form is cached
# (about 2 ms of each task's start). Its folder goes at the end of sys.path: the standard library
# must win over any file next to it.
AGENT_BOOT = (f"import sys; sys.path.append({str(AGENT_PATH.parent)!r}); "
              f"import {AGENT_PATH.stem}; {AGENT_PATH.stem}.main()")


class LocalProcess(AgentProcess):
    """A local task seen through its agent; ``pid`` is the task's own process, not the agent's."""

    channel = "agent"

    def __init__(self, launch: TaskLaunch, popen: subprocess.Popen[bytes], status_fd: int, output_fd: int):
        super().__init__(launch, popen, status_fd, output_fd)
        self._pid: int | None = None

    @property
    def pid(self) -> int | None:
        """The task's pid (what CPU, memory and stack dumps are about), once the agent reported it."""
        deadline = time.monotonic() + STARTED_WAIT
        while self._pid is None:
            report = self._report or parse_agent_output(self._status_text())
            self._pid = report.started
            if self._pid is not None or self.popen.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.005)
        return self._pid

    def _exit_status(self, report: AgentReport, returncode: int) -> ExitStatus:
        if report.exit is None and report.error is None and report.started is not None and returncode < 0:
            # The agent itself was killed (by hand, or the OOM killer): the task went with it.
            return ExitStatus(error=f"the agent in front of the task was killed by signal {-returncode}; "
                                    "the task was stopped with it")
        return super()._exit_status(report, returncode)

    def _backstop(self) -> None:
        pid = self.pid
        if pid is not None:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        super()._backstop()


class LocalTransport:
    """Runs each task under an agent that is a child of tflaunch, with tflaunch's environment
    plus the planned env. ``enter`` is put before every task's argv (e.g. ``nsenter`` into the
    run's network namespace)."""

    def __init__(self, grace: float = 5.0, enter: tuple[str, ...] = ()):
        self.grace = grace
        self.enter = enter

    def start(self, launch: TaskLaunch, output_fd: int) -> LocalProcess | FailedStart:
        try:
            spec = agent_spec([*self.enter, *launch.argv], dict(launch.env), grace=self.grace,
                              eof_grace=min(self.grace, EOF_GRACE), timeout=HEARTBEAT_TIMEOUT, cwd=launch.workdir)
        except ValueError as exc:
            return FailedStart(f"cannot start: {exc}")
        status_fd = status_file()
        try:
            # -I -S: the agent needs nothing but the standard library, and starts in half the time.
            popen = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", AGENT_BOOT, spec],
                stdin=subprocess.PIPE,
                stdout=output_fd,
                stderr=status_fd,
                start_new_session=True,  # terminal signals reach tflaunch only; it stops tasks in order
                close_fds=True,
            )
        except OSError as exc:
            os.close(status_fd)
            return FailedStart(f"cannot start the agent for {launch.name}: {exc.strerror}")
        return LocalProcess(launch, popen, status_fd, os.dup(output_fd))
