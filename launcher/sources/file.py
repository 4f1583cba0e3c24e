"""A cluster YAML file as a cluster source: its tasks run on this machine or over ssh, or, with a
``ray:`` section, on a Ray cluster's nodes (:mod:`.ray`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..cluster.reader import load_cluster_file
from ..cluster.spec import ClusterSpec


@dataclass(frozen=True)
class ClusterFileSource:
    path: str
    _ray: list = field(default_factory=list, compare=False, repr=False)  # the Ray source of a ray: section

    @property
    def label(self) -> str:
        return self.path

    def spec(self, local_hosts: frozenset[str]) -> ClusterSpec:
        base = load_cluster_file(self.path, local_hosts)
        if base.ray is None:
            return base
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
