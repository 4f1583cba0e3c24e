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
from collections.abc import Hashable

from ..agent.protocol import EOF_GRACE, OWNER_VARIABLE, encode_fields
from ..cluster.machine import restore_open_files_limit
from ..cluster.plan import TaskLaunch
from ..cluster.tfconfig import tf_config_parts
from .backend import AgentBackend
from .base import ExitStatus
from .carriers import ProcessCarrier, spawn_carrier
from .hostlink import AgentLink
from .linkhub import HUB
from .shipping import AGENT_BOOT, watch_fields, without_token

# The local agent's keep-alive timeout: tflaunch alive but no longer answering (wedged, suspended).
KEEPALIVE_TIMEOUT = 30.0
THIS_MACHINE = "this machine"  # how the local agent's host is named in its messages


class LocalCarrier(ProcessCarrier):
    """The agent as a child process of tflaunch."""

    kind = "agent"

    def __init__(self, popen: subprocess.Popen[bytes], stderr_fd: int):
        super().__init__(THIS_MACHINE, popen, stderr_fd)

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


class LocalTransport(AgentBackend):
    """Runs every local task of a run under one agent, with tflaunch's environment plus the planned env."""

    kind = "local"

    def host_key(self, launch: TaskLaunch) -> Hashable:
        return THIS_MACHINE  # one agent for every task here, whatever name the cluster gives this machine

    def fields(self, launch: TaskLaunch) -> dict[str, object]:
        tf_config, env = tf_config_parts(launch.env)  # the link sends the cluster to the agent once
        return {"name": launch.name, "argv": list(launch.argv), "env": env, "tf_config": tf_config,
                "cwd": launch.workdir, "grace": repr(float(self.grace)), "netns": " ".join(launch.netns) or None,
                **watch_fields(launch)}

    def cannot_connect(self, exc: OSError) -> str:
        return f"cannot start the agent for this machine's tasks: {exc.strerror or exc}"

    def connect(self, launch: TaskLaunch) -> AgentLink:
        """The agent of this machine's tasks, a child of tflaunch."""
        spec = encode_fields({"keepalive": KEEPALIVE_TIMEOUT, "eof_grace": min(self.grace, EOF_GRACE), "sample": 1.0})
        # -I -S: the agent needs nothing but the standard library, and starts in half the time.
        popen, stderr, read_fd, write_fd = spawn_carrier([sys.executable, "-I", "-S", "-c", AGENT_BOOT, spec],
                                                         env=without_token(os.environ))
        restore_open_files_limit(popen.pid)  # the tasks get the user's limit, not tflaunch's raised one
        return AgentLink(THIS_MACHINE, LocalCarrier(popen, stderr), read_fd, write_fd,
                         keepalive=KEEPALIVE_TIMEOUT, hub=HUB)


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
