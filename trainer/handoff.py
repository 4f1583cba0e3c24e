"""How the chief tells an evaluator task that training has ended: a marker file.

The chief writes a checkpoint per epoch into --checkpoint-dir (ckpt-<epoch>, see
trainer.checkpoints) and, once training has ended, the marker
``training-finished.json`` next to them:

    {"epochs": 8, "checkpoint": "ckpt-8", "run_id": "20261122-140501-a3f9"}

checkpoint names the final checkpoint; run_id is $TFLAUNCH_RUN_ID (null outside
tflaunch). An evaluator ends after evaluating that checkpoint. It ignores a
marker whose run_id is not its own, so a marker left by an earlier run in the
same directory does not end it early; the chief also removes any marker when it
starts. Pure file handling, no TensorFlow.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Mapping

MARKER = "training-finished.json"
RUN_ID_ENV = "TFLAUNCH_RUN_ID"  # set by the launcher (launcher/taskenv.py holds its copy of the name)
_NUMBERED = re.compile(r"-(\d+)$")


def marker_path(directory: str) -> str:
    return os.path.join(directory, MARKER)


def write_marker(directory: str, *, epochs: int, checkpoint: str, run_id: str | None) -> None:
    """Write the marker atomically (a reader never sees half of it)."""
    record = {"epochs": epochs, "checkpoint": os.path.basename(checkpoint), "run_id": run_id}
    temporary = marker_path(directory) + f".tmp-{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as out:
        json.dump(record, out)
    os.replace(temporary, marker_path(directory))


def remove_marker(directory: str) -> None:
    try:
        os.remove(marker_path(directory))
    except FileNotFoundError:
        pass


def read_marker(directory: str, run_id: str | None) -> dict[str, Any] | None:
    """The marker of this run, or None when there is none yet (or it belongs to another run)."""
    try:
        with open(marker_path(directory), encoding="utf-8") as source:
            record = json.load(source)
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("checkpoint"), str):
        return None
    if record.get("run_id") != run_id:
        return None
    return record


def run_id_of(environ: Mapping[str, str]) -> str | None:
    return environ.get(RUN_ID_ENV) or None


def checkpoint_epoch(path: str) -> int | None:
    """The epoch a checkpoint path ends with (ckpt-3 -> 3), or None."""
    match = _NUMBERED.search(os.path.basename(path))
    return int(match.group(1)) if match else None
