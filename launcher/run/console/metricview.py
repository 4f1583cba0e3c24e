"""Metric records as lines for people, each shown once (their text: :mod:`launcher.records.metrictext`).

Under MultiWorkerMirroredStrategy every worker prints the same epoch record (the values are
all-reduced), so the console shows those of the task that speaks for the run
(:func:`launcher.records.metrics.speaker`). The others are compared with it, and a disagreement is shown as a line
of its own rather than hidden. Records of other kinds, and those of an evaluator, are shown as
they come, labelled with their task.

What the board holds is bounded whatever the tasks print: the compared figures of the latest
:data:`KEPT` records shown (a record of an epoch older than those is no longer compared), and the
records of at most :data:`KEPT` epochs waiting for the task that speaks for the run (past that, the
oldest is shown without it), each as its text and its compared figures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

from ...records.metrics import speaker
from ...records.metrictext import number, record_text
from ...records.states import Role

_COMPARED = {"epoch": ("loss", "accuracy", "val_loss", "val_accuracy"), "final": ("test_loss", "test_accuracy")}

Line = tuple[str, str]  # (the task it is shown under, its text)
KEPT = 8  # epochs (or test results) whose records the board holds, shown or waiting


def _role(task: str) -> str:
    return task.rsplit("-", 1)[0]


def disagreement(kind: str, shown: dict[str, Any], other: dict[str, Any]) -> list[str]:
    """``loss 0.270 (0.262)`` for each compared value where ``other`` differs from ``shown``."""
    out = []
    for key in _COMPARED.get(kind, ()):
        a, b = shown.get(key), other.get(key)
        if number(a) is None and number(b) is None:
            continue
        if number(a) is None or number(b) is None or not math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-6):
            out.append(f"{key} {number(b, 4) or b} ({number(a, 4) or a})")
    return out


@dataclass
class MetricBoard:
    """Decides which metric records the console shows, and remembers progress for the status line."""

    tasks: dict[str, None] = field(default_factory=dict)  # every task of the run, in plan order
    shown_tasks: set[str] | None = None  # None: every task is shown
    epoch: int | None = None  # the latest epoch any task reported in the current attempt
    total: int | None = None  # epochs the run trains, when a record says
    attempt: int = 0
    # (attempt, kind, epoch) -> task -> (its text, its compared figures), oldest first
    _held: dict[tuple, dict[str, tuple[str, dict[str, Any]]]] = field(default_factory=dict)
    _shown: dict[tuple, tuple[str, dict[str, Any]]] = field(default_factory=dict)  # -> (task, compared figures)
    _first: dict[str, str] = field(default_factory=dict)  # kind -> the first task that reported it

    def register(self, names: Iterable[str]) -> None:
        for name in names:
            self.tasks.setdefault(name, None)

    def _visible(self, task: str) -> bool:
        return self.shown_tasks is None or task in self.shown_tasks

    def reporter(self, kind: str) -> str | None:
        """The task whose records of this kind stand for the cluster's (among the tasks shown)."""
        first = self._first.get(kind)
        return speaker([t for t in self.tasks if self._visible(t)], [first] if first else [])

    def add(self, task: str, attempt: int, record: dict[str, Any]) -> list[Line]:
        """The lines to show for a record that just arrived (possibly none yet)."""
        kind = str(record.get("kind") or "")
        lines: list[Line] = []
        if attempt > self.attempt:
            lines += self.release_all()  # an earlier attempt's records wait no longer
            self.attempt, self.epoch = attempt, None
        if kind == "epoch" and isinstance(record.get("epoch"), int):
            self.epoch = max(self.epoch or 0, record["epoch"])
        for key in ("epochs",):
            if isinstance(record.get(key), int):
                self.total = record[key]
        if not self._visible(task):
            return lines
        if kind not in _COMPARED or _role(task) not in (Role.CHIEF, Role.WORKER):
            return lines + [(task, record_text(record, self.total))]
        self._first.setdefault(kind, task)
        key = (attempt, kind, record.get("epoch") if kind == "epoch" else None)
        figures = {name: record.get(name) for name in _COMPARED[kind]}
        if task == self.reporter(kind):
            lines.append((task, record_text(record, self.total)))
            self._show(key, task, figures)
            for other, (_, held) in self._held.pop(key, {}).items():
                lines += self._compare(key, task, figures, other, held)
        elif key in self._shown:
            lines += self._compare(key, *self._shown[key], task, figures)
        else:
            self._held.setdefault(key, {})[task] = (record_text(record, self.total), figures)
            if len(self._held) > KEPT:  # the speaker is far behind, or silent: the oldest waits no longer
                lines += self._release_key(next(iter(self._held)))
        return lines

    def _show(self, key: tuple, task: str, figures: dict[str, Any]) -> None:
        self._shown[key] = (task, figures)
        while len(self._shown) > KEPT:
            del self._shown[next(iter(self._shown))]

    def release(self, ended: Iterable[str]) -> list[Line]:
        """Show the held records whose reporter is among the ``ended`` tasks and never sent its own."""
        ended = set(ended)
        lines: list[Line] = []
        for key in list(self._held):
            if self.reporter(key[1]) in ended:
                lines += self._release_key(key)
        return lines

    def _release_key(self, key: tuple) -> list[Line]:
        """Show the held records of ``key``: the first task's, and how the others differ from it."""
        held = self._held.pop(key)
        first = next(t for t in [*self.tasks, *sorted(held)] if t in held)
        text, figures = held[first]
        self._show(key, first, figures)
        return [(first, text)] + [line for other, (_, theirs) in held.items() if other != first
                                  for line in self._compare(key, first, figures, other, theirs)]

    def release_all(self) -> list[Line]:
        """Show every held record (the run or its attempt is over)."""
        lines = self.release({self.reporter(key[1]) for key in self._held})
        self._shown.clear()
        return lines

    def _compare(self, key: tuple, task: str, record: dict[str, Any], other: str,
                 other_record: dict[str, Any]) -> list[Line]:
        differences = disagreement(key[1], record, other_record)
        if not differences:
            return []
        what = f"epoch {key[2]}" if key[1] == "epoch" else "the test result"
        return [(other, f"{what} differs from {task}'s: {', '.join(differences)}")]
