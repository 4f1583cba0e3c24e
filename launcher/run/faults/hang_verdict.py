"""Which task holds a hung cluster up: every task's stacks compared, and the one that differs named.

:func:`verdict` is pure: parsed stacks (:mod:`.pyspy`) and roles in, a :class:`Verdict` out.
Each thread is reduced to where it is stopped: its *owner*, the innermost frame outside the
standard library (a ``time.sleep`` belongs to the code that called it), compared by function,
file and line, whether py-spy saw the thread idle or active. A task's *signature* is the set of
its threads' places. Then:

1. tasks are compared with their peers only: chief and workers together under
   MultiWorkerMirroredStrategy; with ``ps`` tasks (ParameterServerStrategy, where the chief
   coordinates and the others serve) each role apart; evaluators always apart, and never blamed
   unless they are a minority among several evaluators;
2. in a group of peers, when one signature is shared by more than half of the tasks and the
   others are at most a third of the group, those others are the culprits (a clear minority);
3. otherwise, when a clear minority of the tasks (at most a third, or one of two) have a thread
   stopped in the user's code at a place that at most half of the tasks share, while every other
   task is stopped only inside libraries (waiting in TensorFlow), those tasks are the culprits
   (what tells one of two MWMS workers from the other, and a lone PS chief from its servers);
4. when every task has the same signature, the verdict says so and blames no task (a deadlock
   inside TensorFlow, a network partition, a wait they all share); any other split blames none.

:func:`sample_stacks` asks every task's agent for its stacks at once (one thread per task, so 64
tasks cost about one py-spy run, not 64 in a row).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .pyspy import LIBRARY, USER, Dump, Frame, Thread
from ...records.states import Role, plural

_SAMPLING = threading.Lock()  # one sample at a time: an agent answers one dump per task at a time


@dataclass(frozen=True)
class Place:
    """Where one thread is stopped."""

    thread: str
    innermost: Frame
    owner: Frame        # the innermost frame outside the standard library
    user: Frame | None  # the innermost frame of the user's code

    @property
    def key(self) -> tuple[str, str, str, int | None]:
        # The line is kept, and for every thread alike. A stuck task is often in the same function
        # as its peers but at another line (one more wait, one sleep before the collective), and
        # the line is what sets it apart. A thread that is stuck stays at its line whether py-spy
        # calls it idle or active: that flag is the OS's view of the thread at the sampling moment
        # (a spin on a lock, a busy poll in C), so two tasks at the same line can get different
        # flags and must still be in the same place. (A thread that really computes moves from line
        # to line, but a task that computes is not the one holding a hang up.)
        return (self.owner.kind, self.owner.function, self.owner.file, self.owner.line)

    @property
    def in_user_code(self) -> bool:
        return self.owner.kind == USER

    def describe(self) -> str:
        text = f"{self.thread} in {self.innermost}"
        return text if self.user is None or self.user == self.innermost else f"{text}, from {self.user}"

    def to_json(self) -> dict[str, Any]:
        frame = self.user or self.owner
        return {"thread": self.thread, "function": frame.function, "file": frame.file, "line": frame.line,
                "innermost": str(self.innermost), "code": self.owner.kind}


def places_of(dump: Dump) -> tuple[Place, ...]:
    return tuple(_place(thread) for thread in dump.threads)


def _place(thread: Thread) -> Place:
    return Place(thread.label, thread.frames[0], thread.owner, thread.user_frame)


@dataclass(frozen=True)
class Culprit:
    task: str
    role: str
    places: tuple[Place, ...]  # the threads that set it apart (all of them when it only lacks some)

    def describe(self) -> str:
        return "; ".join(p.describe() for p in self.places)


@dataclass(frozen=True)
class Crowd:
    """Tasks that were all in the same places."""

    tasks: tuple[str, ...]
    places: tuple[Place, ...]  # the first task's, as an example of all

    def describe(self) -> str:
        shown = sorted(self.places, key=lambda p: (p.thread != "MainThread", p.owner.kind != LIBRARY))[:2]
        more = len(self.places) - len(shown)
        return "; ".join(p.describe() for p in shown) + (f" (and {plural(more, 'more thread')})" if more > 0 else "")


SAME_PLACE = "same-place"
CULPRIT = "culprit"
UNCLEAR = "unclear"
NO_STACKS = "no-stacks"


@dataclass(frozen=True)
class Verdict:
    kind: str  # CULPRIT, SAME_PLACE, UNCLEAR or NO_STACKS
    culprits: tuple[Culprit, ...] = ()
    others: tuple[Crowd, ...] = ()  # everyone else, grouped by where they were
    missing: tuple[tuple[str, str], ...] = ()  # (task, why it has no stacks)

    @property
    def tasks(self) -> tuple[str, ...]:
        return tuple(c.task for c in self.culprits)

    def summary(self) -> str:
        """One line: who differs and where, and what the others were doing."""
        if self.kind == CULPRIT:
            who = names([c.task for c in self.culprits])
            verb = "differs" if len(self.culprits) == 1 else "differ"
            where = (self.culprits[0].describe() if len(self.culprits) == 1
                     else "; ".join(f"{c.task}: {c.describe()}" for c in self.culprits))
            text = f"{who} {verb} from the rest: {where}"
            if self.others:
                text += "; " + "; ".join(f"{names(c.tasks)} {'is' if len(c.tasks) == 1 else 'are'} at: {c.describe()}"
                                         for c in self.others[:2])
        elif self.kind == SAME_PLACE:
            text = (f"every task is in the same place ({self.others[0].describe()}): no task to blame; "
                    "they all wait for something outside them (a deadlock in TensorFlow, the network, a shared wait)")
        elif self.kind == UNCLEAR:
            text = "the tasks are in different places and no clear minority stands out: no task to blame"
        else:
            text = "no stacks to compare"
        if self.missing:
            text += f" (no stacks from {names([task for task, _ in self.missing])}: {self.missing[0][1]})"
        return text

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.kind, "summary": self.summary(),
                "culprits": [{"task": c.task, "role": c.role, "threads": [p.to_json() for p in c.places]}
                             for c in self.culprits],
                "others": [{"tasks": list(c.tasks), "threads": [p.to_json() for p in c.places]} for c in self.others],
                "no_stacks": dict(self.missing)}


def names(tasks: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``; beyond four, ``N tasks (a, b, c, ...)``."""
    tasks = list(tasks)
    if len(tasks) > 4:
        return f"{len(tasks)} tasks ({', '.join(tasks[:3])}, ...)"
    return " and ".join([", ".join(tasks[:-1]), tasks[-1]]) if len(tasks) > 1 else "".join(tasks)


