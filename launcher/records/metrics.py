"""The metric line contract: how a task reports a figure, how tflaunch reads it, and who speaks for the run.

A task prints one JSON object per line after :data:`PREFIX` (``TFLAUNCH_METRIC {"kind": "epoch", ...}``).
A task that prints none has the epoch lines Keras prints read instead (:mod:`.kerasepochs`).
The output pump finds every metric line of a block once (:func:`metric_lines`), adds ``task``,
``attempt`` and ``time`` to its record, appends it to ``metrics.jsonl`` and hands the records to
the console. The built-in trainer writes these lines with its own copy of the prefix
(trainer/metrics.py): it never imports the launcher.

Under MultiWorkerMirroredStrategy every worker reports the same all-reduced figures, so one
task speaks for the run (:func:`speaker`): chief-0, else worker-0, else the first task to report.

What tflaunch holds of metrics is bounded: a metric line longer than :data:`LINE_MAX` is no metric
(it stays in the logs as a plain line, and tflaunch says so once per task), and ``metrics.jsonl``
is a bounded log (:mod:`.boundedlog`) of at most :data:`METRICS_MAX_SIZE`, or ``--log-max-size``
when that is smaller: its first records, a marker line saying how many bytes were left out, its
latest records.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from .kerasepochs import KerasState, may_hold, read_line

PREFIX = b"TFLAUNCH_METRIC "
LINE_MAX = 64 << 10  # a metric line's JSON may be this long: a record is a few hundred bytes, a big one a few KiB
METRICS_MAX_SIZE = 64 << 20  # metrics.jsonl's limit (or --log-max-size when smaller): 100,000s of records

Record = dict[str, Any]


def parse_line(line: bytes) -> Record | None:
    """The record a line carries; None when it carries none or a malformed one (which stays a plain line)."""
    start = line.find(PREFIX)
    if start < 0 or len(line) - start - len(PREFIX) > LINE_MAX:
        return None
    try:
        record = json.loads(line[start + len(PREFIX):])
    except (ValueError, RecursionError):  # RecursionError: nested deeper than json reads
        return None
    return record if isinstance(record, dict) else None


MetricLines = list[tuple[int, Record | None]]  # (index of the line in its block, its record)


def metric_lines(block: bytes, keras: KerasState = KerasState(), now: float | None = None) -> tuple[KerasState, MetricLines]:
    """The metric lines of a block of one task's complete lines, with the task's Keras state after
    it; ``now``, when the block arrived, times Keras's epochs where Keras rounds (:mod:`.kerasepochs`).

    One ``(index of the line in the block, record)`` per line that holds the prefix (its record,
    or None when malformed: it stays a plain line) and per Keras epoch result of a task that has
    printed no such line (see :mod:`.kerasepochs`), in order.
    """
    has_prefix = PREFIX in block
    if not has_prefix and not may_hold(block, keras):
        return keras, []
    found: MetricLines = []
    for index, line in enumerate(block.split(b"\n")):
        if has_prefix and PREFIX in line:
            found.append((index, parse_line(line)))
            keras = KerasState(explicit=True)
        elif not keras.explicit:
            keras, record = read_line(keras, line.decode("utf-8", "replace"), now)
            if record is not None:
                found.append((index, record))
    return keras, found


def oversized(block: bytes, found: MetricLines) -> int:
    """The length of the first metric line of ``block`` that is no metric for being over :data:`LINE_MAX`; 0 if none."""
    if all(record is not None for _, record in found):
        return 0
    lines = block.split(b"\n")
    return next((len(lines[index]) for index, record in found
                 if record is None and len(lines[index]) > LINE_MAX + len(PREFIX)), 0)


def scalars(record: Record) -> Record:
    """The record without its lists and objects: what is shown and compared of it is its single figures."""
    return {key: value for key, value in record.items() if not isinstance(value, (list, dict))}


def read_metrics(path: Path) -> list[Record]:
    """The records of a ``metrics.jsonl`` in the order they arrived, each with its single figures
    only (:func:`scalars`: held by the thousand, lists would cost a reader far more than the file);
    a half-written last line, and the marker of a file that outgrew its limit, are left out. A live
    file's latest records are read from its parts (:mod:`.logview`)."""
    # loaded by the readers only, not by the cluster's plan
    from .logformat import live_layout
    from .logview import read_view

    try:
        if live_layout(path) is not None:
            return _records(read_view(path).split(b"\n"))
        with open(path, "rb") as handle:
            return _records(handle)
    except OSError:
        return []


def _records(lines: Iterable[bytes]) -> list[Record]:
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            continue  # a marker, or a half-written last line
        if isinstance(record, dict):
            records.append(scalars(record))
    return records


def speaker(tasks: Iterable[str], reported: Iterable[str] = ()) -> str | None:
    """The task whose figures stand for the run: chief-0, else worker-0 (among ``tasks``), else the
    first of ``reported`` (the tasks in the order their records came)."""
    tasks = set(tasks)
    for name in ("chief-0", "worker-0"):
        if name in tasks:
            return name
    return next(iter(reported), None)


def trained_seconds(records: Iterable[Record]) -> float | None:
    """How long the run trained: the ``epoch_seconds`` of every epoch the task that speaks for each
    attempt (:func:`speaker`) reported, summed over the attempts; what the epoch lines add up to,
    without the task's start-up (TensorFlow's import) or its test. None when no epoch said its time.
    The closing summary and ``tflaunch report`` both show this figure."""
    by_attempt: dict[Any, list[Record]] = {}
    for record in records:
        if record.get("kind") == "epoch":
            by_attempt.setdefault(record.get("attempt", 1), []).append(record)
    total = None
    for found in by_attempt.values():
        tasks = [r.get("task") for r in found]
        epochs = [r["epoch_seconds"] for r in found if r.get("task") == speaker(tasks, tasks)
                  and _seconds(r.get("epoch_seconds"))]
        if epochs:
            total = (total or 0.0) + sum(epochs)
    return total


def _seconds(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 and value != float("inf")
