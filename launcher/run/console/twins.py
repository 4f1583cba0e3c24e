"""Twins: the same line from several tasks, printed once under all their names.

At scale every task prints the same warnings; 256 tasks that each print 3 lines would fill 768
console lines. The console hands each shown line to a :class:`TwinFolder` instead of printing it:

- a line waits at most ``hold`` seconds (half a second) for its twins, counted from when the
  first task's copy arrived, then prints once with every task that had it by then
  (``worker-[0-15] | WARNING: ...``); a copy that comes later starts a line of its own;
- nothing is dropped and each task's lines keep their order: a task joins a waiting line only
  when that line prints after every line the task is already waiting with;
- lines print in the order their first copies arrived.

Twins are lines with equal :func:`launcher.run.console.chatter.twin_key`: the same bytes, or TensorFlow
log lines that differ only in their time and thread id (the first task's copy is shown).

:func:`names_text` is the one way a set of tasks is named in a line (the summary table too):
``worker-3``, ``worker-[0-3,5,7-9]``, ``chief-0,worker-[0-14]``.
"""

from __future__ import annotations

import bisect
import collections
from operator import itemgetter
from typing import Callable, Iterable

from .chatter import may_be_stamped, twin_key

HOLD = 0.5  # seconds a line waits at most for the same line from other tasks
MAX_WAITING = 20_000  # lines waiting at once; beyond it the oldest print early (a flood's memory stays bounded)


# A waiting line is a list, for speed (a flood passes through here line by line):
_SEQ, _DUE, _KEY, _LINE, _TASKS = range(5)  # its order, when it prints at the latest, key, text, tasks
_seq = itemgetter(_SEQ)


class TwinFolder:
    """Lines of many tasks in, each distinct line out once with the tasks that wrote it.

    Pure: the caller says what time it is, so the rule is tested without waiting.
    """

    def __init__(self, hold: float = HOLD, max_waiting: int = MAX_WAITING):
        self.hold = hold
        self.max_waiting = max_waiting
        self._waiting: collections.deque[list] = collections.deque()  # oldest first
        # The waiting lines of each key, oldest first: a deque, because a flood of one line (a task
        # printing the same text over and over) leaves thousands under one key, taken from the front.
        self._open: dict[object, collections.deque[list]] = {}
        self._last: dict[str, int] = {}  # task -> order of the last waiting line it joined
        self._seq = 0

    def __len__(self) -> int:
        return len(self._waiting)

    def add(self, task: str, line: bytes, now: float) -> None:
        """One line of ``task`` (no ``\\n``)."""
        self._add(task, [line], [twin_key(line)], now)

    def add_block(self, task: str, block: bytes, now: float) -> None:
        """A block of complete lines of ``task``, each ending in ``\\n``."""
        lines = block[:-1].split(b"\n")
        self._add(task, lines, list(map(twin_key, lines)) if may_be_stamped(block) else lines, now)

    def _add(self, task: str, lines: list[bytes], keys: list, now: float) -> None:
        opened, waiting, seq, last = self._open, self._waiting, self._seq, self._last.get(task, -1)
        due = now + self.hold
        for line, key in zip(lines, keys):
            twins = opened.get(key)
            # The oldest that prints after every line the task waits with: an older one would swap
            # them. None when the newest is that old already (a task repeating itself: no search).
            if twins is not None and twins[-1][_SEQ] > last:
                twin = twins[0] if twins[0][_SEQ] > last else twins[bisect.bisect_right(twins, last, key=_seq)]
                twin[_TASKS].append(task)
                last = twin[_SEQ]
                continue
            twin = [seq, due, key, line, [task]]
            if twins is None:
                opened[key] = collections.deque((twin,))
            else:
                twins.append(twin)
            waiting.append(twin)
            last = seq
            seq += 1
        self._seq = seq
        self._last[task] = last

    def withdraw(self, picked: Callable[[str], bool], first: Callable[[bytes], bool]) -> dict[str, int]:
        """Take back the waiting lines of each task ``picked`` says, from its first that ``first``
        accepts on: ``{task: lines taken}``. A line left with no task prints nothing."""
        taken: dict[str, int] = {}
        for twin in self._waiting:
            tasks = twin[_TASKS]
            gone = [task for task in tasks if task in taken or (picked(task) and first(twin[_LINE]))]
            for task in gone:
                taken[task] = taken.get(task, 0) + 1
            if gone:
                tasks[:] = [task for task in tasks if task not in gone]
        return taken

    def next_due(self) -> float | None:
        """When the oldest waiting line prints at the latest; None when none waits."""
        return self._waiting[0][_DUE] if self._waiting else None

    def due(self, now: float) -> list[tuple[list[str], bytes]]:
        """The lines whose wait is over, oldest first, each with the tasks that wrote it."""
        return self._pop(now)

    def flush(self) -> list[tuple[list[str], bytes]]:
        """Every waiting line, oldest first (the run ended, or a message must come after them)."""
        return self._pop(float("inf"))

    def _pop(self, now: float) -> list[tuple[list[str], bytes]]:
        waiting, opened, out = self._waiting, self._open, []
        excess = len(waiting) - self.max_waiting
        while waiting and (excess > 0 or waiting[0][_DUE] <= now):
            done = waiting.popleft()
            excess -= 1
            twins = opened[done[_KEY]]  # lines leave in order, so this one is the oldest of its key
            if len(twins) == 1:
                del opened[done[_KEY]]
            else:
                twins.popleft()
            if done[_TASKS]:
                out.append((done[_TASKS], done[_LINE]))
        return out


def names_text(names: Iterable[str]) -> str:
    """Tasks named compactly and without ambiguity, roles in the order they first appear.

    ``worker-3``; ``worker-[0,1]``; ``worker-[0-3,5,7-9]``; ``chief-0,worker-[0-14]``. A run of
    three or more indices is a range; a name that is not ``role-index`` stands as itself.
    """
    parts: dict[tuple[str, str], set[int]] = {}
    for name in names:
        role, dash, index = name.rpartition("-")
        if dash and role and index.isdigit() and str(int(index)) == index:
            parts.setdefault(("role", role), set()).add(int(index))
        else:
            parts.setdefault(("name", name), set())
    out = []
    for (kind, text), indices in parts.items():
        if kind == "name":
            out.append(text)
        elif len(indices) == 1:
            out.append(f"{text}-{next(iter(indices))}")
        else:
            out.append(f"{text}-[{index_ranges(sorted(indices))}]")
    return ",".join(out)


def index_ranges(indices: list[int]) -> str:
    """Sorted distinct indices as ``0-3,5,7-9``: runs of three or more as ranges."""
    runs: list[list[int]] = []
    for index in indices:
        if runs and index == runs[-1][-1] + 1:
            runs[-1].append(index)
        else:
            runs.append([index])
    return ",".join(f"{run[0]}-{run[-1]}" if len(run) >= 3 else ",".join(map(str, run)) for run in runs)
