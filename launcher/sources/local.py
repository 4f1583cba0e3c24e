"""``--local N [--chief] [--ps K] [--gpus LIST]`` as a cluster source: every task on this machine."""

from __future__ import annotations

from dataclasses import dataclass

from ..cluster.local import local_cluster
from ..cluster.spec import ClusterSpec
from ..options import label as options_label


@dataclass(frozen=True)
class LocalSource:
    workers: int
    chief: bool = False
    ps: int = 0
    gpus: tuple[int, ...] = ()

    @property
    def label(self) -> str:
        """The options as the user gave them: ``--local 2 --chief --ps 1``, or from Python
        ``launch(local=2, chief=True, ps=1)``."""
        return options_label([("local", self.workers), *([("chief", True)] if self.chief or self.ps else []),
                      *([("ps", self.ps)] if self.ps else []), *([("gpus", self.gpus)] if self.gpus else [])])

    def spec(self, local_hosts: frozenset[str]) -> ClusterSpec:
        return local_cluster(self.workers, chief=self.chief, ps=self.ps, gpus=self.gpus, source=self.label)
