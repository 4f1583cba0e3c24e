"""Tasks inside a Slurm allocation: each one a one-task job step on its node, started with ``srun``.

``srun --nodes=1 --ntasks=1 --nodelist=NODE --overlap ...`` puts the task in the job's cgroup,
accounts it, and makes it die with the job. In front of the task runs the same agent as for ssh
tasks (:mod:`.agent`); srun forwards its stdin to the step, so tflaunch supervises the task
exactly as it supervises a remote one (:class:`~.ssh.SshProcess`): TERM/KILL/SIG/DUMP commands and
a heartbeat on stdin, the exit status reported on stderr, and the task stopped by the agent when
srun or tflaunch vanish (stdin EOF). A srun killed outright also ends its step: Slurm cleans it up.

Only how the link fails reads differently: a step that started and lost its srun without an exit
report means the node was lost; a step that never started names srun's own error.
"""

from __future__ import annotations

import os
import subprocess
import tempfile

from ..cluster.plan import TaskLaunch
from .base import CANNOT_START, ExitStatus, FailedStart
from .ssh import AGENT_SOURCE, DEFAULT_KEEPALIVE_TIMEOUT, SshProcess, agent_argument

NODE_FAILURE = "Node failure on"  # how srun reports that slurmctld declared the task's node dead


def srun_argv(launch: TaskLaunch, grace: float) -> list[str]:
    """The srun command that runs the agent (and through it the task) on the task's node."""
    agent = [launch.python, "-c", AGENT_SOURCE, agent_argument(launch, grace, DEFAULT_KEEPALIVE_TIMEOUT)]
    if launch.setup:
        # The setup line is shell by design; the agent's argv then passes through "$@" unchanged.
        agent = ["/bin/sh", "-c", f'{launch.setup} && exec "$0" "$@"', *agent]
    return [
        "srun", "--nodes=1", "--ntasks=1", f"--nodelist={launch.host}",
        "--overlap",  # the step shares the allocation's CPUs with the batch step and the other tasks
        "--unbuffered",  # output reaches the log as the task writes it, partial lines included
        f"--job-name={launch.name}",  # how squeue -s and sacct name the step
        f"--chdir={launch.workdir}",
        "--input=all",  # stdin (the agent's command channel) goes to the one task
        "--kill-on-bad-exit=1",
        *agent,
    ]


class SrunProcess(SshProcess):
    """A task seen through its srun client and agent."""

    channel = "srun"
    _node_failure: str | None = None

    def _read_status(self, returncode: int) -> ExitStatus:
        # srun's line naming the dead node may come before its step-abort chatter: find it first.
        self._stderr.seek(0)
        for line in self._stderr.read().decode("utf-8", "replace").splitlines():
            if NODE_FAILURE in line:
                self._node_failure = line.strip()
        return super()._read_status(returncode)

    def _lost(self, detail: str | None) -> ExitStatus:
        reason = self._node_failure or detail or "srun ended without the task's exit status"
        return ExitStatus(error=f"lost node {self.launch.host} ({reason})")

    def _not_started(self, returncode: int, detail: str) -> ExitStatus:
        if self._node_failure:  # the node died before the agent's first report came through
            return self._lost(detail)
        return ExitStatus(error=f"could not start on node {self.launch.host} ({detail})", error_code=CANNOT_START)


class SrunTransport:
    """Starts each task as ``srun ... <agent>`` with output into the task's log file."""

    def __init__(self, grace: float = 5.0):
        self.grace = grace

    def start(self, launch: TaskLaunch, output_fd: int) -> SrunProcess | FailedStart:
        stderr_file = tempfile.TemporaryFile()
        try:
            popen = subprocess.Popen(
                srun_argv(launch, self.grace),
                stdin=subprocess.PIPE,
                stdout=output_fd,
                stderr=stderr_file,
                # Terminal signals reach tflaunch only (srun would forward them to the step and two
                # Ctrl-C would make it SIGKILL it); tflaunch stops tasks through the agent, in order.
                start_new_session=True,
                close_fds=True,
            )
        except FileNotFoundError:
            stderr_file.close()
            return FailedStart("cannot start: srun is not installed here")
        return SrunProcess(launch, popen, stderr_file, os.dup(output_fd))
