"""Transports: how a planned task is started where it runs, behind one process interface.

Every transport implements :class:`.base.Transport` (``start``) and returns a
:class:`.base.TaskProcess` (poll, terminate, kill, send_signal, cleanup, dump_stacks, leftovers).
Every task runs under the same agent (:mod:`.agent`; tflaunch's side is :mod:`.agentclient`),
which stops the task's whole tree when tflaunch is gone and whatever the task left behind:

- ``local``: the agent as a child of tflaunch on this machine (:mod:`.local`);
- ``ssh``: the system ssh client and the agent on the remote host (:mod:`.ssh`);

A task's :attr:`~launcher.cluster.plan.TaskLaunch.transport` names which one starts it.
"""

from __future__ import annotations

import importlib

from .base import Transport

# name -> (module, class); imported on first use so that a local run never loads ssh or Slurm code.
TRANSPORTS: dict[str, tuple[str, str]] = {
    "local": (".local", "LocalTransport"),
    "ssh": (".ssh", "SshTransport"),
    "srun": (".srun", "SrunTransport"),  # Slurm job steps (launcher.sources.slurm)
}


def create(name: str, grace: float) -> Transport:
    """A new transport of kind ``name``; ``grace`` is the seconds a task gets between TERM and KILL."""
    module_name, class_name = TRANSPORTS[name]
    module = importlib.import_module(module_name, __name__)
    return getattr(module, class_name)(grace=grace)
