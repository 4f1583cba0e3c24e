"""Tasks inside a Slurm allocation: one job step for the whole run, whose one task per node is the
host agent (:mod:`.hostagent`) that starts and watches that node's tasks.

``srun --nodes=K --ntasks=K --ntasks-per-node=1 --overlap ...`` puts the agents in the job's
cgroups, accounts them, and makes them die with the job; a run costs one step and one srun
client, not one of each per task, which is what keeps slurmctld and the batch host unloaded at
scale (torchrun, DeepSpeed and MPI start one process per node the same way). srun carries one
stdin and one merged stdout for all of its tasks, so each agent opens its own channel instead: a
TCP connection back to tflaunch (at the address srun was started from, which Slurm gives every
step as ``SLURM_LAUNCH_NODE_IPADDR``), proven by a token in the step's environment. From then on a
node is supervised exactly as a host over ssh is.

Only how the link fails reads differently: a node whose agent went silent or whose connection
closed is a lost node (srun's ``Node failure on`` line names it when slurmctld declared it dead);
an agent that never connected names srun's own error.
"""

from __future__ import annotations

import hmac
import os
import secrets
import socket
import subprocess
import tempfile
import threading
from collections.abc import Sequence

from ..cluster.plan import TaskLaunch
from .base import CANNOT_START, ExitStatus, FailedStart
from .carriers import Carrier
from .hostagent import TOKEN_VARIABLE, encode_fields
from .hostlink import AgentLink
from .linkhub import HUB
from .proxies import AgentTask, LogWriter, log_target
from .shipping import remote_agent_argv
from .ssh import DEFAULT_KEEPALIVE_TIMEOUT, EOF_GRACE, agent_spec, task_fields

NODE_FAILURE = "Node failure on"  # how srun reports that slurmctld declared a node dead
CONNECT_TIMEOUT = 300.0  # from srun's start to every agent's connection: a busy slurmctld, a node still registering


def srun_argv(nodes: Sequence[str], first: TaskLaunch, grace: float, port: int) -> list[str]:
    """The one srun step that runs an agent on each of ``nodes``."""
    agent = [*remote_agent_argv(first.python), agent_spec(grace, DEFAULT_KEEPALIVE_TIMEOUT, connect=f"- {port}")]
    if first.setup:
        # The setup line is shell by design; the agent's argv then passes through "$@" unchanged.
        agent = ["/bin/sh", "-c", f'{first.setup}\nexec "$0" "$@"', *agent]
    count = len(nodes)
    return [
        "srun", f"--nodes={count}", f"--ntasks={count}", "--ntasks-per-node=1", f"--nodelist={','.join(nodes)}",
        "--overlap",  # the step shares the allocation's CPUs with the batch step
        "--job-name=tflaunch-agents",  # how squeue -s and sacct name the step
        f"--chdir={first.workdir}",
        "--input=none",  # each agent's channel is its own connection
        "--kill-on-bad-exit=0",  # one node's agent ending must not end the others': tflaunch decides
        *agent,
    ]


class SrunCarrier(Carrier):
    """One node's agent inside the run's job step."""

    kind = "srun"

    def __init__(self, host: str, step: "AgentStep", keepalive: float):
        super().__init__(host)
        self.step = step
        self.keepalive = keepalive

    def ended(self) -> int | None:
        return self.step.popen.poll()

    def detail(self) -> str | None:
        return self.step.node_failure(self.host) or self.step.last_line()

    def close(self, wait: float) -> None:
        self.step.close(wait)

    def where(self, reason: str) -> str:
        return f"{reason} on node {self.host}"

    def not_started(self, detail: str) -> ExitStatus:
        if self.step.node_failure(self.host):
            return self.lost(detail)
        return ExitStatus(error=f"could not start on node {self.host} ({detail})", error_code=CANNOT_START)

    def lost(self, detail: str) -> ExitStatus:
        return ExitStatus(error=f"lost node {self.host} ({self.step.node_failure(self.host) or detail})")


