"""run.json's compact text as the live rewrites write it: exactly
``json.dumps(record.to_json(), separators=(",", ":"))``, with each task's text kept from one
rewrite to the next while that task's values stay the same.

A run rewrites its record while its tasks start and run, and between two rewrites most tasks are as
they were (where and how each runs never changes in an attempt): encoding every task again made the
rewrites of a 256-task run cost it a millisecond per host at its start. Each task's values are
compared with the ones its kept text was made from, copies of them, so a text is never reused for
values that changed, also in place.
"""

from __future__ import annotations

import json
from dataclasses import fields
from operator import attrgetter
from typing import Any

from .record import RunRecord, TaskRecord, _plain

_RUN_FIELDS = tuple(f.name for f in fields(RunRecord))
_TASKS_AT = _RUN_FIELDS.index("tasks")
_TASK_FIELDS = tuple(f.name for f in fields(TaskRecord))
_HELD = frozenset(f.name for f in fields(TaskRecord) if f.type.startswith(("list", "dict")))  # copied to be kept
# Where and how a task runs (up to its env) stays the same through an attempt; its state and what
# came of it (from ``state`` on) change as it runs. Each part's text is kept apart.
_PARTS = (_TASK_FIELDS[:_TASK_FIELDS.index("state")], _TASK_FIELDS[_TASK_FIELDS.index("state"):])
_VALUES = tuple(attrgetter(*names) for names in _PARTS)  # a part's values, as one tuple
_HELD_AT = tuple(tuple(i for i, name in enumerate(names) if name in _HELD) for names in _PARTS)
_ENCODER = json.JSONEncoder(separators=(",", ":"))  # json.dumps's, made once rather than per call


def _dumps(value: Any) -> str:
    return _ENCODER.encode(value)


def _copied(values: tuple, held_at: tuple[int, ...]) -> tuple:
    """A part's values to compare later ones with: its lists and mappings (of plain values) copied."""
    copy = list(values)
    for i in held_at:
        if copy[i] is not None:
            copy[i] = copy[i].copy()
    return tuple(copy)


class CompactRecord:
    """The compact text of one run's records, rewrite after rewrite (see the module docstring)."""

    def __init__(self) -> None:
        # (task name, part) -> (the values its text was made from, the text, without its braces)
        self._kept: dict[tuple[str, int], tuple[tuple, str]] = {}

    def text(self, record: RunRecord) -> str:
        """``record`` as compact JSON, the same text as ``json.dumps`` of :meth:`RunRecord.to_json`."""
        head = {name: _plain(getattr(record, name)) for name in _RUN_FIELDS[:_TASKS_AT]}
        tail = {name: _plain(getattr(record, name)) for name in _RUN_FIELDS[_TASKS_AT + 1:]}
        kept, self._kept = self._kept, {}
        tasks = ",".join([f"{{{self._part(task, 0, kept)},{self._part(task, 1, kept)}}}" for task in record.tasks])
        parts = [_dumps(head)[1:-1]] if head else []
        parts.append(f'"tasks":[{tasks}]')
        if tail:
            parts.append(_dumps(tail)[1:-1])
        return "{" + ",".join(parts) + "}"

    def _part(self, task: TaskRecord, part: int, kept: dict[tuple[str, int], tuple[tuple, str]]) -> str:
        key, values = (task.name, part), _VALUES[part](task)
        found = kept.get(key)
        if found is None or found[0] != values:
            names = _PARTS[part]
            found = (_copied(values, _HELD_AT[part]), _dumps({name: _plain(value) for name, value in zip(names, values)})[1:-1])
        self._kept[key] = found
        return found[1]
