"""Tasks on other hosts: one ssh connection per host, and on it the host agent (:mod:`launcher.agent`)
that starts and watches every task of that host.

Using the user's own ssh means their ~/.ssh/config, agent, ProxyJump and ControlMaster apply. One
connection per host (not per task) keeps a run within sshd's stock limits (MaxStartups 10:30:100,
MaxSessions 10), however many tasks a host has. Because closing an ssh channel does not kill a
remote process, the agent's stdin is the control channel:

- ``terminate``/``kill`` are commands on it; each task's output comes back on the
  agent's stdout, framed, and tflaunch writes it into the task's log;
- if tflaunch dies (even by SIGKILL) the connection closes, the agent reads EOF and stops every
  task within its grace period;
- both sides send heartbeats, four to a keep-alive timeout (:func:`launcher.agent.protocol.beat_for`; resource
  samples are spaced out in a run of many hosts, :func:`launcher.agent.protocol.sample_for`): the agent stops
  its tasks when tflaunch falls silent, tflaunch declares the host lost when the agent does (ssh's
  ServerAlive probes end the client too).

Every value that crosses the remote shell is quoted with ``shlex.quote``; argv and env travel
inside base64 that no shell interprets. Only ``setup`` is shell by design, and it has no part in
the channel: nothing but the agent reads from or writes to it (see :func:`agent_command`). The
setup line itself comes first on the channel, read by the remote shell line by line (the ``read``
builtin takes no byte more than a line), so that it is on no command line: the local ssh client's
is readable by every user of this machine for the run's whole length, and the remote shell's by
every user of the host.
"""

from __future__ import annotations

import functools
import os
import shlex
from collections.abc import Hashable, Sequence

from ..agent.protocol import beat_for, sample_for
from ..cluster.plan import TaskLaunch
from ..cluster.spec import DEFAULT_CONNECT_TIMEOUT, DEFAULT_KEEPALIVE_TIMEOUT, SshSettings
from ..options import RunOptions
from .backend import AgentBackend
from .base import ExitStatus
from .carriers import Carrier, ProcessCarrier, spawn_carrier
from .hostlink import AgentLink
from .linkhub import HUB
from .shipping import agent_payload, agent_spec, stdin_agent_argv

# In the remote shell, the setup line's output file: written through SETUP_OUT, read by the agent
# through SETUP_IN (see agent_command).
SETUP_OUT, SETUP_IN = 5, 6


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


def agent_command(first: TaskLaunch, grace: float, hosts: int = 1) -> str:
    """The shell line the remote login shell runs: cd, the host's setup, then the agent.

    The setup line runs in that shell, so that what it exports reaches the agent and the tasks,
    but the agent's channel (the shell's stdin and stdout) is not its: its stdin is /dev/null, and
    it writes, as does any job it leaves running, to a private temporary file (unlinked at once)
    that the agent reads and relays as the host's output (or, if the setup fails, the shell copies
    to ssh's stderr; where mktemp is missing, the setup writes there directly). A line printed
    after the agent started can therefore never land among the agent's frames."""
    ssh = first.ssh or SshSettings()
    keepalive = ssh.keepalive_timeout or DEFAULT_KEEPALIVE_TIMEOUT
    spec = agent_spec(grace, keepalive, sample=sample_for(hosts), setup_log=SETUP_IN if first.setup else None,
                      beat=beat_for(hosts, keepalive))
    agent = f"{_quoted_agent(first.python)} {shlex.quote(spec)}"
    # cd may fail (each task's own workdir is checked when it starts): the agent runs regardless.
    parts = [f"cd -- {shlex.quote(first.workdir)} 2>/dev/null"]
    if first.setup:
        # The setup line's lines, counted, ahead of the agent on stdin (setup_preamble).
        parts.append('tflaunch_lines=; IFS= read -r tflaunch_n || exit 1; while [ "$tflaunch_n" -gt 0 ] && '
                     'IFS= read -r tflaunch_line; do tflaunch_lines="$tflaunch_lines$tflaunch_line\n"; '
                     'tflaunch_n=$((tflaunch_n - 1)); done')
        parts.append(f'tflaunch_setup=$(mktemp 2>/dev/null) && exec {SETUP_OUT}>"$tflaunch_setup" '
                     f'{SETUP_IN}<"$tflaunch_setup" && rm -f -- "$tflaunch_setup" || exec {SETUP_OUT}>&2 {SETUP_IN}</dev/null')
        # A setup that fails ends the connection: what it said goes to ssh's stderr, where
        # tflaunch reads why a host could not start.
        parts.append(f'{{ eval "$tflaunch_lines"\n}} </dev/null >&{SETUP_OUT} 2>&{SETUP_OUT} {SETUP_IN}<&- '
                     f"|| {{ tflaunch_setup=$?; cat <&{SETUP_IN} >&2; exit $tflaunch_setup; }}")
        parts.append(f"exec {agent} {SETUP_OUT}>&-")
    else:
        parts.append(f"exec {agent}")
    return "; ".join(parts)


