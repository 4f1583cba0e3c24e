"""Tasks on this machine: every one of them runs under one host agent (:mod:`launcher.agent`), a
child of tflaunch.

The agent's stdin is a pipe only tflaunch writes to: when tflaunch dies (even by SIGKILL) the agent
reads EOF and stops every task's whole tree within ``EOF_GRACE``. Each task's output comes back over
the agent's channel, as on any other host, and tflaunch appends it to the task's log, which it
keeps within its size limit (:mod:`launcher.records.boundedlog`). The agent is a child subreaper,
so it also finds what a task started in a session of its own, and stops it when the task ends.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence

from ..agent.protocol import EOF_GRACE, OWNER_VARIABLE, encode_fields
from ..cluster.machine import restore_open_files_limit
from ..cluster.plan import TaskLaunch
from ..cluster.tfconfig import tf_config_parts
from ..options import RunOptions
from .base import ExitStatus, FailedStart
from .carriers import ProcessCarrier, spawn_carrier
from .hostlink import AgentLink
from .linkhub import HUB
from .proxies import AgentTask, LogWriter
from .shipping import AGENT_MAIN, AGENT_PACKAGE

# The local agent's keep-alive timeout: tflaunch alive but no longer answering (wedged, suspended).
KEEPALIVE_TIMEOUT = 30.0
# On this machine the agent's package is imported as it is, not bundled, so that its compiled form
# is Python's cache. The folder above it goes at the end of sys.path (the standard library must win
# over any module there), and the package is imported by its own name: launcher's __init__ stays out.
AGENT_BOOT = (f"import sys; sys.path.append({str(AGENT_PACKAGE.parent)!r}); "
              f"from {AGENT_PACKAGE.name} import {AGENT_MAIN}; {AGENT_MAIN}.main()")


class LocalCarrier(ProcessCarrier):
    """The agent as a child process of tflaunch."""

    kind = "agent"

    def __init__(self, popen: subprocess.Popen[bytes], stderr_fd: int):
        super().__init__("this machine", popen, stderr_fd)

    def detail(self) -> str | None:
        code = self.popen.poll()
        if code is not None and code < 0:
            return f"the agent was killed by signal {-code}"
        return super().detail()

    def where(self, reason: str) -> str:
        return reason

    def not_started(self, detail: str) -> ExitStatus:
        return ExitStatus(error=f"the agent for this machine's tasks did not start it ({detail})")

    def lost(self, detail: str) -> ExitStatus:
        return ExitStatus(error=f"the agent in front of the task ended ({detail}); the task was stopped with it")

    def extra_backstop(self, pid: int | None, ident: int) -> None:
        kill_group(pid, ident)  # the agent cannot (it is gone or wedged): the task's own group goes


class LocalTransport:
    """Runs every local task of a run under one agent, with tflaunch's environment plus the planned env."""

    def __init__(self, options: RunOptions):
        self.grace = options.grace
        self.link: AgentLink | None = None
        self.logs = LogWriter()

    def prepare(self, launches: Sequence[TaskLaunch]) -> None:
        """Start the agent now: its interpreter starts while tflaunch sets the run up, not when the
        first task is due. An agent that cannot start is reported by the tasks' own starts."""
        try:
            self.link_for(launches[0])
        except OSError:
            pass

    def start(self, launch: TaskLaunch, log_path: str) -> AgentTask | FailedStart:
        tf_config, env = tf_config_parts(launch.env)  # the link sends the cluster to the agent once
        fields = {"name": launch.name, "argv": list(launch.argv), "env": env, "tf_config": tf_config,
                  "cwd": launch.workdir, "grace": repr(float(self.grace)), "netns": " ".join(launch.netns) or None,
                  "watch": "1" if launch.watched else None,
                  "gpus": ",".join(map(str, launch.gpus)) if launch.watched and launch.gpus else None}
        try:
            link = self.link_for(launch)
        except OSError as exc:
            return FailedStart(f"cannot start the agent for this machine's tasks: {exc.strerror or exc}")
        task = AgentTask(link, launch.name, log_path, self.logs)
        try:
            link.start(task, fields)
        except ValueError as exc:  # a NUL, or more than one command line carries: nothing was sent
            return FailedStart(f"cannot start: {exc}")
        return task

    def link_for(self, launch: TaskLaunch) -> AgentLink:
        """The agent of this machine's tasks (started on first use)."""
        if self.link is None or self.link.gone:
            self.link = self._connect()
        return self.link

    def _connect(self) -> AgentLink:
        spec = encode_fields({"keepalive": KEEPALIVE_TIMEOUT, "eof_grace": min(self.grace, EOF_GRACE), "sample": 1.0})
        # -I -S: the agent needs nothing but the standard library, and starts in half the time.
        popen, stderr, read_fd, write_fd = spawn_carrier([sys.executable, "-I", "-S", "-c", AGENT_BOOT, spec])
        restore_open_files_limit(popen.pid)  # the tasks get the user's limit, not tflaunch's raised one
        self.link = AgentLink("this machine", LocalCarrier(popen, stderr), read_fd, write_fd,
                              keepalive=KEEPALIVE_TIMEOUT, hub=HUB)
        return self.link

    def close(self) -> None:
        """End of the run: the agent gets EOF, stops whatever is left, and exits."""
        if self.link is not None:
            self.link.close()
            self.link = None
        self.logs.close()


def kill_group(pid: int | None, ident: int) -> None:
    """SIGKILL to the process group of the task ``ident`` on this machine, led by ``pid``, only
    while /proc shows that group is still the task's: the process at ``pid`` carries the task's
    mark (the agent's ``OWNER_VARIABLE``, the task's id) and leads its own group. The agent, not
    tflaunch, reaps the task, so by now the number may name another process, another user's too."""
    if pid is None or not _is_task_leader(pid, ident):
        return
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _is_task_leader(pid: int, ident: int) -> bool:
    """Whether the process at ``pid`` carries the mark of task ``ident`` and leads its own group."""
    mark = f"{OWNER_VARIABLE}={ident}".encode()
    try:
        with open(f"/proc/{pid}/environ", "rb") as environ:
            if mark not in environ.read().split(b"\0"):
                return False
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[2] == str(pid).encode()
    except (OSError, IndexError):
        return False
