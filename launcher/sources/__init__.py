"""Where a run may run: each source turns what the user named into a validated cluster spec.

This is the seam backends plug into. A source answers one question, "which tasks, on which
hosts, started by which transport?", with a :class:`~launcher.cluster.spec.ClusterSpec`:

- :class:`~.file.ClusterFileSource`: a cluster YAML file (tasks local or over ssh, or on Ray);
- :class:`~.local.LocalSource`: ``--local N [--chief] [--ps K] [--gpus LIST]`` on this machine;
- :class:`~.hosts.HostsSource`: ``-H node1:4,node2:4`` or ``--hostfile FILE``, one task per slot;
- :class:`~.slurm.SlurmSource`: the slots of a Slurm allocation;
- :class:`~.joined.JoinedSource`: ``--nnodes N --node-rank 0 --rdzv-endpoint HOST:PORT``, the nodes
  that joined the rendezvous, placed only once they are there (membership is a step of its own);
- :class:`~.ray.RayNodes`: ``--ray ADDRESS --nnodes N`` (or a file's ``ray:`` section), the Ray
  nodes of one placement group, placed once each bundle's agent joined.

:mod:`.platforms` reads ``--nodes-from``'s platform variables (SkyPilot, dstack, Kubernetes, AWS
Batch, SageMaker, Slurm) into the node count, this node's rank and rank 0's address.

:mod:`.choose` picks the one source a command line or a ``launch()`` call names; :class:`RoleOptions`, here,
are the role options it and the sources that carve slots share.

A spec whose ``transport`` is None lets each task's host decide (``local`` for this machine,
``ssh`` otherwise); a backend that must start tasks its own way names its transport, which
:func:`launcher.transports.create` finds. Adding a backend is a source module here, a transport
module in ``launcher/transports/`` and one command-line option; the supervisor does not change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ..cluster.spec import ClusterSpec


class ClusterSource(Protocol):
    """Something that can say which cluster a run is allowed to use."""

    label: str  # how runs list this source: the file's path, "--local 2 --chief --ps 1", ...

    def spec(self, local_hosts: frozenset[str]) -> ClusterSpec:
        """The validated cluster; raises ConfigError (exit 2) naming what is wrong."""
        ...


@dataclass(frozen=True, kw_only=True)
class RoleOptions:
    """The role options: a chief (implied by ``ps``), ``ps`` parameter-server tasks and an evaluator
    carved out of the task slots, and the GPUs dealt to the chief and workers. The sources that carve
    slots (:class:`~.hosts.HostsSource`) and the command line's choice of cluster are built on it."""

    chief: bool = False
    ps: int = 0
    evaluator: bool = False
    gpus: tuple[int, ...] = ()

    def role_words(self) -> list[tuple[str, Any]]:
        """The role options given, as a run's label lists them (``--chief --ps 1``; ps implies chief)."""
        return [*([("chief", True)] if self.chief or self.ps else []), *([("ps", self.ps)] if self.ps else []),
                *([("evaluator", True)] if self.evaluator else []), *([("gpus", self.gpus)] if self.gpus else [])]
