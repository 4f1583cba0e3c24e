"""The global batch and the resume point when a restarted attempt has another number of workers.

MultiWorkerMirroredStrategy cannot change its workers while it runs, so a cluster that lost a host
restarts whole, with a new TF_CONFIG, and resumes from the backup. The weights load whatever the
worker count (the variables are mirrored); what this module keeps right is the rest:

- The global batch is the invariant: the per-replica batch is recomputed from it for this attempt's
  replica count (:func:`split_batch`). Unless --global-batch names it, it is --batch-per-worker times
  the replica count of the first attempt, which the record below keeps.
- A backup written by another shape of cluster (:class:`Shape`: workers, replicas, global batch,
  steps per epoch) counted its steps in that shape, and the input iterator's position is in no
  backup (TensorFlow cannot checkpoint a distributed iterator), so such a backup resumes at the
  start of its epoch, never in the middle (:func:`resume_point`).

The record is a small JSON file beside the backup's checkpoint, in the chief's backup folder, so it
goes when the backup goes (a finished run removes both)::

    {"global_batch": 192, "written_by": [{"workers": 3, "replicas": 3, "global_batch": 192,
                                          "steps_per_epoch": 7}]}

global_batch is the global batch the run keeps; written_by the shape that wrote the newest backup.
The chief writes it when it finds none, and again around the first backup an attempt of another
shape writes: before it, listing both shapes (either may have written the newest backup if the
attempt dies while saving, and a list of two resumes at the epoch's start), after it, the new shape
alone. Every worker reads it before training and the chief rewrites it only after a training step,
which every worker must have reached, so all of them decide alike. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import Mapping

RECORD_NAME = "trainer-shape.json"
MAX_RECORD_BYTES = 64 * 1024


class RecordError(Exception):
    """The record in the backup folder cannot be read; the message names the file."""


@dataclass(frozen=True)
class Shape:
    """What a step and an epoch are in one attempt: equal shapes count steps alike."""

    workers: int
    replicas: int
    global_batch: int
    steps_per_epoch: int


@dataclass(frozen=True)
class Record:
    global_batch: int
    written_by: tuple[Shape, ...]


def split_batch(global_batch: int, replicas: int) -> tuple[int, int]:
    """(per-replica batch, the global batch this attempt uses): global_batch / replicas rounded to
    the nearest whole number (halves up), at least 1; the second differs from global_batch exactly
    when it does not divide evenly."""
    per_replica = max(1, (2 * global_batch + replicas) // (2 * replicas))
    return per_replica, per_replica * replicas


def target_global_batch(option: int | None, batch_per_worker: int, replicas: int,
                        record: Record | None) -> int:
    """The global batch the run keeps: --global-batch, else the recorded one, else this attempt's
    --batch-per-worker times its replica count (the first attempt's, once recorded)."""
    if option is not None:
        return option
    if record is not None:
        return record.global_batch
    return batch_per_worker * replicas


def same_shape(record: Record | None, current: Shape) -> bool:
    """Whether the newest backup was surely written by a cluster of this attempt's shape (no record:
    a backup from before records existed, or none at all, taken as this shape's, as before)."""
    return record is None or all(shape == current for shape in record.written_by)


def resume_point(epoch: int, steps_done: int, record: Record | None, current: Shape) -> tuple[int, int]:
    """(epoch, step), both from 0, where training resumes from a backup taken after ``steps_done``
    steps of ``epoch`` (0-based).

    A finished epoch resumes at the next one. Otherwise a backup of the same shape resumes at the
    next step, and one of another shape at the start of its epoch: its steps counted another size,
    or its data came in another order. Whether the epoch was finished is judged by the steps per
    epoch of the shapes that may have written it: by all of them, so a doubt repeats the epoch."""
    steps = [shape.steps_per_epoch for shape in record.written_by] if record else [current.steps_per_epoch]
    if steps_done >= max(steps):
        return epoch + 1, 0
    if same_shape(record, current):
        return epoch, steps_done
    return epoch, 0


def uneven_note(global_batch: int, replicas: int) -> str | None:
    """The line to print when global_batch does not divide among the replicas, else None."""
    per_replica, used = split_batch(global_batch, replicas)
    if used == global_batch:
        return None
    return (f"the global batch {global_batch} does not divide among {replicas} replicas: "
            f"{per_replica} per replica, a global batch of {used} in this attempt")


def resize_note(record: Record, current: Shape, epoch: int) -> str:
    """The line saying how a backup of another shape resumes (epoch from 0)."""
    before = record.written_by[0]
    if before.workers != current.workers:
        changed = f"{_count(before.workers, 'worker')}, this attempt has {current.workers}"
    else:
        changed = f"{_count(before.replicas, 'replica')}, this attempt has {current.replicas}"
    per_replica = current.global_batch // current.replicas
    if current.global_batch == before.global_batch:
        batch = f"the same global batch {current.global_batch} ({per_replica} per replica)"
    else:
        batch = (f"a global batch of {current.global_batch} ({per_replica} per replica; "
                 f"it was {before.global_batch})")
    return f"the backup was written by {changed}: resuming at the start of epoch {epoch + 1} with {batch}"


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


# ---------------------------------------------------------------- the file

def record_path(backup_dir: str) -> str:
    return os.path.join(backup_dir, "chief", RECORD_NAME)


def parse_record(text: str, source: str) -> Record:
    """The record in text; RecordError naming source and the bad field otherwise."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecordError(f"{source}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise RecordError(f"{source}: expected a JSON object")
    global_batch = _positive(data, "global_batch", source)
    shapes = data.get("written_by")
    if not isinstance(shapes, list) or not shapes:
        raise RecordError(f"{source}: written_by: expected a non-empty list")
    written_by = []
    for index, item in enumerate(shapes):
        if not isinstance(item, dict):
            raise RecordError(f"{source}: written_by[{index}]: expected an object")
        written_by.append(Shape(**{name: _positive(item, name, f"{source}: written_by[{index}]")
                                   for name in ("workers", "replicas", "global_batch", "steps_per_epoch")}))
    return Record(global_batch, tuple(written_by))


def _positive(data: Mapping, name: str, source: str) -> int:
    value = data.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise RecordError(f"{source}: {name}: expected a positive integer, got {value!r}")
    return value


def format_record(record: Record) -> str:
    return json.dumps({"global_batch": record.global_batch,
                       "written_by": [asdict(shape) for shape in record.written_by]})


def read_record(backup_dir: str) -> Record | None:
    """The record in backup_dir, or None when there is none."""
    path = record_path(backup_dir)
    try:
        with open(path, encoding="utf-8") as stream:
            text = stream.read(MAX_RECORD_BYTES + 1)
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise RecordError(f"{path}: cannot be read ({exc})") from None
    if len(text) > MAX_RECORD_BYTES:
        raise RecordError(f"{path}: larger than {MAX_RECORD_BYTES} bytes, not a record of the trainer")
    return parse_record(text, path)


def write_record(backup_dir: str, record: Record) -> None:
    """Replace the record at once (a reader sees the old one or the new one, never half of one)."""
    path = record_path(backup_dir)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w", encoding="utf-8") as stream:
        stream.write(format_record(record) + "\n")
    os.replace(temporary, path)


class Keeper:
    """One attempt's side of the record: what it found, how a backup resumes, and keeping the record
    in step with the backups (the chief writes; the other workers only read)."""

    def __init__(self, backup_dir: str, found: Record | None, target: int, current: Shape, writes: bool):
        self.backup_dir = backup_dir
        self.found = found
        self.target = target
        self.current = current
        self.writes = writes
        self._settled = found == Record(target, (current,))

    def resume_point(self, epoch: int, steps_done: int) -> tuple[int, int]:
        return resume_point(epoch, steps_done, self.found, self.current)

    def note(self, epoch: int) -> str | None:
        """The line to print when resuming at ``epoch`` (from 0) from a backup of another shape."""
        if same_shape(self.found, self.current):
            return None
        return resize_note(self.found, self.current, epoch)

    def start(self) -> None:
        """Before training: a run without a record gets one, so later attempts keep its global batch."""
        if self.writes and self.found is None:
            write_record(self.backup_dir, Record(self.target, (self.current,)))
            self._settled = True

    def before_backup(self) -> None:
        if self.writes and not self._settled:
            shapes = tuple(dict.fromkeys((*self.found.written_by, self.current)))
            write_record(self.backup_dir, Record(self.target, shapes))

    def after_backup(self) -> None:
        if self.writes and not self._settled:
            write_record(self.backup_dir, Record(self.target, (self.current,)))
            self._settled = True
