"""A cluster YAML file as a cluster source: its tasks run on this machine or over ssh."""

from __future__ import annotations

from dataclasses import dataclass

from ..cluster.reader import load_cluster_file
from ..cluster.spec import ClusterSpec


@dataclass(frozen=True)
class ClusterFileSource:
    path: str

    @property
    def label(self) -> str:
        return self.path

    def spec(self, local_hosts: frozenset[str]) -> ClusterSpec:
        return load_cluster_file(self.path, local_hosts)
