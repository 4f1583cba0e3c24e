"""Where each task of an attempt runs once hosts are left out: moved to a spare, or the cluster shrunk.

:func:`place` is pure: the whole cluster (its tasks, its ``spares`` and its ``min_workers``) and
the hosts left out for the next attempt in, the attempt's cluster out. The rules
(docs/fault-tolerance.md, "A host lost for good"):

1. Every task whose host is not left out runs there, as the file says.
2. A task whose host is left out moves to the first spare slot not taken and not on a left-out
   host, in the file's order (tasks in theirs): same role and index, the spare's ``host``,
   ``address``, ``port``, ``gpus`` (and ``python``, ``workdir``, ``setup`` where the spare sets
   them); its ``env`` is the task's with the spare's over it.
3. With no spare left, a chief or worker is dropped when ``min_workers`` is set and the training
   tasks left (chief and workers, TensorFlow's worker count) are at least ``min_workers``: the
   cluster shrinks. The workers left are numbered again from 0 in their order; when the chief was
   dropped, the first worker left takes its duty as ``chief-0`` (a cluster written without a
   chief has worker 0 as its chief already, and keeps that).
   An evaluator with no host is dropped (training goes on without its evaluations). A ``ps`` task
   holds part of the variables: with no host for it, no attempt can run.
4. Fewer training tasks left than ``min_workers``, or none at all, or ``min_workers`` not set:
   no attempt can run (:attr:`Placement.shortfall` says why).

The full cluster is placed again from the file every time, so a host that rejoins gets its own
tasks back and the spare that stood in for it is free again.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace

from .ranks import TRAINING_ROLES
from .spec import ClusterSpec, TaskSpec
from .spec import Role

SPARE_ROLE = "spare"  # the role a spare slot plays in the plan the preflight checks


@dataclass(frozen=True)
class Move:
    """A task of the full cluster that runs elsewhere, or as another task, in this attempt."""

    task: str  # its name in the full cluster
    host: str  # the host the file gives it
    runs_as: str  # its name in this attempt (another when the cluster shrank)
    on: str  # the host it runs on in this attempt
    spare: bool  # on a spare slot

    @property
    def text(self) -> str:
        where = f"on spare {self.on}" if self.spare else f"on {self.on}"
        return f"{self.task} {where}" if self.runs_as == self.task else f"{self.task} as {self.runs_as} {where}"


@dataclass(frozen=True)
class Placement:
    """The attempt's cluster, and how it differs from the full one."""

    spec: ClusterSpec  # the attempt's cluster (every task of it on a host not left out)
    moves: tuple[Move, ...] = ()  # tasks on a spare, or renumbered when the cluster shrank
    dropped: tuple[str, ...] = ()  # tasks of the full cluster this attempt runs without
    shortfall: str | None = None  # why no attempt can run; ``spec`` is then the full cluster

    @property
    def changed(self) -> bool:
        return bool(self.moves or self.dropped)


def place(spec: ClusterSpec, left_out: Collection[str]) -> Placement:
    """The attempt's cluster with the hosts ``left_out`` not used (rules in the module docstring)."""
    left_out = frozenset(left_out)
    free = [slot for slot in spec.spares if slot.host not in left_out]
    placed: list[TaskSpec] = []
    on_spare: dict[str, TaskSpec] = {}
    homeless: list[TaskSpec] = []
    for task in spec.tasks:
        if task.host not in left_out:
            placed.append(task)
        elif free:
            moved = on_slot(task, free.pop(0))
            placed.append(moved)
            on_spare[task.name] = moved
        else:
            homeless.append(task)
    if not homeless:
        moves = tuple(Move(name, _host_of(spec, name), name, moved.host, True) for name, moved in on_spare.items())
        return Placement(replace(spec, tasks=tuple(placed)), moves)
    stuck = [t.name for t in homeless if t.role == Role.PS]
    if stuck:
        return Placement(spec, shortfall=f"{', '.join(stuck)} has no host left and no spare to move to "
                                         "(a ps task holds part of the variables)")
    lost_training = [t for t in homeless if t.role in TRAINING_ROLES]
    training = [t for t in placed if t.role in TRAINING_ROLES]
    if lost_training:
        floor = spec.min_workers
        lost = ", ".join(t.name for t in lost_training)
        if floor is None:
            return Placement(spec, shortfall=f"no spare left for {lost}, and no min_workers to shrink to")
        if len(training) < max(floor, 1):
            return Placement(spec, shortfall=f"{len(training)} of {spec.training_count} training tasks left "
                                             f"without {lost}, below min_workers {floor}")
    renamed = _renumbered(training, chief_lost=any(t.role == Role.CHIEF for t in homeless))
    tasks = tuple(renamed.get(t.name, t) for t in placed)
    moves = []
    for task in placed:
        now = renamed.get(task.name, task)
        if task.name in on_spare or now.name != task.name:
            moves.append(Move(task.name, _host_of(spec, task.name), now.name, now.host, task.name in on_spare))
    return Placement(replace(spec, tasks=tasks), tuple(moves), tuple(t.name for t in homeless))


def on_slot(task: TaskSpec, slot: TaskSpec) -> TaskSpec:
    """``task`` run on the spare ``slot`` (rule 2)."""
    return replace(task, host=slot.host, address=slot.address, port=slot.port, gpus=slot.gpus,
                   env={**task.env, **slot.env}, python=slot.python or task.python,
                   workdir=slot.workdir or task.workdir, setup=slot.setup or task.setup)


def checked_spec(spec: ClusterSpec) -> ClusterSpec:
    """The cluster with its spare slots as tasks of the role ``spare``: what the preflight checks
    (each slot's host, port and interpreter, before a task needs it). Never run."""
    if not spec.spares:
        return spec
    return replace(spec, tasks=spec.tasks + spec.spares)


def _renumbered(training: list[TaskSpec], chief_lost: bool) -> dict[str, TaskSpec]:
    """{name: the task as it runs} for the training tasks left that change: the first worker takes
    the chief's duty when the chief was dropped, and the workers are numbered from 0 (rule 3)."""
    workers = sorted((t for t in training if t.role == Role.WORKER), key=lambda t: t.index)
    renamed = {}
    if chief_lost and workers:
        first = workers.pop(0)
        renamed[first.name] = replace(first, role=Role.CHIEF.value, index=0)
    for index, task in enumerate(workers):
        if task.index != index:
            renamed[task.name] = replace(task, index=index)
    return renamed


def _host_of(spec: ClusterSpec, name: str) -> str:
    return next(t.host for t in spec.tasks if t.name == name)
