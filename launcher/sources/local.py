"""``--local N [--chief] [--ps K] [--gpus LIST]`` as a cluster source: every task on this machine."""

from __future__ import annotations

from dataclasses import dataclass

from ..cluster.local import local_cluster
from ..cluster.spec import ClusterSpec


@dataclass(frozen=True)
class LocalSource:
    workers: int
    chief: bool = False
    ps: int = 0
    gpus: tuple[int, ...] = ()

    @property
    def label(self) -> str:
        """The options as the user would type them, e.g. ``--local 2 --chief --ps 1``."""
        words = [f"--local {self.workers}"]
        if self.chief or self.ps:
            words.append("--chief")
        if self.ps:
            words.append(f"--ps {self.ps}")
        if self.gpus:
            words.append("--gpus " + ",".join(map(str, self.gpus)))
        return " ".join(words)

    def spec(self, local_hosts: frozenset[str]) -> ClusterSpec:
        return local_cluster(self.workers, chief=self.chief, ps=self.ps, gpus=self.gpus, source=self.label)
