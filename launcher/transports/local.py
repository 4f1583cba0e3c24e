"""Tasks on this machine: one subprocess per task, in its own session and process group."""

from __future__ import annotations

import os
import signal
import subprocess

from ..cluster.plan import TaskLaunch
from .base import ExitStatus, FailedStart, py_spy_dump


class LocalProcess:
    """A task started with Popen; signals go to its whole process group."""

    def __init__(self, popen: subprocess.Popen[bytes], python: str | None = None):
        self.popen = popen
        self.pid: int | None = popen.pid
        self.python = python

    def poll(self) -> ExitStatus | None:
        returncode = self.popen.poll()
        return None if returncode is None else ExitStatus.from_returncode(returncode)

    def terminate(self) -> None:
        self._signal_group(signal.SIGTERM)

    def kill(self) -> None:
        self._signal_group(signal.SIGKILL)

    def send_signal(self, signum: int) -> None:
        try:
            self.popen.send_signal(signum)
        except ProcessLookupError:
            pass

    def dump_stacks(self, timeout: float = 10.0) -> str:
        return py_spy_dump(self.popen.pid, self.python, timeout)

    def cleanup(self) -> None:
        # The group outlives its leader when the task left children behind.
        self._signal_group(signal.SIGKILL)

    def _signal_group(self, signum: int) -> None:
        try:
            os.killpg(self.popen.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass  # already gone


class LocalTransport:
    """Runs tasks as children of tflaunch, inheriting its environment plus the planned env."""

    def __init__(self, grace: float = 5.0):
        self.grace = grace

    def start(self, launch: TaskLaunch, output_fd: int) -> LocalProcess | FailedStart:
        env = {**os.environ, **launch.env}
        try:
            popen = subprocess.Popen(
                list(launch.argv),
                cwd=launch.workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=output_fd,
                stderr=output_fd,
                start_new_session=True,  # own group: signals reach the task's children too
                close_fds=True,
            )
        except FileNotFoundError as exc:
            missing = launch.workdir if exc.filename == launch.workdir else launch.argv[0]
            what = "working directory" if missing == launch.workdir else "program"
            return FailedStart(f"cannot start: {what} {missing!r} not found")
        except PermissionError as exc:
            return FailedStart(f"cannot start {launch.argv[0]!r}: {exc.strerror}")
        return LocalProcess(popen, launch.python)
