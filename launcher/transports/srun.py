"""Tasks inside a Slurm allocation: one job step for the whole run, whose one task per node is the
host agent (:mod:`launcher.agent`) that starts and watches that node's tasks.

``srun --nodes=K --ntasks=K --ntasks-per-node=1 --overlap ...`` puts the agents in the job's
cgroups, accounts them, and makes them die with the job; a run costs one step and one srun
client, not one of each per task, which is what keeps slurmctld and the batch host unloaded at
scale (torchrun, DeepSpeed and MPI start one process per node the same way). srun carries one
stdin and one merged stdout for all of its tasks, so each agent opens its own channel instead: a
TCP connection back to tflaunch (:mod:`.connectback`) on which the agent and tflaunch each prove
that they hold the run's token before a command is sent or obeyed. srun hands every agent the
token on its standard input (``--input=all``): it is in no process's environment or command line.
The host's ``setup`` line reaches the nodes in the step's environment (:data:`SETUP_VARIABLE`), not
on srun's command line, which every user of the host can read.
The agents dial the address this host's routes to the nodes' Slurm addresses (NodeAddr) leave
from, and only there does tflaunch listen; when the nodes are reached from different addresses,
or Slurm cannot name them, it listens on all and the agents dial the address srun was started
from (``SLURM_LAUNCH_NODE_IPADDR``). From then on a node is supervised exactly as a host over ssh is.

Only how the link fails reads differently: a node whose agent went silent or whose connection
closed is a lost node (srun's ``Node failure on`` line names it when slurmctld declared it dead);
an agent that never connected names srun's own error.

A node lost for good (a spare stands in, or the cluster shrinks: :mod:`launcher.run.lifecycle.hostpool`)
does not take the others down: the step runs with ``--no-kill``, so Slurm ending a failed node's
part leaves the other nodes' agents running (in a job allocated with ``--no-kill``, which a node
failure does not end). A later step names only its own nodes and ``--exclude``s the nodes the run
left out (:meth:`SrunTransport.leave_out`), and a node whose agent was lost is dialled again in a
step of its own.
"""

from __future__ import annotations

import ctypes
import os
import re
import secrets
import signal
import subprocess
import time
from collections.abc import Collection, Sequence

from ..agent.protocol import beat_for, sample_for
from ..cluster.plan import TaskLaunch
from ..cluster.spec import DEFAULT_KEEPALIVE_TIMEOUT
from ..options import RunOptions
from .backend import AgentBackend
from .base import CANNOT_START, ExitStatus
from .connectback import ConnectBack, source_address
from .heldoutput import HeldOutput
from .carriers import Carrier
from .hostlink import AgentLink
from .linkhub import HUB
from .shipping import SETUP_VARIABLE, agent_spec, remote_agent_argv

NODE_FAILURE = "Node failure on"  # how srun reports that slurmctld declared a node dead
# srun's line: "srun: error: Node failure on <hostlist>", the hostlist as Slurm writes one
# ("n10", "n[1,10-12]", "gpu[007-009],login1").
_FAILED_NODES = re.compile(re.escape(NODE_FAILURE) + r"\s+(\S+)")
_GROUP = re.compile(r"\[([^\]]*)\]")
CONNECT_TIMEOUT = 300.0  # from srun's start to every agent's connection: a busy slurmctld, a node still registering
SCONTROL_TIMEOUT = 10.0  # for the nodes' addresses; without them the listener is on every address


