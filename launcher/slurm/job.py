"""A Slurm job's run folder, and Slurm's view of a job that has not ended.

**Run folder.** ``tflaunch submit`` makes the run folder first (the sbatch script and its
``slurm.json`` live there) and the job runs with ``--run-dir`` set to it, so whatever the backend
a run has one folder. A ``--slurm`` run started from a user's own script gets a new folder under
the log directory, tagged with the job id in ``slurm.json`` (:mod:`launcher.records.slurm`).

**Requeued jobs** (``SLURM_RESTART_COUNT`` > 0) rerun the batch script with the same job id. Their
run takes the same folder again (found by ``--run-dir`` or by the job id), after moving the
previous execution's ``run.json``, task logs and ``attempt-*`` folders into ``requeue-<k>/``. ``merged.log``
and ``metrics.jsonl`` carry on, and ``backup/`` stays where the tasks' ``TFLAUNCH_BACKUP_DIR``
points, so the requeued job resumes from the last backup.

The run inside the job, its warning signal and the requeue are :mod:`launcher.run.lifecycle.slurmjob`'s.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path

from ..errors import ConfigError
from ..records.folder import (ATTEMPT_PREFIX, DEFAULT_LOG_DIR, MERGED, RECORD, TASK_LOG_SUFFIX, RunFolder,
                              TENSORBOARD_LOG, iso_time, part_of, requeue_name)
from ..records.files import make_folder, swappable_by_others
from ..records.slurm import read_slurm_record, write_slurm_record
from ..records.states import RunStatus
from .commands import job_states


def find_job_folder(log_dir: Path, job_id: str) -> Path | None:
    """The run folder an earlier execution of this job used (requeued jobs come back to it)."""
    if not log_dir.is_dir():
        return None
    for path in sorted(log_dir.iterdir(), reverse=True):
        if path.is_dir() and str(read_slurm_record(path).get("job_id")) == job_id:
            return path
    return None


def archive_previous_execution(folder: Path, restart_count: int) -> Path | None:
    """Move the last execution's record, task logs and attempt folders aside so this one starts
    clean (merged.log stays: it goes on across executions)."""
    old = [p for p in folder.iterdir()
           if p.name == RECORD or p.name.startswith(ATTEMPT_PREFIX) or _task_log(p.name)]
    if not old:
        return None
    target = folder / requeue_name(restart_count)
    make_folder(target)
    for path in old:
        path.rename(target / path.name)
    return target


def _task_log(name: str) -> bool:
    """A task's log at the top of a run folder, or a part file of one (merged.log and
    tensorboard.log are the run's own)."""
    part = part_of(name)
    stem = part[0] if part is not None else name
    return stem.endswith(TASK_LOG_SUFFIX) and stem not in (MERGED, TENSORBOARD_LOG)


def prepare_folder(run_dir: str | None, log_dir: str | None, environ: Mapping[str, str], source: str,
                   group: str | None = None) -> RunFolder:
    """The run folder this execution of the job writes into (see the module docstring)."""
    job_id = environ.get("SLURM_JOB_ID", "")
    restarts = int(environ.get("SLURM_RESTART_COUNT") or 0)
    if run_dir:
        path = Path(run_dir)
        if not path.is_dir():
            raise ConfigError(source, "--run-dir", f"{run_dir!r} is not a directory; expected the run folder "
                              "'tflaunch submit' made")
        swappable = swappable_by_others(path)
        if swappable:
            raise ConfigError(source, "--run-dir", f"will not write into {run_dir!r}: {swappable}, so another user "
                              "could swap the run folder for one of theirs")
    else:
        base = Path(log_dir or DEFAULT_LOG_DIR)
        path = find_job_folder(base, job_id) if restarts else None
        if path is None:
            path = RunFolder.create(log_dir, source, group=group).path
    archive_previous_execution(path, restarts)
    record = read_slurm_record(path)
    record.update({"job_id": job_id, "restart_count": restarts, "nodelist": environ.get("SLURM_JOB_NODELIST"),
                   "batch_host": os.uname().nodename, "started_at": iso_time(time.time())})
    write_slurm_record(path, record)
    return RunFolder(path)


# -- what `tflaunch runs` shows of Slurm runs ---------------------------------------------------

_LIVE_STATES = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "RESIZING",
                "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT")


def job_status(folder: Path, recorded: str) -> str | None:
    """``pending (job 12)``, ``running (job 12)``: Slurm's view of a run that has not ended; else None."""
    slurm = read_slurm_record(folder)
    job_id = str(slurm.get("job_id") or "")
    if not job_id or recorded not in (RunStatus.RUNNING, RunStatus.LAUNCHER_LOST):
        return None
    state = job_states([job_id]).get(job_id)
    if state is None:
        return None
    return f"{state.lower()} (job {job_id})" if state in _LIVE_STATES else f"{recorded}, job {job_id} {state.lower()}"
