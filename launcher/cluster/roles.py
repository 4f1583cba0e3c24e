"""Task slots and the rule that carves TensorFlow roles out of them (pure).

A slot is one place for one task: a host (or Slurm node) and its place there. The slots of
``-H node1:4,node2:4``, of a hostfile and of a Slurm allocation are numbered the same way, host by
host in the order given (Slurm's own rank order), each host's slots in turn (:func:`number_slots`).

**Role rule** (:func:`carve_roles`). The chief (``--chief``, implied by ``--ps``) takes slot 0, the
first host's first slot; the ``K`` ps tasks take the next ``K`` slots; the evaluator
(``--evaluator``) takes the last slot; every other slot is a worker, in order. At least one worker
must be left. **GPUs** (:func:`deal_gpus`): a host's GPUs are dealt round-robin to that host's chief
and workers; ps and evaluator tasks stay on the CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import ConfigError
from ..options import name as option_name
from .spec import Role


@dataclass(frozen=True)
class Slot:
    """One task slot: its host, and its place on that host."""

    node: str
    local_index: int  # 0.. on its host
    rank: int  # 0.. across all slots


@dataclass(frozen=True)
class RoleSlot:
    role: str
    index: int
    slot: Slot

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}"


def number_slots(hosts: Sequence[tuple[str, int]]) -> list[Slot]:
    """``[(host, slot count), ...]`` -> every slot, numbered host by host."""
    slots: list[Slot] = []
    for node, count in hosts:
        for local in range(count):
            slots.append(Slot(node, local, len(slots)))
    return slots


def carve_roles(slots: Sequence[Slot], *, chief: bool = False, ps: int = 0, evaluator: bool = False,
                source: str, room: str) -> list[RoleSlot]:
    """Roles for every slot, by the rule in the module docstring.

    Too few slots is a ConfigError naming the option that asked for them; ``room`` finishes its
    sentence after "need N", saying what the slots are and how to get more (e.g. "slots; the hosts
    have 2 (add slots or hosts)")."""
    if ps < 0:
        raise ConfigError(source, option_name("ps"), f"expected 0 or more ps tasks, got {ps}")
    chief = chief or ps > 0  # ParameterServerStrategy needs a coordinator: the chief
    fixed = int(chief) + ps + int(evaluator)
    if len(slots) - fixed < 1:
        asked = (["a chief"] if chief else []) + ([f"{ps} ps task{'s' if ps != 1 else ''}"] if ps else []) \
            + (["an evaluator"] if evaluator else [])
        key = option_name("ps" if ps else ("evaluator" if evaluator else "chief"))
        raise ConfigError(source, key, f"{', '.join(asked)} and at least one worker need {fixed + 1} {room}")
    rest = list(slots)
    roles: list[RoleSlot] = []
    if chief:
        roles.append(RoleSlot(Role.CHIEF.value, 0, rest.pop(0)))
    roles += [RoleSlot(Role.PS.value, i, rest.pop(0)) for i in range(ps)]
    last = rest.pop() if evaluator else None
    roles += [RoleSlot(Role.WORKER.value, i, slot) for i, slot in enumerate(rest)]
    if last is not None:
        roles.append(RoleSlot(Role.EVALUATOR.value, 0, last))
    return roles


def deal_gpus(roles: Sequence[RoleSlot], per_host: int) -> dict[str, tuple[int, ...]]:
    """Each task's GPUs as positions in its host's list of ``per_host`` (see the module docstring)."""
    gpus: dict[str, tuple[int, ...]] = {r.name: () for r in roles}
    if per_host:
        dealt: dict[str, int] = {}
        for r in roles:
            if r.role in (Role.CHIEF, Role.WORKER):
                n = dealt.get(r.slot.node, 0)
                gpus[r.name] = (n % per_host,)
                dealt[r.slot.node] = n + 1
    return gpus