def node_addresses(nodes: Sequence[str]) -> list[str]:
    """Each node's address as Slurm knows it (its NodeAddr: the one srun reaches it at).

    Empty when scontrol cannot say for every node."""
    try:
        done = subprocess.run(["scontrol", "--oneliner", "show", "node", ",".join(nodes)], capture_output=True,
                              text=True, timeout=SCONTROL_TIMEOUT, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return []
    known = {}
    for line in done.stdout.splitlines():
        fields = dict(word.split("=", 1) for word in line.split() if "=" in word)
        if fields.get("NodeName") and fields.get("NodeAddr"):
            known[fields["NodeName"]] = fields["NodeAddr"]
    return [known[node] for node in nodes] if done.returncode == 0 and all(n in known for n in nodes) else []


def in_hostlist(node: str, hostlist: str) -> bool:
    """Whether ``hostlist``, as Slurm writes one (``n[1,10-12],gpu07``), names ``node`` as a whole:
    ``n1`` is not ``n10``. A range's numbers have the width of its first bound (``[007-009]``)."""
    for item in re.split(r",(?![^\[]*\])", hostlist):
        if "[" not in item:
            if item == node:
                return True
            continue
        groups = _GROUP.findall(item)
        pattern = "".join(re.escape(part) if i % 2 == 0 else r"(\d+)"
                          for i, part in enumerate(_GROUP.split(item)))
        match = re.fullmatch(pattern, node)
        if match and all(_in_ranges(digits, ranges) for digits, ranges in zip(match.groups(), groups)):
            return True
    return False


def _in_ranges(digits: str, ranges: str) -> bool:
    for each in ranges.split(","):
        low, _, high = each.partition("-")
        if not low.isdigit() or not (high or low).isdigit():
            continue
        if int(low) <= int(digits) <= int(high or low) and digits == f"{int(digits):0{len(low)}d}":
            return True
    return False


def failed_on(line: str, node: str) -> bool:
    """Whether srun's ``line`` says that ``node`` failed (its ``Node failure on`` line)."""
    found = _FAILED_NODES.search(line)
    return bool(found) and in_hostlist(node, found.group(1))


def srun_argv(nodes: Sequence[str], first: TaskLaunch, grace: float, port: int, host: str = "-",
              exclude: Collection[str] = (), keepalive: float = DEFAULT_KEEPALIVE_TIMEOUT) -> list[str]:
    """The one srun step that runs an agent on each of ``nodes``, dialling ``host`` (``-``: the
    address srun was started from) at ``port``; ``exclude``: nodes the run left out, which Slurm
    must not place the step on; ``keepalive``: seconds of silence after which either side is gone."""
    # Heartbeats and samples spaced out as for as many ssh hosts (see launcher.agent.protocol.beat_for, sample_for).
    spec = agent_spec(grace, keepalive, sample=sample_for(len(nodes)), connect=f"{host} {port}",
                      beat=beat_for(len(nodes), keepalive))
    agent = [*remote_agent_argv(first.python), spec]
    if first.setup:
        # The setup line is shell by design, run from the environment (see step_env) with no stdin,
        # which holds the agent's token; the agent's argv then passes through "$@" unchanged.
        agent = ["/bin/sh", "-c", f'{{ eval "${SETUP_VARIABLE}"\n}} </dev/null\nunset {SETUP_VARIABLE}\nexec "$0" "$@"',
                 *agent]
    count = len(nodes)
    left_out = sorted(set(exclude) - set(nodes))
    return [
        "srun", f"--nodes={count}", f"--ntasks={count}", "--ntasks-per-node=1", f"--nodelist={','.join(nodes)}",
        *([f"--exclude={','.join(left_out)}"] if left_out else []),
        "--overlap",  # the step shares the allocation's CPUs with the batch step
        "--job-name=tflaunch-agents",  # how squeue -s and sacct name the step
        f"--chdir={first.workdir}",
        "--input=all",  # each agent's token; then its channel is its own connection
        "--kill-on-bad-exit=0",  # one node's agent ending must not end the others': tflaunch decides
        # Nor one node failing: without it Slurm ends the whole step, every node's agent with it,
        # when a node dies (in a job allocated with --no-kill, the others go on: a spare stands in).
        "--no-kill",
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

    def __init__(self, nodes: Sequence[str], first: TaskLaunch, grace: float, keepalive: float,
                 exclude: Collection[str] = ()):
        token = secrets.token_hex(16)
        # Where one address of this host reaches every node, the listener is there only and the
        # agents are told to dial it; otherwise it is on every address and they dial the one srun
        # was started from.
        address = source_address(node_addresses(nodes))
        self.listener = ConnectBack(nodes, token, self._attach, address or "", within=CONNECT_TIMEOUT,
                                    alive=lambda: self.popen.poll() is None, missing=self._cancel)
        self.output = HeldOutput(keep=lambda line: NODE_FAILURE in line)  # srun's own output, bounded
        env = {**os.environ, SETUP_VARIABLE: first.setup} if first.setup else None
        try:
            self.popen = subprocess.Popen(srun_argv(nodes, first, grace, self.listener.port, address or "-", exclude,
                                                    keepalive),
                                          stdin=subprocess.PIPE, stdout=self.output.fd, stderr=self.output.fd,
                                          env=env,
                                          # Terminal signals reach tflaunch only (srun would forward them
                                          # and two Ctrl-C would SIGKILL the step); tflaunch stops tasks in order.
                                          start_new_session=True, close_fds=True,
                                          preexec_fn=_ends_with(os.getpid()))
        except OSError:
            self.listener.close()
            self.output.close()
            raise
        self.output.started()
        # Only now: a link's carrier asks srun whether it ended from the moment the link exists, and
        # starting srun takes a while on a loaded host.
        self.links = {node: AgentLink(node, SrunCarrier(node, self, keepalive), None, None, keepalive=keepalive,
                                      hub=HUB, attach_within=CONNECT_TIMEOUT, beat=beat_for(len(nodes), keepalive))
                      for node in nodes}
        try:  # srun reads it once every node's agent is there, and hands each a copy, then its end
            self.popen.stdin.write(token.encode() + b"\n")
            self.popen.stdin.close()
        except OSError:
            pass  # srun ended already: the step's failure says why
        self._closed = False
        self.listener.start()

    def _attach(self, node: str, fd: int) -> None:
        self.links[node].attach(fd, fd)

    def _cancel(self, missing: list[str]) -> None:
        """The listener closed before these nodes' agents were in: none of the step may run on."""
        if self.popen.poll() is None:
            self.popen.terminate()  # srun forces the step's termination: every task of it is killed

    def node_failure(self, node: str) -> str | None:
        self._settle()
        for line in self.output.picked():
            if failed_on(line, node):
                return line.strip()
        return None

    def last_line(self) -> str | None:
        self._settle()
        lines = [line for line in self.output.lines() if line.strip()]
        return lines[-1].strip() if lines else None

    def _settle(self) -> None:
        if self.popen.poll() is not None:  # srun ended: its last words are read before they are quoted
            self.output.wait(1.0)

    def close(self, wait: float) -> None:
        self.listener.close()
        if self._closed:
            return
        self._closed = True
        try:
            self.popen.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            self.popen.kill()  # Slurm ends the step and every agent in it
            self.popen.wait()


def _ends_with(parent: int):
    """What srun's process runs before srun: SIGTERM (which cancels its step) once ``parent`` is gone.

    The kernel signals when the thread that started srun ends; that is the thread that runs the
    launch, which closes its steps itself before it returns. The function is looked up here, in
    tflaunch's process, so that the child between fork and exec only calls it."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def arm() -> None:
        prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)  # tflaunch went before the request took effect

    return arm


class SrunTransport(AgentBackend):
    """Starts each task through its node's agent, all agents in one job step."""

    kind = "srun"

    def __init__(self, options: RunOptions):
        super().__init__(options)
        self.keepalive = options.keepalive_timeout or DEFAULT_KEEPALIVE_TIMEOUT
        self.steps: list[AgentStep] = []
        self.left_out: set[str] = set()  # nodes the run left out: every later step excludes them

    def leave_out(self, hosts: Collection[str], back: Collection[str] = ()) -> None:
        """The run left the nodes ``hosts`` out, and took ``back`` in again."""
        self.left_out = (self.left_out | set(hosts)) - set(back)

    def prepare(self, launches: Sequence[TaskLaunch]) -> None:
        """One step for every node that has no live agent yet (all of them, the first time).

        A node whose agent was lost gets a step of its own: a step that names a node Slurm has
        not yet found dead fails as a whole (``Communication connection failure``), and would
        take the agents of the other nodes in it along."""
        mine = self.mine(launches)
        nodes = list(dict.fromkeys(l.host for l in mine
                                   if l.host not in self.links or self.links[l.host].gone))
        fresh = [node for node in nodes if node not in self.links]
        for group in ([fresh] if fresh else []) + [[node] for node in nodes if node in self.links]:
            first = next(l for l in mine if l.host in group)
            step = AgentStep(group, first, self.grace, self.keepalive, exclude=self.left_out)
            self.steps.append(step)
            self.links.update(step.links)
            self.setups.update({node: first.setup for node in group})

    def connect(self, launch: TaskLaunch) -> AgentLink:
        """A step of its own for ``launch``'s node, whose agent dials back."""
        self.prepare([launch])
        return self.links[launch.host]

    def link_for(self, launch: TaskLaunch) -> AgentLink:
        """The agent of ``launch``'s node (a step of its own if no earlier step has the node); a
        lost node's agent is dialled again only by :meth:`prepare`, between attempts."""
        if launch.host not in self.links:
            self.prepare([launch])
        return self.links[launch.host]

    def cannot_connect(self, exc: OSError) -> str:
        if isinstance(exc, FileNotFoundError):
            return "cannot start: srun is not installed here"
        return f"cannot start the job step for the agents: {exc.strerror or exc}"

    def close_carriers(self, links: Sequence[AgentLink], deadline: float) -> None:
        """Each step's srun ends (Slurm ends its agents with it), every step within the deadline."""
        for step in self.steps:
            step.close(max(0.0, deadline - time.monotonic()))
        self.steps = []

    def close(self) -> None:
        for step in self.steps:
            step.listener.close()  # no agent may attach to a link while it closes
        super().close()
