"""Transports: how a planned task is started where it runs, behind one process interface.

Every transport implements :class:`.base.Transport` (``prepare``, ``start``, ``close``) and returns a
:class:`.base.TaskProcess` (poll, terminate, kill, cleanup, dump_stacks, reading,
leftovers). Every task runs under its host's agent (:mod:`launcher.agent`, shipped by
:mod:`.shipping`; tflaunch's side is :mod:`.hostlink`, served by :mod:`.linkhub`, its tasks
:mod:`.proxies`): one agent per host per run, which starts every task of its host, stops each
task's whole tree when the task ends or tflaunch is gone, and samples each task's CPU and memory:

- ``local``: one agent, a child of tflaunch, for every task on this machine (:mod:`.local`);
- ``ssh``: one ssh connection per host, the agent at its far end (:mod:`.ssh`);
- ``srun``: one Slurm job step with an agent on each node (:mod:`.srun`);
- ``joined``: nodes that started tflaunch themselves and joined the run (:mod:`.joined`; a
  joining node's own side, where its tflaunch becomes its agent, is :mod:`.nodeagent`);
- ``ray``: one actor per bundle of a Ray placement group runs the agent, which joins the run as a
  node does (:mod:`.ray`);
- ``simulated``: for tests and benchmarks only, with ``TFLAUNCH_SIMULATE_HOSTS=1`` set, every
  ssh host is an agent on this machine over pipes (:mod:`.simulated`).

A task's :attr:`~launcher.cluster.plan.TaskLaunch.transport` names which one starts it. A run
keeps its transports in one :class:`TransportSet`; preflight probes run as helpers through the
same agents (:meth:`TransportSet.helper`), so a host costs one connection per run, and
:attr:`TransportSet.changes` says which of its tasks' processes changed status.

Every named transport is an :class:`~.backend.AgentBackend` (backend.py): its one job is to connect
a host's agent. Under a link: carriers.py (how an agent's channel is carried, a local pipe, an ssh connection or a
connection back from a Slurm step, and how its failures are worded), connectback.py (the listener a
job step's agents connect back to), framing.py (the channel's bytes cut into whole frames),
readingsframe.py (a host's readings frame checked where it comes in and parsed when asked for) and
heldoutput.py (a child's output held in memory within a bound).
"""

from __future__ import annotations

import base64
import importlib
import json
import os
import time
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # a node that joins a run loads this package for its agent's command line only
    from ..cluster.plan import TaskLaunch
    from ..options import RunOptions
    from .base import Reading, Transport
    from .linkhub import Changes

# name -> (module, class); imported on first use so that a local run never loads ssh or Slurm code.
TRANSPORTS: dict[str, tuple[str, str]] = {
    "local": (".local", "LocalTransport"),
    "ssh": (".ssh", "SshTransport"),
    "srun": (".srun", "SrunTransport"),  # Slurm (launcher.sources.slurm)
    "joined": (".joined", "JoinedTransport"),  # nodes that joined the run (launcher.sources.joined)
    "ray": (".ray", "RayTransport"),  # the agents of a Ray placement group (launcher.sources.ray)
    "simulated": (".simulated", "SimulatedTransport"),  # tests and benchmarks: ssh hosts simulated here
}
SIMULATE_HOSTS = "TFLAUNCH_SIMULATE_HOSTS"  # set (to anything but empty or 0): ssh hosts are simulated


def create(name: str, options: RunOptions) -> Transport:
    """A new transport of kind ``name`` for a run with ``options`` (its ``grace``: the seconds a task
    gets between TERM and KILL)."""
    if name == "ssh" and os.environ.get(SIMULATE_HOSTS, "0") not in ("", "0"):
        name = "simulated"
    module_name, class_name = TRANSPORTS[name]
    module = importlib.import_module(module_name, __name__)
    return getattr(module, class_name)(options)


def reading_of(pid: int) -> Reading:
    """A reading of process ``pid``'s tree on this machine, taken the way every host agent takes one."""
    from ..agent.sampling import tree_reading
    from .base import Reading

    rss, cpu, count = tree_reading(pid)
    return Reading(pid, rss, cpu, count, time.time())


class TransportSet:
    """A run's transports by kind, made on first use and closed together when the run ends."""

    def __init__(self, options: RunOptions):
        self.options = options
        self._transports: dict[str, Transport] = {}

    def get(self, name: str) -> Transport:
        if name not in self._transports:
            self._transports[name] = create(name, self.options)
        return self._transports[name]

    def for_launch(self, launch: TaskLaunch) -> Transport:
        return self.get(launch.transport)

    @property
    def changes(self) -> Changes:
        """The processes whose status changed (started, ended, lost), and a descriptor readable while
        any is waiting: every transport's agents are served by one hub, which notes them there."""
        from .linkhub import HUB

        return HUB.changes

    def prepare(self, launches) -> None:
        """Bring up every host's agent of ``launches`` at once."""
        for name in dict.fromkeys(launch.transport for launch in launches):
            self.get(name).prepare(launches)

    def leave_out(self, hosts: Collection[str], back: Collection[str] = ()) -> None:
        """The run left ``hosts`` out and took ``back`` in again: a transport that asks a scheduler
        for its hosts (srun's ``--exclude``) keeps the left-out ones out of what it asks for."""
        for transport in self._transports.values():
            transport.leave_out(hosts, back)

    def addresses(self) -> dict[str, str]:
        """{host: address} where the hosts whose address changed during the run are reached now
        (a node that joined again from a new address): the next attempt's plan puts them there."""
        found: dict[str, str] = {}
        for transport in self._transports.values():
            found.update(transport.addresses())
        return found

    def helper(self, launch: TaskLaunch, source: str, request: dict, on_line: Callable[[str | None], None],
               env: Mapping[str, str] | None = None):
        """Run a standard-library script (a probe) with ``launch``'s interpreter on its host, through
        that host's agent, with ``env`` added to the agent's environment. ``on_line`` gets each line
        of its output, then None when it has ended."""
        from .proxies import AgentHelper

        link = self.get(launch.transport).link_for(launch)
        encoded = base64.b64encode(json.dumps(request).encode()).decode()
        helper = AgentHelper(link, "probe", on_line)
        # cd first, ignoring failure (the workdir check reports it), so that a relative python works.
        argv = ["/bin/sh", "-c", 'cd -- "$0" 2>/dev/null; exec "$@"', launch.workdir, launch.python, "-c", source,
                encoded]
        link.start(helper, {"name": "probe", "argv": argv, "env": dict(env or {}), "stdin": "pipe", "kind": "helper",
                            "grace": "1.0"})
        return helper

    def close(self) -> None:
        """Every agent and connection goes; nothing of the run is left on any host."""
        for transport in self._transports.values():
            transport.close()
        self._transports.clear()