class AgentStep:
    """The run's job step: its srun client, its output, and the connections its agents open back."""

    def __init__(self, nodes: Sequence[str], first: TaskLaunch, grace: float, keepalive: float):
        self.token = secrets.token_hex(16)
        self.listener = socket.create_server(("", 0), family=socket.AF_INET, backlog=len(nodes) + 8)
        port = self.listener.getsockname()[1]
        self.output = tempfile.TemporaryFile()
        self.links = {node: AgentLink(node, SrunCarrier(node, self, keepalive), None, None, keepalive=keepalive,
                                      hub=HUB, attach_within=CONNECT_TIMEOUT) for node in nodes}
        env = {**os.environ, TOKEN_VARIABLE: self.token}
        try:
            self.popen = subprocess.Popen(srun_argv(nodes, first, grace, port), stdin=subprocess.DEVNULL,
                                          stdout=self.output, stderr=self.output, env=env,
                                          # Terminal signals reach tflaunch only (srun would forward them
                                          # and two Ctrl-C would SIGKILL the step); tflaunch stops tasks in order.
                                          start_new_session=True, close_fds=True)
        except OSError:
            self.listener.close()
            raise
        self._closed = False
        threading.Thread(target=self._accept, name="tflaunch-srun-accept", daemon=True).start()

    def _accept(self) -> None:
        waiting = set(self.links)
        self.listener.settimeout(1.0)
        while waiting and not self._closed and self.popen.poll() is None:
            try:
                connection, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            node = self._check(connection)
            if node in waiting:
                waiting.discard(node)
                fd = os.dup(connection.fileno())
                connection.close()
                os.set_blocking(fd, False)
                self.links[node].attach(fd, fd)
            else:
                connection.close()
        self.listener.close()

    def _check(self, connection: socket.socket) -> str | None:
        """The node a connection speaks for, if it knows the token."""
        connection.settimeout(5.0)
        line = b""
        try:
            # One byte at a time: what follows the line (the agent's first frames) stays in the
            # socket for the link to read.
            while not line.endswith(b"\n") and len(line) < 512:
                chunk = connection.recv(1)
                if not chunk:
                    return None
                line += chunk
        except OSError:
            return None
        token, _, node = line.decode("utf-8", "replace").strip().partition(" ")
        connection.settimeout(None)
        return node if hmac.compare_digest(token, self.token) else None

    def node_failure(self, node: str) -> str | None:
        for line in self._lines():
            if NODE_FAILURE in line and node in line:
                return line.strip()
        return None

    def last_line(self) -> str | None:
        lines = [line for line in self._lines() if line.strip()]
        return lines[-1].strip() if lines else None

    def _lines(self) -> list[str]:
        return [line for line in _read_all(self.output).splitlines()]

    def close(self, wait: float) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.popen.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            self.popen.kill()  # Slurm ends the step and every agent in it
            self.popen.wait()


def _read_all(file) -> str:
    return os.pread(file.fileno(), 1 << 20, 0).decode("utf-8", "replace")


class SrunTransport:
    """Starts each task through its node's agent, all agents in one job step."""

    def __init__(self, grace: float = 5.0):
        self.grace = grace
        self.steps: list[AgentStep] = []
        self.links: dict[str, AgentLink] = {}
        self.setups: dict[str, str | None] = {}
        self.logs = LogWriter()

    def prepare(self, launches: Sequence[TaskLaunch]) -> None:
        """One step for every node that has no live agent yet (all of them, the first time)."""
        mine = [l for l in launches if l.transport == "srun"]
        nodes = list(dict.fromkeys(l.host for l in mine
                                   if l.host not in self.links or self.links[l.host].lost_reason is not None))
        if not nodes:
            return
        first = next(l for l in mine if l.host in nodes)
        step = AgentStep(nodes, first, self.grace, DEFAULT_KEEPALIVE_TIMEOUT)
        self.steps.append(step)
        self.links.update(step.links)
        self.setups.update({node: first.setup for node in nodes})

    def link_for(self, launch: TaskLaunch) -> AgentLink:
        """The agent of ``launch``'s node (a step of its own if no earlier step has the node)."""
        if launch.host not in self.links:
            self.prepare([launch])
        return self.links[launch.host]

    def start(self, launch: TaskLaunch, output_fd: int) -> AgentTask | FailedStart:
        target = log_target(output_fd)
        try:
            self.link_for(launch)
        except FileNotFoundError:
            _close(target)
            return FailedStart("cannot start: srun is not installed here")
        except OSError as exc:
            _close(target)
            return FailedStart(f"cannot start the job step for the agents: {exc.strerror or exc}")
        fields = task_fields(launch, self.grace, self.setups.get(launch.host))
        try:
            encode_fields(fields)
        except ValueError as exc:
            _close(target)
            return FailedStart(f"cannot start: {exc}")
        task = AgentTask(self.links[launch.host], launch.name, target, self.logs)
        self.links[launch.host].start(task, fields)
        return task

    def close(self) -> None:
        links, self.links = list(self.links.values()), {}
        for link in links:
            link.close_channel()
        for step in self.steps:
            step.close(EOF_GRACE + 2.0)
        self.steps = []
        self.logs.close()


def _close(target: str | int) -> None:
    if isinstance(target, int):
        os.close(target)
