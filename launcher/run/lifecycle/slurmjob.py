"""``tflaunch --slurm`` inside a job: the run, in the job's run folder, and the warning signal that requeues it.

The run itself goes through the one entry point every run takes (:func:`launcher.run.lifecycle.launch.run`);
this module tells it how the run folder is found (:func:`launcher.slurm.job.prepare_folder`: the
folder ``tflaunch submit`` made, or the one an earlier execution of a requeued job used) and which
signal to watch, and requeues the job afterwards.

**Warning signal.** With ``--requeue``, SIGUSR1 (sent by Slurm as ``--signal=B:USR1@SECS`` before the
time limit or at preemption) goes down tflaunch's one signal path: the supervisor wakes, stops
every task with the full ``--grace`` (SIGTERM first, so a task can save), the run record is made
final, and then tflaunch runs ``scontrol requeue <job>`` and exits 0 as far as it is concerned.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from dataclasses import replace

from ...records.folder import iso_time
from ...records.slurm import read_slurm_record, write_slurm_record
from ...slurm.commands import SlurmError, slurm_run
from ...slurm.job import prepare_folder
from ..console.writer import Console
from .launch import LaunchRequest, run
from .session import RunResult
from .signals import SIGNALS, Signals

WARNING_SIGNAL = signal.SIGUSR1


def run_in_job(request: LaunchRequest, console: Console, *, run_dir: str | None = None, requeue: bool = False,
               environ: Mapping[str, str] | None = None, signals: Signals | None = None) -> RunResult:
    """Run the cluster in this allocation (the --slurm run): the one run entry point, then maybe a requeue."""
    environ = dict(os.environ) if environ is None else environ
    signals = signals or SIGNALS
    # With --requeue the warning signal takes the same path as SIGTERM (a flag and a wakeup, never
    # a raise), and the requeued job must find the backup even when no in-job restarts are allowed.
    # The nodes are Slurm's, given to this job: no host checks before the tasks start.
    request = replace(request, keep_backup=request.keep_backup or requeue,
                      options=replace(request.options, no_check=True))
    result = run(request, console, signals, watch=(WARNING_SIGNAL,) if requeue else (),
                 folder_for=lambda spec: prepare_folder(run_dir, spec.log_dir, environ, spec.source,
                                                           spec.log_group))
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
