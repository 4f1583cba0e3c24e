"""A cluster YAML file as a cluster source: its tasks run on this machine or over ssh, or, with a
``ray:`` section, on a Ray cluster's nodes (:mod:`.ray`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..cluster.reader import load_cluster_file
from ..cluster.spec import ClusterSpec
from ..errors import ConfigError


@dataclass(frozen=True)
class ClusterFileSource:
    path: str
    runs: bool = False  # a run's source: a ray: section is placed on Ray (check and export take none)
    _ray: list = field(default_factory=list, compare=False, repr=False)  # the Ray source of a ray: section

    @property
    def label(self) -> str:
        return self.path

    def spec(self, local_hosts: frozenset[str]) -> ClusterSpec:
        base = load_cluster_file(self.path, local_hosts)
        if base.ray is None:
            return base
        if not self.runs:
            raise ConfigError(self.path, "ray", "a Ray cluster's nodes are placed only when the file runs "
                              f"('tflaunch {self.path}'); check and export take no ray: section")
        if not self._ray:
            from .ray import ray_section

            self._ray.append(ray_section(self.path, base.ray))
        placed = self._ray[0].spec(local_hosts)  # the file's settings, the Ray nodes' tasks
        return replace(base, tasks=placed.tasks, spares=placed.spares, transport=placed.transport,
                       min_workers=placed.min_workers if base.min_workers is None else base.min_workers)

    def finish(self, code: int) -> None:
        """A ray: section's group and actors freed."""
        if self._ray:
            self._ray[0].finish(code)
