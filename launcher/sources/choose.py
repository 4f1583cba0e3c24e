"""Which source a command line (or a ``launch()`` call) names: exactly one of its cluster options.

A cluster file (or, from Python, a mapping in the same form), ``--local N``, ``-H HOSTS`` or
``--hostfile FILE``; the role options (:class:`~launcher.sources.RoleOptions`) go with all but a cluster, whose
roles are in the file. :func:`choose_source` checks the counts (``--local``, ``--ps``) for every
front end, in the words of the one in effect.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..cluster.spec import ClusterSpec
from ..errors import ConfigError, OptionsError
from ..options import count, form, name
from . import ClusterSource

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


def choose_source(cluster: str | Mapping[str, Any] | None = None, local: int | None = None, *,
                  hosts: str | None = None, hostfile: str | None = None, chief: bool = False, ps: int = 0,
                  evaluator: bool = False, gpus: tuple[int, ...] = (), role_options: str | None = None,
                  slurm: bool = False, spares: str | None = None) -> ClusterSource:
    """The one source the options name. ``role_options`` names the command's role options in messages
    (default: chief, ps, evaluator and gpus, in the words of the front end in effect); ``slurm`` says
    whether the command also has ``--slurm`` (``tflaunch run`` has; check, export and launch() have not)."""
    from .local import LocalSource

    if role_options is None:
        role_options = f"{name('chief')}, {name('ps')}, {name('evaluator')} and {name('gpus')}"
    named = [value for value in (cluster, local, hosts, hostfile) if value is not None]
    if len(named) != 1:
        raise OptionsError(f"give either {name('cluster')} or {form('local', 'N')}, {form('hosts', 'HOST:SLOTS,...')} "
                           f"or {form('hostfile', 'FILE')}")
    if local is not None:
        count("local", local, 1)
    count("ps", ps, 0)
    if cluster is not None and (chief or ps or gpus or evaluator):
        raise OptionsError(f"{role_options} only apply to {name('local')}, {name('hosts')} and {name('hostfile')}; "
                           "put roles in the cluster file")
    if spares is not None and (cluster is not None or local is not None):
        why = "put spares in the cluster file's 'spares:'" if cluster is not None else "this machine is never lost"
        raise OptionsError(f"{name('spares')} applies to {name('hosts')}, {name('hostfile')}"
                           f"{' and --slurm' if slurm else ''}; {why}")
    if isinstance(cluster, Mapping):
        return ClusterMappingSource(cluster)
    if cluster is not None:
        from .file import ClusterFileSource  # here: it loads PyYAML, which only a cluster file needs

        return ClusterFileSource(str(cluster))
    if local is not None:
        if evaluator:
            places = [name("hosts"), name("hostfile")] + (["--slurm"] if slurm else [])
            raise OptionsError(f"{name('evaluator')} applies to {', '.join(places[:-1])} and {places[-1]}, "
                               f"not to {name('local')}")
        return LocalSource(local, chief=chief, ps=ps, gpus=gpus)
    from .hosts import HostsSource

    return HostsSource(hosts=hosts, hostfile=hostfile, chief=chief, ps=ps, evaluator=evaluator, gpus=gpus,
                       spares=spares)
