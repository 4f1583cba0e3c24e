"""``slurm.json``: what a Slurm job adds to its run folder, and how a job not yet started is listed.

``tflaunch submit`` writes it when it submits the job (``job_id``, ``script``, ``submitted_at``);
each execution of the job inside the allocation adds ``restart_count``, ``nodelist``,
``batch_host`` and ``started_at``, and a requeue appends to ``requeues`` (:mod:`launcher.slurm.job`
and :mod:`launcher.run.lifecycle.slurmjob` write it). A folder with ``slurm.json`` but no ``run.json`` yet is
a submitted job whose run has not started: :func:`pending_record` stands in for its record.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from .files import write_atomically
from .folder import SLURM_RECORD
from .record import RunRecord, RunStatus


def read_slurm_record(folder: Path) -> dict:
    """slurm.json's object; empty when it is missing or holds anything else (a damaged file hides no run)."""
    try:
        record = json.loads((Path(folder) / SLURM_RECORD).read_text())
    except (OSError, ValueError, RecursionError):
        return {}
    return record if isinstance(record, dict) else {}


def write_slurm_record(folder: Path, record: Mapping) -> None:
    write_atomically(Path(folder) / SLURM_RECORD, json.dumps(record, indent=2) + "\n")


def pending_record(folder: Path) -> RunRecord | None:
    """A stand-in record for a submitted job whose run has not written run.json yet."""
    slurm = read_slurm_record(folder)
    job_id, submitted = slurm.get("job_id"), slurm.get("submitted_at")
    if not isinstance(job_id, (str, int)) or isinstance(job_id, bool) or not str(job_id):
        return None
    return RunRecord(run_id=Path(folder).name, source=f"submit (job {job_id})", status=RunStatus.RUNNING,
                     started_at=submitted if isinstance(submitted, str) else None)
