"""``tflaunch --slurm`` inside a job: the run, its run folder, and the warning signal that requeues it.

The run itself goes through the one entry point every run takes (:func:`launcher.run.launch.run`);
this module tells it how the run folder is found and which signal to watch, and requeues the job
afterwards.

**Run folder.** ``tflaunch submit`` makes the run folder first (the sbatch script and its
``slurm.json`` live there) and the job runs with ``--run-dir`` set to it, so whatever the backend
a run has one folder. A ``--slurm`` run started from a user's own script gets a new folder under
the log directory, tagged with the job id in ``slurm.json``.

**Requeued jobs** (``SLURM_RESTART_COUNT`` > 0) rerun the batch script with the same job id. Their
run takes the same folder again (found by ``--run-dir`` or by the job id), after moving the
previous execution's ``run.json`` and ``attempt-*`` folders into ``requeue-<k>/``. ``merged.log``
and ``metrics.jsonl`` carry on, and ``backup/`` stays where the tasks' ``TFLAUNCH_BACKUP_DIR``
points, so the requeued job resumes from the last backup.

**Warning signal.** With ``--requeue``, SIGUSR1 (sent by Slurm as ``--signal=B:USR1@SECS`` before the
time limit or at preemption) goes down tflaunch's one signal path: the supervisor wakes, stops
every task with the full ``--grace`` (SIGTERM first, so a task can save), the run record is made
final, and then tflaunch runs ``scontrol requeue <job>`` and exits 0 as far as it is concerned.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..records.folder import DEFAULT_LOG_DIR, RunFolder, iso_time, write_atomically
from ..records.states import RunStatus
from .commands import SlurmError, job_states, slurm_run

if TYPE_CHECKING:
    from ..records.record import RunRecord
    from ..run.console import Console
    from ..run.launch import LaunchRequest, RunResult
    from ..run.signals import Signals

SLURM_RECORD = "slurm.json"
WARNING_SIGNAL = signal.SIGUSR1


def read_slurm_record(folder: Path) -> dict:
    """slurm.json's object; empty when it is missing or holds anything else (a damaged file hides no run)."""
    try:
        record = json.loads((Path(folder) / SLURM_RECORD).read_text())
    except (OSError, ValueError, RecursionError):
        return {}
    return record if isinstance(record, dict) else {}


def write_slurm_record(folder: Path, record: Mapping) -> None:
    write_atomically(Path(folder) / SLURM_RECORD, json.dumps(record, indent=2) + "\n")


def find_job_folder(log_dir: Path, job_id: str) -> Path | None:
    """The run folder an earlier execution of this job used (requeued jobs come back to it)."""
    if not log_dir.is_dir():
        return None
    for path in sorted(log_dir.iterdir(), reverse=True):
        if path.is_dir() and str(read_slurm_record(path).get("job_id")) == job_id:
            return path
    return None


def archive_previous_execution(folder: Path, restart_count: int) -> Path | None:
    """Move the last execution's record and attempt folders aside so this one starts clean."""
    old = [p for p in folder.iterdir() if p.name == "run.json" or p.name.startswith("attempt-")]
    if not old:
        return None
    target = folder / f"requeue-{restart_count}"
    target.mkdir(exist_ok=True)
    for path in old:
        path.rename(target / path.name)
    for link in folder.glob("*.log"):
        if link.is_symlink():
            link.unlink()
    return target


def prepare_folder(run_dir: str | None, log_dir: str | None, environ: Mapping[str, str], source: str) -> RunFolder:
    """The run folder this execution of the job writes into (see the module docstring)."""
    job_id = environ.get("SLURM_JOB_ID", "")
    restarts = int(environ.get("SLURM_RESTART_COUNT") or 0)
    if run_dir:
        path = Path(run_dir)
        if not path.is_dir():
            raise ConfigError(source, "--run-dir", f"{run_dir!r} is not a directory; expected the run folder "
                              "'tflaunch submit' made")
    else:
        base = Path(log_dir or DEFAULT_LOG_DIR)
        path = find_job_folder(base, job_id) if restarts else None
        if path is None:
            path = RunFolder.create(log_dir, source).path
    archive_previous_execution(path, restarts)
    record = read_slurm_record(path)
    record.update({"job_id": job_id, "restart_count": restarts, "nodelist": environ.get("SLURM_JOB_NODELIST"),
                   "batch_host": os.uname().nodename, "started_at": iso_time(time.time())})
    write_slurm_record(path, record)
    return RunFolder(path)


def run_in_job(request: LaunchRequest, console: Console, *, run_dir: str | None = None, requeue: bool = False,
               environ: Mapping[str, str] | None = None, signals: Signals | None = None) -> RunResult:
    """Run the cluster in this allocation (the --slurm run): the one run entry point, then maybe a requeue."""
    from ..run.launch import run
    from ..run.signals import SIGNALS

    environ = dict(os.environ) if environ is None else environ
    signals = signals or SIGNALS
    # With --requeue the warning signal takes the same path as SIGTERM (a flag and a wakeup, never
    # a raise), and the requeued job must find the backup even when no in-job restarts are allowed.
    request = replace(request, keep_backup=request.keep_backup or requeue)
    result = run(request, console, signals, watch=(WARNING_SIGNAL,) if requeue else (),
                 folder_for=lambda spec: prepare_folder(run_dir, spec.log_dir, environ, spec.source))
    if requeue and signals.first == WARNING_SIGNAL:
        job_id = environ.get("SLURM_JOB_ID", "")
        console.message(f"Slurm's warning signal (SIGUSR1): tasks stopped; requeueing job {job_id}")
        record = read_slurm_record(result.run_dir)
        record.setdefault("requeues", []).append({"at": iso_time(time.time()), "restart_count":
                                                  int(environ.get("SLURM_RESTART_COUNT") or 0)})
        write_slurm_record(result.run_dir, record)
        try:
            slurm_run(["scontrol", "requeue", job_id], what=f"requeueing job {job_id}")
        except SlurmError as error:
            console.message(f"could not requeue: {error}")
            return result
        result.exit_code = 0  # the job goes on after the requeue; this execution ended as asked
    return result


# -- what `tflaunch runs` shows of Slurm runs ---------------------------------------------------

_LIVE_STATES = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "RESIZING",
                "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT")


def pending_record(folder: Path) -> RunRecord | None:
    """A stand-in record for a submitted job whose run has not written run.json yet."""
    from ..records.record import RunRecord

    slurm = read_slurm_record(folder)
    job_id, submitted = slurm.get("job_id"), slurm.get("submitted_at")
    if not isinstance(job_id, (str, int)) or isinstance(job_id, bool) or not str(job_id):
        return None
    return RunRecord(run_id=Path(folder).name, source=f"submit (job {job_id})", status=RunStatus.RUNNING,
                     started_at=submitted if isinstance(submitted, str) else None)


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
