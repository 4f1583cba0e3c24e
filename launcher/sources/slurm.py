"""``--slurm [CLUSTER.yaml] [--chief] [--ps K] [--evaluator]`` as a cluster source: the Slurm allocation.

Run inside an allocation (an ``sbatch`` script or ``salloc`` shell). The nodes and task slots
come from Slurm's variables, the roles from the rule in :mod:`launcher.slurm.allocation` (chief
on the first node's first slot, ps next, evaluator last, workers the rest). Every port is ``auto``:
each node's agent picks free ports there once the run's one job step has started it (see
:mod:`launcher.transports.srun`), and this machine's port lock picks them for the batch node's
tasks. Every task's address is its node name, which the other nodes resolve.

A cluster file with a ``slurm:`` section and no roles may be given for the cluster-wide settings
(command, env, restarts, threads, workdir, python, setup); ``--chief``/``--ps``/``--evaluator``
win over its ``slurm:`` roles.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from ..cluster.checks import check_cluster
from ..cluster.reader import load_cluster_file
from ..cluster.spec import AUTO, ClusterSpec, TaskSpec
from ..errors import ConfigError
from ..slurm.allocation import (
    Allocation,
    carve_roles,
    gpus_for,
    read_allocation,
    thread_count,
)
from ..slurm.commands import expand_hostlist
from ..slurm.section import read_slurm_section

TRANSPORT = "srun"


@dataclass(frozen=True)
class SlurmSource:
    chief: bool | None = None  # None: the file's slurm.chief (else False)
    ps: int | None = None
    evaluator: bool | None = None
    cluster_file: str | None = None
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))

    @property
    def label(self) -> str:
        words = ["--slurm"] + ([self.cluster_file] if self.cluster_file else [])
        if self.chief:
            words.append("--chief")
        if self.ps:
            words.append(f"--ps {self.ps}")
        if self.evaluator:
            words.append("--evaluator")
        job = self.environ.get("SLURM_JOB_ID")
        return " ".join(words) + (f" (job {job})" if job else "")

    def allocation(self) -> Allocation:
        return read_allocation(self.environ, expand_hostlist, source=self.label)

    def spec(self, local_hosts: frozenset[str]) -> ClusterSpec:
        base = ClusterSpec(source=self.label, tasks=())
        settings = read_slurm_section(self.label, None)
        if self.cluster_file:
            base = load_cluster_file(self.cluster_file, local_hosts, slurm_template=True)
            if base.tasks:
                raise ConfigError(self.cluster_file, base.tasks[0].role, "with --slurm the roles come from the "
                                  "allocation; remove the role lists (use the 'slurm:' section's chief/ps/evaluator)")
            settings = read_slurm_section(self.cluster_file, base.slurm)
        allocation = self.allocation()
        roles = carve_roles(allocation, chief=settings.chief if self.chief is None else self.chief,
                            ps=settings.ps if self.ps is None else self.ps,
                            evaluator=settings.evaluator if self.evaluator is None else self.evaluator,
                            source=self.label)
        per_node: dict[str, int] = {}
        for r in roles:
            per_node[r.slot.node] = per_node.get(r.slot.node, 0) + 1
        gpus = gpus_for(roles, allocation)
        tasks = [TaskSpec(r.role, r.index, r.slot.node, AUTO, address=r.slot.node, gpus=gpus[r.name],
                          key=f"{r.role}[{r.index}]") for r in roles]
        # Slurm binds GPUs itself, or tflaunch deals a node's GPUs round-robin: either way sharing is intended.
        share = allocation.gpus_per_task is not None or any(
            sum(1 for t in tasks if t.host == node and t.gpus) > (allocation.gpus_per_node or 0) for node in per_node)
        threads = base.threads
        if threads == "auto":  # the same count on every node (the plan only knows this machine's cores)
            threads = thread_count(allocation, per_node) or "auto"
        spec = replace(base, source=self.label, tasks=tuple(tasks), transport=TRANSPORT, share_gpus=share,
                       threads=threads)
        check_cluster(spec, local_hosts)
        return spec
