"""Metric records (``TFLAUNCH_METRIC {json}``) as lines for people, each shown once.

Under MultiWorkerMirroredStrategy every worker prints the same epoch record (the values are
all-reduced), so the console shows those of the task that speaks for the run
(:func:`launcher.records.metrics.speaker`). The others are compared with it, and a disagreement is shown as a line
of its own rather than hidden. Records of other kinds, and those of an evaluator, are shown as
they come, labelled with their task.

    epoch 3/8  loss 0.262  acc 0.920  val_loss 0.242  val_acc 0.911  2,575 samples/s  0.84 s
    test  loss 0.110  acc 0.963  8 epochs  14.78 s
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

from ..records.metrics import speaker

# (field, label, digits) in the order they are shown.
_EPOCH_VALUES = (("loss", "loss", 3), ("accuracy", "acc", 3), ("val_loss", "val_loss", 3),
                 ("val_accuracy", "val_acc", 3))
_FINAL_VALUES = (("test_loss", "loss", 3), ("test_accuracy", "acc", 3))
_COMPARED = {"epoch": ("loss", "accuracy", "val_loss", "val_accuracy"), "final": ("test_loss", "test_accuracy")}
_NOT_SHOWN = {"kind", "task", "time", "attempt"}

Line = tuple[str, str]  # (the task it is shown under, its text)


def number(value: Any, digits: int = 3) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return str(value) if isinstance(value, int) else f"{value:.{digits}f}"


def epoch_text(record: dict[str, Any], total: int | None = None) -> str:
    """``epoch 3/8  loss 0.262  acc 0.920  val_loss 0.242  val_acc 0.911  2,575 samples/s  0.84 s``."""
    epoch = record.get("epoch")
    total = record.get("epochs") if isinstance(record.get("epochs"), int) else total
    parts = [f"epoch {epoch}/{total}" if total else f"epoch {epoch}"]
    parts += [f"{label} {text}" for key, label, digits in _EPOCH_VALUES
              if (text := number(record.get(key), digits)) is not None]
    rate = record.get("samples_per_second")
    if number(rate) is not None:
        parts.append(f"{rate:,.0f} samples/s")
    seconds = record.get("epoch_seconds")
    if number(seconds) is not None:
        parts.append(f"{seconds:.2f} s")
    return "  ".join(parts)


def final_text(record: dict[str, Any]) -> str:
    """``test  loss 0.110  acc 0.963  8 epochs  14.78 s``."""
    parts = ["test"]
    parts += [f"{label} {text}" for key, label, digits in _FINAL_VALUES
              if (text := number(record.get(key), digits)) is not None]
    if isinstance(record.get("epochs"), int):
        parts.append(f"{record['epochs']} epochs")
    if number(record.get("total_seconds")) is not None:
        parts.append(f"{record['total_seconds']:.2f} s")
    return "  ".join(parts)


def other_text(record: dict[str, Any]) -> str:
    """Any other record: its kind, then its scalar fields in the order they came."""
    parts = [str(record.get("kind") or "metric")]
    for key, value in record.items():
        if key in _NOT_SHOWN or isinstance(value, (dict, list)):
            continue
        text = number(value, 4) if isinstance(value, float) else value
        parts.append(f"{key} {text}")
    return "  ".join(str(p) for p in parts)


def record_text(record: dict[str, Any], total: int | None = None) -> str:
    kind = record.get("kind")
    if kind == "epoch" and record.get("epoch") is not None:
        return epoch_text(record, total)
    if kind == "final":
        return final_text(record)
    return other_text(record)


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
    _held: dict[tuple, dict[str, dict[str, Any]]] = field(default_factory=dict)
    _shown: dict[tuple, tuple[str, dict[str, Any]]] = field(default_factory=dict)
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
        if kind not in _COMPARED or _role(task) not in ("chief", "worker"):
            return lines + [(task, record_text(record, self.total))]
        self._first.setdefault(kind, task)
        key = (attempt, kind, record.get("epoch") if kind == "epoch" else None)
        if task == self.reporter(kind):
            lines.append((task, record_text(record, self.total)))
            self._shown[key] = (task, record)
            for other, held in self._held.pop(key, {}).items():
                lines += self._compare(key, task, record, other, held)
        elif key in self._shown:
            lines += self._compare(key, *self._shown[key], task, record)
        else:
            self._held.setdefault(key, {})[task] = record
        return lines

    def release(self, ended: Iterable[str]) -> list[Line]:
        """Show the held records whose reporter is among the ``ended`` tasks and never sent its own."""
        ended = set(ended)
        lines: list[Line] = []
        for key in list(self._held):
            if self.reporter(key[1]) not in ended:
                continue
            held = self._held.pop(key)
            first = next(t for t in [*self.tasks, *sorted(held)] if t in held)
            lines.append((first, record_text(held[first], self.total)))
            self._shown[key] = (first, held[first])
            lines += [line for other, rec in held.items() if other != first
                      for line in self._compare(key, first, held[first], other, rec)]
        return lines

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
