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
inside a base64 JSON argument that no shell interprets. Only ``setup`` is shell by design.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shlex
import subprocess
import tempfile
import time
from pathlib import Path

from ..cluster.spec import SshSettings
from ..cluster.plan import TaskLaunch
from .base import ExitStatus, FailedStart

AGENT_SOURCE = (Path(__file__).with_name("agent.py")).read_text()
AGENT_MARK = "TFLAUNCH_AGENT"
DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_KEEPALIVE_TIMEOUT = 15.0
HEARTBEAT_INTERVAL = 1.0
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
    """The agent's one argument: base64 JSON of argv, env, grace and heartbeat timeout."""
    spec = {"argv": list(launch.argv), "env": dict(launch.env), "grace": min(grace, EOF_GRACE), "timeout": timeout}
    return base64.b64encode(json.dumps(spec).encode()).decode()


def remote_command(launch: TaskLaunch, grace: float) -> str:
    """The shell line the remote login shell runs: cd, optional setup, then the agent."""
    ssh = launch.ssh or SshSettings()
    encoded = agent_argument(launch, grace, ssh.keepalive_timeout or DEFAULT_KEEPALIVE_TIMEOUT)
    parts = [f"cd -- {shlex.quote(launch.workdir)}"]
    if launch.setup:
        parts.append(launch.setup)
    parts.append(f"exec {shlex.quote(launch.python)} -c {shlex.quote(AGENT_SOURCE)} {encoded}")
    return " && ".join(parts)


class SshProcess:
    """A remote task seen through its ssh client and agent."""

    channel = "ssh"  # the client's name in the task's log; subclasses (srun) reword the link's failures

    def __init__(self, launch: TaskLaunch, popen: subprocess.Popen[bytes], stderr_file, output_fd: int):
        self.launch = launch
        self.popen = popen
        self.pid: int | None = popen.pid  # the local ssh client
        self._stderr = stderr_file
        self._output_fd = output_fd
        self._last_heartbeat = time.monotonic()
        self._kill_deadline: float | None = None
        self._status: ExitStatus | None = None
        fcntl.fcntl(popen.stdin.fileno(), fcntl.F_SETFL, os.O_NONBLOCK)

    def poll(self) -> ExitStatus | None:
        if self._status is not None:
            return self._status
        now = time.monotonic()
        if now - self._last_heartbeat >= HEARTBEAT_INTERVAL:
            self._last_heartbeat = now
            self._send(b"\n")
        if self._kill_deadline is not None and now > self._kill_deadline:
            self.popen.kill()  # the agent could not be told; the closed connection stops it
        returncode = self.popen.poll()
        if returncode is None:
            return None
        self._status = self._read_status(returncode)
        return self._status

    def terminate(self) -> None:
        self._send(b"TERM\n")

    def kill(self) -> None:
        self._send(b"KILL\n")
        self._close_stdin()
        self._kill_deadline = time.monotonic() + EOF_GRACE

    def send_signal(self, signum: int) -> None:
        self._send(f"SIG {int(signum)}\n".encode())

    def dump_stacks(self, timeout: float = 10.0) -> str:
        """Ask the agent for a py-spy dump; it arrives on the client's stderr between marks."""
        self._stderr.seek(0, os.SEEK_END)
        start = self._stderr.tell()
        self._send(b"DUMP\n")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            os.lseek(self._stderr.fileno(), start, os.SEEK_SET)
            text = os.read(self._stderr.fileno(), 1 << 22).decode("utf-8", "replace")
            begin, end = f"{AGENT_MARK} stacks-begin\n", f"{AGENT_MARK} stacks-end"
            if begin in text and end in text:
                return text.split(begin, 1)[1].split(end, 1)[0]
            time.sleep(0.1)
        return f"no stack dump: no answer from the agent on {self.launch.host} within {timeout:g} s\n"

    def cleanup(self) -> None:
        self._close_stdin()  # EOF: the agent stops whatever is left of the task
        if self.popen.poll() is None:
            try:
                self.popen.wait(timeout=EOF_GRACE + 2)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        if self._output_fd >= 0:
            os.close(self._output_fd)
            self._output_fd = -1

    def _send(self, data: bytes) -> None:
        stdin = self.popen.stdin
        if stdin is None or stdin.closed:
            return
        try:
            os.write(stdin.fileno(), data)
        except (BrokenPipeError, BlockingIOError, OSError):
            pass  # the client is gone or busy; its exit status tells the rest

    def _close_stdin(self) -> None:
        if self.popen.stdin and not self.popen.stdin.closed:
            try:
                self.popen.stdin.close()
            except OSError:
                pass

    def _read_status(self, returncode: int) -> ExitStatus:
        self._stderr.seek(0)
        text = self._stderr.read().decode("utf-8", "replace")
        self._stderr.close()
        while f"{AGENT_MARK} stacks-begin" in text:  # stack dumps were collected already
            before, _, rest = text.partition(f"{AGENT_MARK} stacks-begin")
            text = before + rest.partition(f"{AGENT_MARK} stacks-end")[2]
        lines = text.splitlines()
        marks = [line[len(AGENT_MARK) + 1:] for line in lines if line.startswith(AGENT_MARK + " ")]
        other = [line for line in lines if not line.startswith(AGENT_MARK) and line.strip()]
        if other and self._output_fd >= 0:
            # ssh's and the remote shell's own messages belong in the task's log too.
            os.write(self._output_fd, "".join(f"[{self.channel} {self.launch.host}] {line}\n" for line in other).encode())
        host = self.launch.host
        detail = other[-1].strip() if other else f"{self.channel} exited with {returncode}"
        for mark in reversed(marks):
            if mark.startswith("exit code="):
                return ExitStatus(code=int(mark.split("=", 1)[1]))
            if mark.startswith("exit signal="):
                return ExitStatus(signal=int(mark.split("=", 1)[1]))
            if mark.startswith("error "):
                return ExitStatus(error=f"{mark[6:]} on {host}", error_code=127)
        if any(mark.startswith("started") for mark in marks):
            return self._lost(detail if other else None)
        return self._not_started(returncode, detail)

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


class SshTransport:
    """Starts each remote task as ``ssh HOST <agent>`` with output into the task's log file."""

    def __init__(self, grace: float = 5.0):
        self.grace = grace

    def start(self, launch: TaskLaunch, output_fd: int) -> SshProcess | FailedStart:
        stderr_file = tempfile.TemporaryFile()
        argv = ssh_argv(launch.host, launch.ssh or SshSettings(), remote_command(launch, self.grace))
        try:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=output_fd,
                stderr=stderr_file,
                start_new_session=True,  # terminal signals reach tflaunch only; it stops tasks in order
                close_fds=True,
            )
        except FileNotFoundError:
            stderr_file.close()
            return FailedStart("cannot start: the ssh client is not installed")
        return SshProcess(launch, popen, stderr_file, os.dup(output_fd))
