"""Where a run may run: each source turns what the user named into a validated cluster spec.

This is the seam backends plug into. A source answers one question, "which tasks, on which
hosts, started by which transport?", with a :class:`~launcher.cluster.spec.ClusterSpec`:

- :class:`~.file.ClusterFileSource`: a cluster YAML file (tasks local or over ssh);
- :class:`~.local.LocalSource`: ``--local N [--chief] [--ps K] [--gpus LIST]`` on this machine;
- :class:`~.hosts.HostsSource`: ``-H node1:4,node2:4`` or ``--hostfile FILE``, one task per slot;
- :class:`~.slurm.SlurmSource`: the slots of a Slurm allocation.

:mod:`.choose` picks the one source a command line or a ``launch()`` call names.

A spec whose ``transport`` is None lets each task's host decide (``local`` for this machine,
``ssh`` otherwise); a backend that must start tasks its own way names its transport, which
:func:`launcher.transports.create` finds. Adding a backend is a source module here, a transport
module in ``launcher/transports/`` and one command-line option; the supervisor does not change.
"""

from __future__ import annotations

from typing import Protocol

from ..cluster.spec import ClusterSpec


class ClusterSource(Protocol):
    """Something that can say which cluster a run is allowed to use."""

    label: str  # how runs list this source: the file's path, "--local 2 --chief --ps 1", ...

    def spec(self, local_hosts: frozenset[str]) -> ClusterSpec:
        """The validated cluster; raises ConfigError (exit 2) naming what is wrong."""
        ...
