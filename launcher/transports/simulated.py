"""Simulated hosts, for tests and benchmarks only: every host a run would reach over ssh is an
agent on this machine instead, a child of tflaunch, carried over pipes exactly as ssh would carry
it, without ssh.

Set ``TFLAUNCH_SIMULATE_HOSTS=1`` in tflaunch's environment (see :data:`launcher.transports.SIMULATE_HOSTS`)
and the ``ssh`` transport becomes this one. Each host's agent gets the very command line the
host's login shell would run (``cd``, the host's ``setup``, the agent with its spec; see
:func:`.ssh.agent_command`), run by ``/bin/sh`` here, so everything on tflaunch's side is the
real code: the links and their hub, the agent protocol, the supervisor, the session and the run
folder. Only ssh is missing, so a thousand hosts cost a thousand agent processes and no sshd.
Host names are labels: they need not resolve, and the tasks all run on this machine.

A simulated host is lost the way a real one is: its agent falls silent (SIGSTOP it) for the
keep-alive timeout, or its channel closes (kill it). Its tasks then go with it: tflaunch stops
their process groups itself, as it does for this machine's own agent.
"""

from __future__ import annotations

import os
import signal

from ..cluster.machine import restore_open_files_limit
from ..cluster.plan import TaskLaunch
from .carriers import spawn_carrier
from .hostlink import AgentLink
from .local import kill_group
from .ssh import SshCarrier, SshTransport, agent_command, agent_link


class SimulatedCarrier(SshCarrier):
    """A simulated host's agent: worded as an ssh connection, but a local process."""

    def close(self, wait: float) -> None:
        try:
            os.kill(self.popen.pid, signal.SIGCONT)  # a stopped agent could never read its EOF
        except ProcessLookupError:
            pass
        super().close(wait)

    def extra_backstop(self, pid: int | None, ident: int) -> None:
        kill_group(pid, ident)  # the task runs here: its group goes when its agent cannot stop it


class SimulatedTransport(SshTransport):
    """The ssh transport with each host's agent started here, over pipes, instead of through ssh."""

    def connect(self, launch: TaskLaunch) -> AgentLink:
        popen, stderr, read_fd, write_fd = spawn_carrier(["/bin/sh", "-c", agent_command(launch, self.grace,
                                                                                         self.hosts)])
        restore_open_files_limit(popen.pid)  # as a real host's: the user's limit, not tflaunch's raised one
        return agent_link(launch, SimulatedCarrier(launch.host, popen, stderr), read_fd, write_fd, self.hosts)