@functools.lru_cache(maxsize=None)
def _quoted_agent(python: str) -> str:
    """The agent's command line, quoted once per interpreter; the agent itself comes on its stdin
    (:func:`agent_link`)."""
    return shlex.join(stdin_agent_argv(python))


def agent_link(launch: TaskLaunch, carrier: Carrier, read_fd: int, write_fd: int, hosts: int) -> AgentLink:
    """The link to the agent that :func:`agent_command` starts, over ``carrier``'s channel: the
    agent goes out first on it."""
    settings = launch.ssh or SshSettings()
    keepalive = settings.keepalive_timeout or DEFAULT_KEEPALIVE_TIMEOUT
    return AgentLink(launch.host, carrier, read_fd, write_fd, keepalive=keepalive, hub=HUB,
                     beat=beat_for(hosts, keepalive), preamble=setup_preamble(launch.setup) + agent_payload())


def setup_preamble(setup: str | None) -> bytes:
    """The host's setup line as :func:`agent_command`'s shell reads it from the channel: the number
    of its lines, then its lines; nothing when there is none."""
    if not setup:
        return b""
    lines = setup.split("\n")
    return f"{len(lines)}\n{setup}\n".encode()


def host_key(launch: TaskLaunch) -> tuple:
    """Tasks that share this key share one connection and one agent."""
    ssh = launch.ssh or SshSettings()
    return (launch.host, ssh.user, ssh.port, ssh.identity_file, tuple(ssh.options))


class SshCarrier(ProcessCarrier):
    """The agent on the far end of one ssh connection."""

    kind = "ssh"

    def not_started(self, detail: str) -> ExitStatus:
        if self.popen.poll() == 255:
            return ExitStatus(error=f"cannot reach {self.host} over ssh ({detail})")
        return ExitStatus(error=f"could not start on {self.host} ({detail})", error_code=self.popen.poll() or 255)

    def lost(self, detail: str) -> ExitStatus:
        return ExitStatus(error=f"lost connection to {self.host} ({detail})")


class SshTransport(AgentBackend):
    """Starts each remote task through its host's agent, one ssh connection per host."""

    kind = "ssh"

    def __init__(self, options: RunOptions):
        super().__init__(options)
        self.hosts = 1  # how many hosts the run has: heartbeats and samples are spaced out by it

    def host_key(self, launch: TaskLaunch) -> Hashable:
        return host_key(launch)

    def prepare(self, launches: Sequence[TaskLaunch]) -> None:
        """Open every host's connection at once, so they come up in parallel."""
        self.hosts = max(self.hosts, len({host_key(launch) for launch in self.mine(launches)}))
        super().prepare(launches)

    def cannot_connect(self, exc: OSError) -> str:
        if isinstance(exc, FileNotFoundError):
            return "cannot start: the ssh client is not installed"
        raise exc

    def connect(self, launch: TaskLaunch) -> AgentLink:
        argv = ssh_argv(launch.host, launch.ssh or SshSettings(), agent_command(launch, self.grace, self.hosts))
        popen, stderr, read_fd, write_fd = spawn_carrier(argv)
        return agent_link(launch, SshCarrier(launch.host, popen, stderr), read_fd, write_fd, self.hosts)
