"""Tasks on other hosts: the system ``ssh`` client, one connection per task, started in parallel.

Using the user's own ssh means their ~/.ssh/config, agent, ProxyJump and ControlMaster apply.
Each task runs under :mod:`agent` on its host, because closing an ssh channel does not
kill a remote process. The agent's stdin is a pipe only tflaunch writes to, so:

- ``terminate``/``kill``/``send_signal`` are commands written on that pipe;
- if tflaunch dies (even by SIGKILL) the pipe closes, ssh forwards EOF, and the agent stops
  the task within its grace period;
- tflaunch writes a heartbeat every second; if the link goes down the agent stops the task after
  ``keepalive_timeout``, and ssh's ServerAlive probes end the local client, so the loss is seen
  on both sides.

Every value that crosses the remote shell is quoted with ``shlex.quote``; argv and env travel
inside a base64 argument that no shell interprets. Only ``setup`` is shell by design.
"""

from __future__ import annotations

import os
import shlex
import subprocess

from ..cluster.spec import SshSettings
from ..cluster.plan import TaskLaunch
from .agentclient import AGENT_MARK, AGENT_SOURCE, AgentProcess, AgentReport, agent_spec, status_file
from .base import CANNOT_START, ExitStatus, FailedStart

__all__ = ["AGENT_MARK", "AGENT_SOURCE", "SshProcess", "SshTransport", "agent_argument", "remote_command", "ssh_argv"]

DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_KEEPALIVE_TIMEOUT = 15.0
EOF_GRACE = 3.0  # the agent's grace when tflaunch vanished: the remote tree is gone within ~3 s


def ssh_argv(host: str, settings: SshSettings, remote_command: str | None = None) -> list[str]:
    """The ssh command line for ``host``. The user's options come first: ssh keeps the first value."""
    argv = ["ssh", "-T", *settings.options]
    if settings.user:
        argv += ["-l", settings.user]
    if settings.port:
        argv += ["-p", str(settings.port)]
    if settings.identity_file:
        argv += ["-i", os.path.expanduser(settings.identity_file)]
    keepalive = settings.keepalive_timeout or DEFAULT_KEEPALIVE_TIMEOUT
    argv += [
        "-o", "BatchMode=yes",
        "-o", f"ConnectTimeout={max(1, round(settings.connect_timeout or DEFAULT_CONNECT_TIMEOUT))}",
        "-o", f"ServerAliveInterval={max(1, round(keepalive / 3))}",
        "-o", "ServerAliveCountMax=3",
        "-o", "LogLevel=ERROR",
        "--", host,
    ]
    if remote_command is not None:
        argv.append(remote_command)
    return argv


def agent_argument(launch: TaskLaunch, grace: float, timeout: float) -> str:
    """The agent's one argument: argv, env, the graces and the heartbeat timeout, base64-encoded."""
    return agent_spec(list(launch.argv), dict(launch.env), grace=grace, eof_grace=min(grace, EOF_GRACE),
                      timeout=timeout)


def remote_command(launch: TaskLaunch, grace: float) -> str:
    """The shell line the remote login shell runs: cd, optional setup, then the agent."""
    ssh = launch.ssh or SshSettings()
    encoded = agent_argument(launch, grace, ssh.keepalive_timeout or DEFAULT_KEEPALIVE_TIMEOUT)
    parts = [f"cd -- {shlex.quote(launch.workdir)}"]
    if launch.setup:
        parts.append(launch.setup)
    parts.append(f"exec {shlex.quote(launch.python)} -c {shlex.quote(AGENT_SOURCE)} {encoded}")
    return " && ".join(parts)


class SshProcess(AgentProcess):
    """A remote task seen through its ssh client and agent; ``pid`` is the local ssh client's."""

    channel = "ssh"  # the client's name in the task's log; subclasses (srun) reword the link's failures

    def __init__(self, launch: TaskLaunch, popen: subprocess.Popen[bytes], stderr_file, output_fd: int):
        if not isinstance(stderr_file, int):  # a file object: keep only a descriptor of our own
            fd = os.dup(stderr_file.fileno())
            stderr_file.close()
            stderr_file = fd
        super().__init__(launch, popen, stderr_file, output_fd)
        self.pid: int | None = popen.pid

    def _exit_status(self, report: AgentReport, returncode: int) -> ExitStatus:
        return ssh_exit_status(report, returncode, self.launch.host, self.channel, self._lost, self._not_started)

    def _lost(self, detail: str | None) -> ExitStatus:
        """The agent started the task, then the link to it ended without an exit report."""
        if detail is None:
            keepalive = (self.launch.ssh or SshSettings()).keepalive_timeout or DEFAULT_KEEPALIVE_TIMEOUT
            detail = f"no answer within the {keepalive:g} s keep-alive timeout, or the connection closed"
        return ExitStatus(error=f"lost connection to {self.launch.host} ({detail})")

    def _not_started(self, returncode: int, detail: str) -> ExitStatus:
        """The client ended before the agent reported the task started."""
        if returncode == 255:
            return ExitStatus(error=f"cannot reach {self.launch.host} over ssh ({detail})")
        return ExitStatus(error=f"could not start on {self.launch.host} ({detail})", error_code=returncode or 255)


def ssh_exit_status(report: AgentReport, returncode: int, host: str, channel: str, lost, not_started) -> ExitStatus:
    """How a remote task ended, from its agent's report and the client's exit code.

    An exit report wins; an agent's "cannot start" is the task's (127); a started task with no
    exit report means the link was lost; no report at all means the client never got through.
    """
    detail = report.other[-1].strip() if report.other else f"{channel} exited with {returncode}"
    if report.exit is not None:
        return report.exit
    if report.error is not None:
        return ExitStatus(error=f"{report.error} on {host}", error_code=CANNOT_START)
    if report.started is not None:
        return lost(detail if report.other else None)
    return not_started(returncode, detail)


class SshTransport:
    """Starts each remote task as ``ssh HOST <agent>`` with output into the task's log file."""

    def __init__(self, grace: float = 5.0):
        self.grace = grace

    def start(self, launch: TaskLaunch, output_fd: int) -> SshProcess | FailedStart:
        try:
            argv = ssh_argv(launch.host, launch.ssh or SshSettings(), remote_command(launch, self.grace))
        except ValueError as exc:
            return FailedStart(f"cannot start: {exc}")
        stderr_fd = status_file()
        try:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=output_fd,
                stderr=stderr_fd,
                start_new_session=True,  # terminal signals reach tflaunch only; it stops tasks in order
                close_fds=True,
            )
        except FileNotFoundError:
            os.close(stderr_fd)
            return FailedStart("cannot start: the ssh client is not installed")
        return SshProcess(launch, popen, stderr_fd, os.dup(output_fd))
