"""The metric line contract: how a task reports a figure, how tflaunch reads it, and who speaks for the run.

A task prints one JSON object per line after :data:`PREFIX` (``TFLAUNCH_METRIC {"kind": "epoch", ...}``).
The output pump parses each such line once (:func:`parse_block`), adds ``task``, ``attempt`` and
``time``, appends it to ``metrics.jsonl`` and hands the parsed records to the console. The
built-in trainer writes these lines with its own copy of the prefix (trainer/metrics.py): it
never imports the launcher.

Under MultiWorkerMirroredStrategy every worker reports the same all-reduced figures, so one
task speaks for the run (:func:`speaker`): chief-0, else worker-0, else the first task to report.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

PREFIX = b"TFLAUNCH_METRIC "

Record = dict[str, Any]


def parse_line(line: bytes) -> Record | None:
    """The record a line carries; None when it carries none or a malformed one (which stays a plain line)."""
    start = line.find(PREFIX)
    if start < 0:
        return None
    try:
        record = json.loads(line[start + len(PREFIX):])
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def parse_block(block: bytes) -> list[Record | None]:
    """One entry per line of ``block`` that holds the prefix, in order: its record, or None when malformed."""
    if PREFIX not in block:
        return []
    return [parse_line(line) for line in block.split(b"\n") if PREFIX in line]


def speaker(tasks: Iterable[str], reported: Iterable[str] = ()) -> str | None:
    """The task whose figures stand for the run: chief-0, else worker-0 (among ``tasks``), else the
    first of ``reported`` (the tasks in the order their records came)."""
    tasks = set(tasks)
    for name in ("chief-0", "worker-0"):
        if name in tasks:
            return name
    return next(iter(reported), None)
