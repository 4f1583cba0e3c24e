"""Which hosts the next attempt runs on: the hosts a run leaves out, why, and when they may rejoin.

A :class:`HostPool` holds the run's whole cluster (its tasks and spare slots) and decides, after a
failed attempt, which hosts the next one leaves out (docs/fault-tolerance.md, "A host lost for good"):

- a host that does not answer the check before the restart (lost);
- the host of the task whose failure points at its machine (:data:`~launcher.run.faults.diagnose.MACHINE_RULES`: cuDNN
  or cuBLAS init, a GPU's ECC or Xid error, a full disk);
- a host named as the culprit of two failed attempts in a row (the root cause's host, or the task
  a hang watchdog named);
- the host of a straggler that held the others back for ``--straggler-timeout`` seconds, with
  ``--on-straggler exclude`` (:mod:`launcher.run.faults.stragglers`);
- a spare whose host the preflight refused (unreachable, a different Python or TensorFlow): never used.

A host left out for its machine's sake or as a repeated culprit is left out only where the cluster
can do without it (a spare, or ``min_workers``): otherwise the restart goes back to it, as before.
A lost host cannot be used either way. A host left out may rejoin at a later restart once it
answers and ``cooldown`` seconds have passed since it was left out.

The decisions are pure given the checks' answers and a clock: the session probes, this decides.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace

from ...cluster.placement import Move, Placement, place
from ...cluster.spec import ClusterSpec


@dataclass(frozen=True)
class LeftOut:
    """A host the run does not use, from ``attempt`` on."""

    host: str
    reason: str
    attempt: int
    since: float  # the pool's clock when it was left out
    lost: bool  # did not answer (else left out by choice: it answered, but failed the machine's way)


@dataclass(frozen=True)
class Decision:
    """What changed for the next attempt: one line per change, and the attempt's placement."""

    attempt: int
    placement: Placement
    left_out: tuple[LeftOut, ...] = ()  # newly left out
    rejoined: tuple[str, ...] = ()  # hosts back in
    lines: tuple[str, ...] = ()

    @property
    def ends_run(self) -> bool:
        return self.placement.shortfall is not None


@dataclass
class HostPool:
    """The run's hosts across its attempts (rules in the module docstring)."""

    spec: ClusterSpec  # the whole cluster, ports filled in
    clock: Callable[[], float] = time.monotonic
    left_out: dict[str, LeftOut] = field(default_factory=dict)
    placement: Placement | None = None  # the current attempt's

    def __post_init__(self) -> None:
        if self.placement is None:
            self.placement = Placement(self.spec)

    @property
    def spare_hosts(self) -> list[str]:
        return list(dict.fromkeys(slot.host for slot in self.spec.spares))

    def refuse_spares(self, refused: Mapping[str, str]) -> list[str]:
        """Spare hosts the preflight refused, {host: why}: never used. One line each."""
        lines = []
        for host, why in refused.items():
            self.left_out[host] = LeftOut(host, why, 1, float("inf"), lost=True)  # no cooldown brings it back
            lines.append(f"spare {host} not used: {why}")
        return lines

    def to_check(self) -> list[str]:
        """The hosts to probe before a restart: the current attempt's, the spares not left out, and
        those left out whose cooldown has passed (they rejoin if they answer)."""
        assert self.placement is not None
        hosts = [task.host for task in self.placement.spec.tasks]
        hosts += [host for host in self.spare_hosts if host not in self.left_out]
        hosts += self._cooled()
        return list(dict.fromkeys(hosts))

    def _cooled(self) -> list[str]:
        now = self.clock()
        return [host for host, out in self.left_out.items() if now - out.since >= self.spec.cooldown]

    def without(self, host: str) -> str | None:
        """Why the cluster cannot do without ``host`` at the next attempt; None when a spare or
        ``min_workers`` allows it."""
        return place(self.spec, {*self.left_out, host}).shortfall

    def decide(self, attempt: int, lost: Mapping[str, str], machine: Mapping[str, str] | None = None,
               culprits: Collection[str] = ()) -> Decision:
        """The placement of attempt ``attempt`` after a failure: ``lost`` {host: why} did not answer
        the check (:meth:`to_check`'s hosts that did not); ``machine`` {host: why} failed the
        machine's way; ``culprits`` were named as the culprit of this failure and the one before."""
        now = self.clock()
        rejoined = [host for host in self._cooled() if host not in lost]
        for host in rejoined:
            del self.left_out[host]
        new: list[LeftOut] = []
        for host, why in lost.items():
            if host in self.left_out:  # still gone after its cooldown: the cooldown starts again
                self.left_out[host] = replace(self.left_out[host], since=now)
            else:
                new.append(LeftOut(host, f"lost ({why})", attempt, now, lost=True))
        chosen = dict(machine or {})
        for host in culprits:
            chosen.setdefault(host, "named as the culprit of two failures in a row")
        for host, why in chosen.items():
            if host in self.left_out or host in lost:
                continue
            # Left out by choice only where the cluster can do without it.
            trial = place(self.spec, {*self.left_out, *(o.host for o in new), host})
            if trial.shortfall is None:
                new.append(LeftOut(host, why, attempt, now, lost=False))
        for out in new:
            self.left_out[out.host] = out
        before = self.placement
        self.placement = place(self.spec, self.left_out)
        return Decision(attempt, self.placement, tuple(new), tuple(rejoined),
                        tuple(self._lines(attempt, before, new, rejoined)))

    def _lines(self, attempt: int, before: Placement | None, new: list[LeftOut], rejoined: list[str]) -> list[str]:
        placement = self.placement
        assert placement is not None
        if placement.shortfall:
            why = "; ".join(f"{o.host} {o.reason}" for o in (new or self.left_out.values()))
            return [f"{why}: attempt {attempt} cannot run: {placement.shortfall}; not restarting"]
        lines = []
        moves = {move.task: move for move in placement.moves}
        old = {move.task: move for move in before.moves} if before else {}
        told: set[str] = set()
        for out in new:
            on_host = [t.name for t in self.spec.tasks if t.host == out.host]
            told.update(on_host)
            lines.append(f"{out.host} {out.reason}; attempt {attempt} {self._runs(on_host, moves, placement)}")
        for host in rejoined:
            on_host = [t.name for t in self.spec.tasks if t.host == host]
            told.update(on_host)
            after = f"{self.spec.cooldown:g} s"
            lines.append(f"{host} answers again after its {after} cooldown: attempt {attempt} runs "
                         f"{', '.join(on_host) or 'nothing'} on it again" if on_host else
                         f"spare {host} answers again after its {after} cooldown and may stand in again")
        changed = [name for name, move in moves.items() if name not in told and old.get(name) != move]
        if changed:  # renumbered by a shrink, or back on their own host as a spare frees
            lines.append(f"attempt {attempt} runs {', '.join(moves[name].text for name in changed)}")
        return lines

    def _runs(self, names: list[str], moves: Mapping[str, Move], placement: Placement) -> str:
        """What the attempt does with the tasks ``names`` of a host left out."""
        parts = []
        spared = [moves[n].text for n in names if n in moves and moves[n].spare]
        dropped = [n for n in names if n in placement.dropped]
        if spared:
            parts.append("runs " + ", ".join(spared))
        if dropped:
            training = placement.spec.training_count
            floor = self.spec.min_workers
            parts.append(f"runs without {', '.join(dropped)} ({training} training task{'s' if training != 1 else ''}"
                         + (f", min_workers {floor})" if floor is not None else ")"))
        return "; ".join(parts) or "runs without it"
