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

``--spares K`` (or the section's ``spares``) holds the allocation's last K nodes back: one spare
slot per task slot of such a node (port ``auto``, role ``spare``), where a failed node's tasks
move at the next restart (:mod:`launcher.cluster.placement`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from ..cluster.checks import check_cluster
from ..cluster.reader import load_cluster_file
from ..cluster.spec import AUTO, ClusterSpec, TaskSpec
from ..errors import ConfigError, OptionsError
from ..slurm.allocation import (
    Allocation,
    carve_roles,
    gpus_for,
    hold_back,
    read_allocation,
    spare_slots,
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
    spares: int | None = None  # None: the file's slurm.spares (else 0)
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
        if self.spares:
            words.append(f"--spares {self.spares}")
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
            if base.spares:
                raise ConfigError(self.cluster_file, "spares", "with --slurm the spares are nodes of the allocation; "
                                  "remove the list and use --spares K (or the 'slurm:' section's spares)")
            if base.ray is not None:
                raise ConfigError(self.cluster_file, "ray", "with --slurm the nodes are the allocation's; remove the "
                                  "'ray:' section, or run the file without --slurm to place it on Ray")
            settings = read_slurm_section(self.cluster_file, base.slurm)
        spares = settings.spares if self.spares is None else self.spares
        allocation, spare_nodes = hold_back(self.allocation(), spares, self.label)
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
                       threads=threads, spares=spare_slots(spare_nodes, allocation))
        check_cluster(spec, local_hosts)
        return spec


def spare_count(text: str | None) -> int | None:
    """``--spares`` as ``--slurm`` takes it: a whole number K >= 1 of nodes to hold back."""
    if text is None:
        return None
    if not (text.strip().isascii() and text.strip().isdigit()) or int(text) < 1:
        raise OptionsError(f"--spares: with --slurm, expected a number of nodes K >= 1 to hold back as spares, "
                           f"got {text!r}")
    return int(text)
