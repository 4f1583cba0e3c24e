"""A Slurm allocation as tflaunch sees it: its nodes, slots, GPUs and CPUs.

Read from the variables Slurm sets in an ``sbatch`` script or ``salloc`` shell:

- ``SLURM_JOB_ID``; ``SLURM_JOB_NODELIST`` (hostlist syntax such as ``gpu[01-04,07]``, expanded by
  Slurm itself); ``SLURM_TASKS_PER_NODE`` (such as ``2(x3),1``: two tasks on each of the first three
  nodes, one on the fourth); ``SLURM_NTASKS`` when set must agree with it;
- GPUs: ``SLURM_GPUS_PER_TASK`` means Slurm binds GPUs to each task (each srun step gets its own
  ``CUDA_VISIBLE_DEVICES``), so tflaunch leaves that variable alone. Otherwise
  ``SLURM_GPUS_ON_NODE`` (GPUs per node, the batch node's count taken for every node) are dealt
  round-robin to a node's chief and worker tasks by tflaunch's own rule; without either, tasks run
  on the CPU (``CUDA_VISIBLE_DEVICES=-1``);
- threads: ``SLURM_CPUS_PER_TASK`` becomes each task's intra-op thread count; without it, when some
  node runs several tasks, every task gets ``min over nodes of (CPUs of the node // its tasks)``
  from ``SLURM_JOB_CPUS_PER_NODE`` (such as ``8(x2)``), the same thread rule as on one machine,
  applied alike on every node;
- ``SLURM_RESTART_COUNT``: how many times the job was requeued.

With ``--spares K`` the last K nodes are held back (:func:`hold_back`): the roles are carved from
the others, and a held-back node's slots are spare slots that stand in for a failed node's tasks.

Roles come from the allocation's slots, in Slurm's own rank order (node by node in the order of
the node list, each node's slots in turn), by the rule every source shares
(:mod:`launcher.cluster.roles`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from ..cluster.placement import SPARE_ROLE
from ..cluster.roles import RoleSlot, Slot, deal_gpus, number_slots
from ..cluster.spec import AUTO, TaskSpec
from ..cluster.roles import carve_roles as carve_slots
from ..errors import ConfigError
from ..records.states import plural

_TASKS_ITEM = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


@dataclass(frozen=True)
class Allocation:
    job_id: str
    nodes: tuple[str, ...]
    tasks_per_node: tuple[int, ...]
    gpus_per_task: int | None = None  # Slurm binds this many GPUs to each task
    gpus_per_node: int | None = None  # GPUs on each node, when Slurm does not bind them per task
    cpus_per_task: int | None = None
    cpus_per_node: tuple[int, ...] = ()  # SLURM_JOB_CPUS_PER_NODE, one count per node
    restart_count: int = 0
    nodelist: str = ""  # as Slurm wrote it, for messages

    @property
    def slots(self) -> list[Slot]:
        return number_slots(list(zip(self.nodes, self.tasks_per_node)))

    def describe(self) -> str:
        slots = plural(sum(self.tasks_per_node), "task slot")
        return f"job {self.job_id}: {slots} on {self.nodelist or ','.join(self.nodes)}"


def parse_tasks_per_node(text: str, source: str = "--slurm") -> list[int]:
    """``2(x3),1`` -> [2, 2, 2, 1], as Slurm writes SLURM_TASKS_PER_NODE."""
    counts: list[int] = []
    for item in text.split(","):
        match = _TASKS_ITEM.match(item.strip())
        if not match:
            raise ConfigError(source, "SLURM_TASKS_PER_NODE",
                              f"expected counts such as '2(x3),1', got {text!r}")
        count, repeat = int(match.group(1)), int(match.group(2) or 1)
        counts += [count] * repeat
    return counts


def read_allocation(environ: Mapping[str, str], expand: Callable[[str], list[str]],
                    source: str = "--slurm") -> Allocation:
    """The allocation tflaunch runs inside; ``expand`` turns a hostlist into node names."""
    job_id = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    if not job_id:
        raise ConfigError(source, "SLURM_JOB_ID", "not set: tflaunch is not inside a Slurm allocation; run "
                          "'tflaunch --slurm' from an sbatch script or salloc shell, or use 'tflaunch submit'")
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not nodelist:
        raise ConfigError(source, "SLURM_JOB_NODELIST", f"not set in job {job_id}; expected the allocation's nodes")
    nodes = expand(nodelist)
    per_node_text = environ.get("SLURM_TASKS_PER_NODE")
    counts = parse_tasks_per_node(per_node_text, source) if per_node_text else [1] * len(nodes)
    if len(counts) != len(nodes):
        raise ConfigError(source, "SLURM_TASKS_PER_NODE", f"{per_node_text!r} gives {plural(len(counts), 'node')}, but "
                          f"SLURM_JOB_NODELIST {nodelist!r} has {len(nodes)}")
    ntasks = environ.get("SLURM_NTASKS")
    if ntasks and ntasks.isdigit() and int(ntasks) != sum(counts):
        raise ConfigError(source, "SLURM_NTASKS", f"{ntasks} disagrees with SLURM_TASKS_PER_NODE "
                          f"{per_node_text!r} ({plural(sum(counts), 'task')})")
    return Allocation(
        job_id=job_id,
        nodes=tuple(nodes),
        tasks_per_node=tuple(counts),
        gpus_per_task=_count(environ.get("SLURM_GPUS_PER_TASK")),
        gpus_per_node=_count(environ.get("SLURM_GPUS_ON_NODE")),
        cpus_per_task=_count(environ.get("SLURM_CPUS_PER_TASK")),
        cpus_per_node=_cpus_per_node(environ.get("SLURM_JOB_CPUS_PER_NODE"), len(nodes), source),
        restart_count=_count(environ.get("SLURM_RESTART_COUNT")) or 0,
        nodelist=nodelist,
    )


def carve_roles(allocation: Allocation, *, chief: bool = False, ps: int = 0, evaluator: bool = False,
                source: str = "--slurm") -> list[RoleSlot]:
    """Roles for every slot of the allocation (the rule is :func:`launcher.cluster.roles.carve_roles`)."""
    return carve_slots(allocation.slots, chief=chief, ps=ps, evaluator=evaluator, source=source,
                       room=f"task slots; {allocation.describe()} (ask Slurm for more with --ntasks or "
                            "--ntasks-per-node)")


def hold_back(allocation: Allocation, spares: int, source: str = "--slurm") -> tuple[Allocation, list[tuple[str, int]]]:
    """The allocation's last ``spares`` nodes held back as spares: the allocation the tasks are
    carved from, and each spare node with its task slots (one spare slot each)."""
    if not spares:
        return allocation, []
    keep = len(allocation.nodes) - spares
    if keep < 1:
        raise ConfigError(source, "--spares", f"{spares} would hold back every node of {allocation.describe()}; "
                          f"expected at most {len(allocation.nodes) - 1}, leaving a node for the tasks")
    tasks = replace(allocation, nodes=allocation.nodes[:keep], tasks_per_node=allocation.tasks_per_node[:keep],
                    cpus_per_node=allocation.cpus_per_node[:keep], nodelist=",".join(allocation.nodes[:keep]))
    return tasks, list(zip(allocation.nodes[keep:], allocation.tasks_per_node[keep:]))


def spare_slots(spare_nodes: list[tuple[str, int]], allocation: Allocation) -> tuple[TaskSpec, ...]:
    """One spare slot (role ``spare``, port ``auto``, address its node) per task slot of each node
    :func:`hold_back` held back, with the GPUs a worker in that slot would get (:func:`gpus_for`)."""
    slots: list[TaskSpec] = []
    for node, count in spare_nodes:
        for place in range(count):
            gpus = None if allocation.gpus_per_task else (
                (place % allocation.gpus_per_node,) if allocation.gpus_per_node else ())
            slots.append(TaskSpec(SPARE_ROLE, len(slots), node, AUTO, address=node, gpus=gpus,
                                  key=f"spares[{len(slots)}]"))
    return tuple(slots)


def gpus_for(roles: list[RoleSlot], allocation: Allocation) -> dict[str, tuple[int, ...] | None]:
    """Each task's GPU list for the plan: None where Slurm binds GPUs itself (see the module docstring),
    else the node's GPUs dealt by :func:`launcher.cluster.roles.deal_gpus`."""
    if allocation.gpus_per_task:
        return {r.name: None for r in roles}
    return dict(deal_gpus(roles, allocation.gpus_per_node or 0))


def _count(text: str | None) -> int | None:
    """A Slurm count variable; values such as ``gpu:2`` or ``2(x4)`` give their leading number."""
    if not text:
        return None
    match = re.search(r"(\d+)", text.split(":")[-1])
    return int(match.group(1)) if match else None


def _cpus_per_node(text: str | None, nodes: int, source: str) -> tuple[int, ...]:
    if not text:
        return ()
    counts = parse_tasks_per_node(text, source)  # the same "8(x2),4" syntax
    return tuple(counts) if len(counts) == nodes else ()


def thread_count(allocation: Allocation, tasks_per_node: dict[str, int]) -> int | None:
    """Intra-op threads for every task (see the module docstring); None: leave TensorFlow's defaults."""
    if allocation.cpus_per_task:
        return allocation.cpus_per_task
    if not allocation.cpus_per_node or max(tasks_per_node.values(), default=1) <= 1:
        return None
    cpus = dict(zip(allocation.nodes, allocation.cpus_per_node))
    return max(1, min(cpus[node] // count for node, count in tasks_per_node.items()))