def peer_groups(roles: Mapping[str, str]) -> list[list[str]]:
    """The tasks that run the same code and so should be in the same places (see the module docstring)."""
    with_ps = Role.PS in roles.values()
    groups: dict[str, list[str]] = {}
    for task, role in roles.items():
        key = role if with_ps or role not in (Role.CHIEF, Role.WORKER) else "training"
        groups.setdefault(key, []).append(task)
    return list(groups.values())


def verdict(dumps: Mapping[str, Dump], roles: Mapping[str, str]) -> Verdict:
    """Compare every task's stacks; name the tasks that differ, or none (rules in the module docstring)."""
    missing = tuple((task, dump.problem or "no threads") for task, dump in dumps.items() if not dump.threads)
    places = {task: places_of(dump) for task, dump in dumps.items() if dump.threads}
    if not places:
        return Verdict(NO_STACKS, missing=missing)
    signatures = {task: frozenset(p.key for p in found) for task, found in places.items()}
    found_roles = {task: roles.get(task, Role.WORKER) for task in places}
    culprits: dict[str, Culprit] = {}
    for group in peer_groups(found_roles):
        counts = Counter(signatures[task] for task in group)
        top, top_count = counts.most_common(1)[0]
        rest = [task for task in group if signatures[task] != top]
        clear = rest and top_count * 2 > len(group) and len(rest) * 3 <= len(group)
        if clear:
            for task in rest:
                odd = tuple(p for p in places[task] if p.key not in top) or places[task]
                culprits[task] = Culprit(task, found_roles[task], odd)
    if not culprits:
        culprits = _in_user_code(places, found_roles)
    compared = [task for task in places if found_roles[task] != Role.EVALUATOR] or list(places)
    if culprits:
        kind = CULPRIT
    elif len({signatures[task] for task in compared}) == 1:
        kind = SAME_PLACE
    else:
        kind = UNCLEAR
    crowds: dict[frozenset, list[str]] = {}
    for task in places:
        if task not in culprits and (kind != SAME_PLACE or task in compared):
            crowds.setdefault(signatures[task], []).append(task)
    others = tuple(Crowd(tuple(tasks), places[tasks[0]])
                   for tasks in sorted(crowds.values(), key=lambda tasks: -len(tasks)))
    ordered = tuple(culprits[task] for task in places if task in culprits)
    return Verdict(kind, ordered, others, missing)


def _in_user_code(places: Mapping[str, tuple[Place, ...]], roles: Mapping[str, str]) -> dict[str, Culprit]:
    """Rule 3: the tasks stopped in the user's code, when all the others wait inside libraries."""
    pool = [task for task in places if roles[task] != Role.EVALUATOR]
    if len(pool) < 2:
        return {}
    held = Counter(key for task in pool for key in {p.key for p in places[task] if p.in_user_code})
    odd = {task: tuple(p for p in places[task] if p.in_user_code and held[p.key] * 2 <= len(pool)) for task in pool}
    odd = {task: found for task, found in odd.items() if found}
    in_user = {task for task in pool if any(p.in_user_code for p in places[task])}
    # A clear minority, as in rule 2; of two tasks, one in its own code while the other waits for it
    # in a collective is no tie.
    minority = len(odd) * 3 <= len(pool) or (len(pool) == 2 and len(odd) == 1)
    if not odd or set(odd) != in_user or not minority:
        return {}
    return {task: Culprit(task, roles[task], found) for task, found in odd.items()}


# -- sampling -----------------------------------------------------------------------------------


def sample_stacks(processes: Mapping[str, Any], timeout: float) -> dict[str, str] | None:
    """Every task's stacks, all asked for at once (``processes``: task name -> its TaskProcess).

    Returns None when another sample is still running after ``timeout`` seconds. A task whose
    agent does not answer in time gets the agent's "no stack dump: ..." text.
    """
    deadline = time.monotonic() + timeout
    if not _SAMPLING.acquire(timeout=max(0.0, timeout)):
        return None
    try:
        texts: dict[str, str] = {}

        def dump(task: str, process: Any) -> None:
            try:
                texts[task] = process.dump_stacks(timeout=max(0.1, deadline - time.monotonic()))
            except Exception as exc:  # a broken link is one task without stacks, not a failed sample
                texts[task] = f"no stack dump: {exc}\n"

        threads = [threading.Thread(target=dump, args=item, name=f"tflaunch-stacks-{item[0]}", daemon=True)
                   for item in processes.items()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()) + 1.0)
        return {task: texts.get(task, f"no stack dump: no answer within {timeout:g} s\n") for task in processes}
    finally:
        _SAMPLING.release()
