"""run.json's compact text as the live rewrites write it: exactly
``json.dumps(record.to_json(), separators=(",", ":"))``, with each task's text kept from one
rewrite to the next while that task's values stay the same.

A run rewrites its record while its tasks start and run, and between two rewrites most tasks are as
they were (where and how each runs never changes in an attempt). At 256 tasks, encoding every task
takes 3.4 ms of CPU a rewrite; with the kept texts, 1.0 ms when none changed and 1.8 when half did
(the first rewrite, every task new, 5 ms). Each task's values are compared with copies of the ones
its kept text was made from, so a text is never reused for values that changed, also in place.
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
_CUT = f',"{_PARTS[1][0]}":'  # where a task's text turns from the first part to the second
if any(f.name in _PARTS[1] and ("dict" in f.type or "list" in f.type and f.type != "list[str]")
       for f in fields(TaskRecord)):
    raise TypeError("TaskRecord: a field after 'state' holds a mapping or a list of more than strings, "
                    "whose text could hold the cut between a task's two parts")
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
        # task name -> (values of where and how it runs, their text, values of its state and what
        # came of it, their text), each text without braces
        self._kept: dict[str, tuple[tuple, str, tuple, str]] = {}

    def text(self, record: RunRecord) -> str:
        """``record`` as compact JSON, the same text as ``json.dumps`` of :meth:`RunRecord.to_json`."""
        head = {name: _plain(getattr(record, name)) for name in _RUN_FIELDS[:_TASKS_AT]}
        tail = {name: _plain(getattr(record, name)) for name in _RUN_FIELDS[_TASKS_AT + 1:]}
        kept, self._kept = self._kept, {}
        tasks = ",".join([self._task(task, kept) for task in record.tasks])
        parts = [_dumps(head)[1:-1]] if head else []
        parts.append(f'"tasks":[{tasks}]')
        if tail:
            parts.append(_dumps(tail)[1:-1])
        return "{" + ",".join(parts) + "}"

    def _task(self, task: TaskRecord, kept: dict[str, tuple[tuple, str, tuple, str]]) -> str:
        fixed, changing = _VALUES[0](task), _VALUES[1](task)
        entry = kept.get(task.name)
        if entry is not None and entry[0] == fixed:
            if entry[2] != changing:
                text = _dumps({name: _plain(value) for name, value in zip(_PARTS[1], changing)})[1:-1]
                entry = (entry[0], entry[1], _copied(changing, _HELD_AT[1]), text)
        else:
            # The whole task at once, cut where its state begins: every value after that key is a
            # number, a string or a list of strings, whose JSON text holds no unescaped quote, so
            # the last ',"state":' in the text is that key.
            whole = _dumps(_plain(task))
            cut = whole.rindex(_CUT)
            entry = (_copied(fixed, _HELD_AT[0]), whole[1:cut], _copied(changing, _HELD_AT[1]), whole[cut + 1:-1])
        self._kept[task.name] = entry
        return f"{{{entry[1]},{entry[3]}}}"
