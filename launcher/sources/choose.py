"""Which source a command line (or a ``launch()`` call) names: exactly one of its cluster options.

A cluster file (or, from Python, a mapping in the same form), ``--local N``, ``-H HOSTS`` or
``--hostfile FILE``; the role options (:class:`~launcher.sources.RoleOptions`) go with all but a cluster, whose
roles are in the file. :class:`ClusterChoice` holds what a front end was given and its
:meth:`~ClusterChoice.source` checks the counts (``--local``, ``--ps``) for every front end, in the
words of the one in effect.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..cluster.spec import ClusterSpec
from ..errors import ConfigError, OptionsError
from ..options import count, form, name
from . import ClusterSource, RoleOptions

MAPPING_LABEL = "cluster"  # how a cluster given as a mapping is named in messages and run lists


@dataclass(frozen=True)
class ClusterMappingSource:
    """A cluster given as a mapping in the cluster-file form (``{"worker": ["localhost:auto"] * 2}``)."""

    data: Mapping[str, Any]
    label: str = MAPPING_LABEL

    def spec(self, local_hosts: frozenset[str]) -> ClusterSpec:
        import yaml

        from ..cluster.reader import parse_cluster

        try:
            # The file reader is the one validator: the mapping goes through it as the YAML it stands for.
            text = yaml.safe_dump(_plain(self.data), sort_keys=False)
        except yaml.YAMLError as exc:
            raise ConfigError(self.label, "", f"expected plain values (str, int, float, bool, list, dict): {exc}") \
                from None
        return parse_cluster(text, self.label, local_hosts)


def _plain(value: Any) -> Any:
    """Mappings and tuples as the dicts and lists YAML writes; everything else as it is."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


@dataclass(frozen=True)
class ClusterChoice(RoleOptions):
    """The options that choose a cluster, as any front end was given them: exactly one of
    ``cluster`` (a file's path, or from Python a mapping in the same form), ``local``, ``hosts`` or
    ``hostfile`` names it; the role options (:class:`~launcher.sources.RoleOptions`) place the roles
    and ``spares`` names spare hosts. The command line and ``launch()`` both build one and ask it
    for its :meth:`source`.

    ``takes_gpus`` and ``takes_slurm`` say which options the front end has (``tflaunch export`` has
    no ``--gpus``; only ``tflaunch run`` has ``--slurm``), so that its messages name only those."""

    cluster: str | Mapping[str, Any] | None = None
    local: int | None = None
    hosts: str | None = None
    hostfile: str | None = None
    spares: str | None = None
    takes_gpus: bool = True
    takes_slurm: bool = False

    @property
    def role_options(self) -> str:
        """The front end's role options, as messages name them."""
        words = [name("chief"), name("ps"), name("evaluator"), *([name("gpus")] if self.takes_gpus else [])]
        return f"{', '.join(words[:-1])} and {words[-1]}"

    def source(self, runs: bool = False) -> ClusterSource:
        """The one source these options name; OptionsError naming the options when they name none,
        more than one, or a count out of range. ``runs``: for a run (a cluster file's ``ray:``
        section is placed on Ray then, and refused otherwise)."""
        from .local import LocalSource

        cluster, local, hosts, hostfile, spares = self.cluster, self.local, self.hosts, self.hostfile, self.spares
        chief, ps, evaluator, gpus = self.chief, self.ps, self.evaluator, self.gpus
        named = [value for value in (cluster, local, hosts, hostfile) if value is not None]
        if len(named) != 1:
            raise OptionsError(f"give either {name('cluster')} or {form('local', 'N')}, "
                               f"{form('hosts', 'HOST:SLOTS,...')} or {form('hostfile', 'FILE')}")
        if local is not None:
            count("local", local, 1)
        count("ps", ps, 0)
        if cluster is not None and (chief or ps or gpus or evaluator):
            raise OptionsError(f"{self.role_options} only apply to {name('local')}, {name('hosts')} and "
                               f"{name('hostfile')}; put roles in the cluster file")
        if spares is not None and (cluster is not None or local is not None):
            why = "put spares in the cluster file's 'spares:'" if cluster is not None else "this machine is never lost"
            raise OptionsError(f"{name('spares')} applies to {name('hosts')}, {name('hostfile')}"
                               f"{' and --slurm' if self.takes_slurm else ''}; {why}")
        if isinstance(cluster, Mapping):
            return ClusterMappingSource(cluster)
        if cluster is not None:
            from .file import ClusterFileSource  # here: it loads PyYAML, which only a cluster file needs

            return ClusterFileSource(str(cluster), runs=runs)
        if local is not None:
            if evaluator:
                places = [name("hosts"), name("hostfile")] + (["--slurm"] if self.takes_slurm else [])
                raise OptionsError(f"{name('evaluator')} applies to {', '.join(places[:-1])} and {places[-1]}, "
                                   f"not to {name('local')}")
            return LocalSource(local, chief=chief, ps=ps, gpus=gpus)
        from .hosts import HostsSource

        return HostsSource(hosts=hosts, hostfile=hostfile, chief=chief, ps=ps, evaluator=evaluator, gpus=gpus,
                           spares=spares)
