"""A Slurm allocation as tflaunch sees it, and the rule that carves TensorFlow roles out of it.

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

**Role rule.** Task slots are numbered in Slurm's own rank order: node by node in the order of
the node list, each node's slots in turn. The chief (``--chief``, implied by ``--ps``) takes slot
0, the first node's first slot; the ``K`` ps tasks take the next ``K`` slots; the evaluator
(``--evaluator``) takes the last slot; every other slot is a worker, in order. At least one worker
must be left.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..errors import ConfigError

_TASKS_ITEM = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


@dataclass(frozen=True)
class Slot:
    """One task slot of the allocation: its node, and its place on that node."""

    node: str
    local_index: int  # 0.. on its node
    rank: int  # 0.. across the allocation, Slurm's order


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
        slots = []
        for node, count in zip(self.nodes, self.tasks_per_node):
            for local in range(count):
                slots.append(Slot(node, local, len(slots)))
        return slots

    def describe(self) -> str:
        return f"job {self.job_id}: {sum(self.tasks_per_node)} task slots on {self.nodelist or ','.join(self.nodes)}"


@dataclass(frozen=True)
class RoleSlot:
    role: str
    index: int
    slot: Slot

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}"


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
        raise ConfigError(source, "SLURM_TASKS_PER_NODE", f"{per_node_text!r} gives {len(counts)} nodes, but "
                          f"SLURM_JOB_NODELIST {nodelist!r} has {len(nodes)}")
    ntasks = environ.get("SLURM_NTASKS")
    if ntasks and ntasks.isdigit() and int(ntasks) != sum(counts):
        raise ConfigError(source, "SLURM_NTASKS", f"{ntasks} disagrees with SLURM_TASKS_PER_NODE "
                          f"{per_node_text!r} ({sum(counts)} tasks)")
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
    """Roles for every slot of the allocation, by the rule in the module docstring."""
    if ps < 0:
        raise ConfigError(source, "--ps", f"expected 0 or more ps tasks, got {ps}")
    chief = chief or ps > 0  # ParameterServerStrategy needs a coordinator: the chief
    slots = allocation.slots
    fixed = int(chief) + ps + int(evaluator)
    if len(slots) - fixed < 1:
        asked = [f"{ps} ps task{'s' if ps != 1 else ''}"] if ps else []
        asked = (["a chief"] if chief else []) + asked + (["an evaluator"] if evaluator else [])
        key = "--ps" if ps else ("--evaluator" if evaluator else "--chief")
        raise ConfigError(source, key, f"{', '.join(asked)} and at least one worker need {fixed + 1} task slots; "
                          f"{allocation.describe()} (ask Slurm for more with --ntasks or --ntasks-per-node)")
    roles: list[RoleSlot] = []
    rest = list(slots)
    if chief:
        roles.append(RoleSlot("chief", 0, rest.pop(0)))
    roles += [RoleSlot("ps", i, rest.pop(0)) for i in range(ps)]
    last = rest.pop() if evaluator else None
    roles += [RoleSlot("worker", i, slot) for i, slot in enumerate(rest)]
    if last is not None:
        roles.append(RoleSlot("evaluator", 0, last))
    return roles


def gpus_for(roles: list[RoleSlot], allocation: Allocation) -> dict[str, tuple[int, ...] | None]:
    """Each task's GPU list for the plan: None where Slurm binds GPUs itself (see the module docstring)."""
    if allocation.gpus_per_task:
        return {r.name: None for r in roles}
    gpus: dict[str, tuple[int, ...] | None] = {r.name: () for r in roles}
    count = allocation.gpus_per_node or 0
    if count:
        dealt: dict[str, int] = {}
        for r in roles:
            if r.role in ("chief", "worker"):
                n = dealt.get(r.slot.node, 0)
                gpus[r.name] = (n % count,)
                dealt[r.slot.node] = n + 1
    return gpus


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
