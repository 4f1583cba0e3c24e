"""Runs already in a log directory: finding them and reading what they left behind.

A run is a folder with a ``run.json`` (a :class:`~launcher.records.record.RunRecord`; see
:mod:`launcher.records.folder` for the layout). Runs are named by their full id, a unique prefix
or suffix of it, ``latest``, or its folder's path (:data:`RUN_FORMS`). Everything here reads files (and, for a
live run on this machine, its processes); nothing changes a run.

A run whose record still says ``running`` while its launcher process is gone from this host
(SIGKILL, a crash, a reboot) has the status ``launcher-lost``. A run whose ``run.json`` is not a run
record (damaged, or a value of the wrong type) is listed with the status ``unreadable`` and what is
wrong with the file; naming it in ``status``, ``logs``, ``report`` or ``compare`` is a one-line error.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from ..errors import LaunchError, RunNotFoundError
from ..options import form, python_caller
from ..records.folder import RECORD, SLURM_RECORD, RunFolder
from ..records.metrics import read_metrics, speaker
from ..records.record import RunRecord, RunStatus, TaskRecord
from ..records.states import TaskState
from ..records.slurm import pending_record

LATEST = "latest"
RUN_FORMS = ("a run id, a unique prefix or suffix of one (20261125-1015, ab12), 'latest' (the default), "
             "or the path of a run folder")


class TaskNotFoundError(LaunchError):
    """A task name, or an attempt of a task, that a run does not have."""


class NoMetricsError(LaunchError):
    """A run whose tasks reported no metric records (yet)."""


@dataclass
class Run:
    """One run folder and its record, as read now.

    ``problem`` says why run.json could not be read (naming the file); ``record`` is then a stand-in
    with the status ``unreadable`` and nothing else."""

    path: Path
    record: RunRecord
    problem: str | None = None

    @property
    def run_id(self) -> str:
        return self.path.name

    @property
    def folder(self) -> RunFolder:
        return RunFolder(self.path)

    @property
    def started(self) -> float | None:
        return epoch_seconds(self.record.started_at)

    @property
    def status(self) -> RunStatus:
        """The recorded status, or ``LAUNCHER_LOST`` for a running record whose launcher is gone."""
        status = self.record.status
        if status is RunStatus.RUNNING and self.launcher_alive() is False:
            return RunStatus.LAUNCHER_LOST
        return status

    @property
    def live(self) -> bool:
        return self.status is RunStatus.RUNNING

    @property
    def on_this_host(self) -> bool:
        return self.record.launcher.host == os.uname().nodename

    @property
    def attempt(self) -> int:
        """The latest attempt: recorded ones, or the one the tasks were started for."""
        return self.record.attempt

    @property
    def tasks(self) -> list[TaskRecord]:
        """The tasks of the latest attempt (those it ran without are :attr:`left_out`)."""
        return [t for t in self.record.tasks if t.state is not TaskState.LEFT_OUT]

    @property
    def left_out(self) -> list[TaskRecord]:
        """The tasks of the cluster the latest attempt ran without (it shrank to ``min_workers``)."""
        return [t for t in self.record.tasks if t.state is TaskState.LEFT_OUT]

    def task_names(self) -> list[str]:
        """Every task the record names: the latest attempt's, then those it ran without (their logs stay)."""
        return list(dict.fromkeys(t.name for t in self.record.tasks))

    def require_task(self, name: str) -> None:
        if name not in self.task_names():
            raise TaskNotFoundError(f"run {self.run_id} has no task '{name}'; its tasks are: "
                                    f"{', '.join(self.task_names())}")

    def launcher_alive(self) -> bool | None:
        """Whether the launcher still runs; None when it ran on another host (cannot tell)."""
        pid = self.record.launcher.pid
        if not self.on_this_host or not pid:
            return None
        return pid_alive(int(pid), not_after=self.started)

    def reload(self) -> "Run":
        return load_run(self.path)

    def metrics(self) -> list[dict[str, Any]]:
        """The metric records in the order they arrived; a half-written last line is left out."""
        return read_metrics(self.folder.metrics_path)

    def resources(self) -> dict[str, Any]:
        """Per-task CPU and memory figures from ``resources.json``; empty when it was not sampled."""
        return self.folder.read_resources()

    def chief(self, metrics: list[dict[str, Any]] | None = None) -> str | None:
        """The task whose figures stand for the run (:func:`launcher.records.metrics.speaker`)."""
        names = self.task_names()
        reported = [m.get("task") for m in (metrics if metrics is not None else self.metrics())]
        return speaker(names, [n for n in reported if n]) or (names[0] if names else None)


def pid_alive(pid: int, not_after: float | None = None) -> bool:
    """Whether process ``pid`` exists (and, given ``not_after``, was not started after that time)."""
    import psutil  # imported here: "tflaunch --help" loads nothing it does not need

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        # A pid reused by a newer process is not the launcher we are looking for.
        return not_after is None or proc.create_time() <= not_after + 1.0
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True


def load_run(path: Path) -> Run:
    """The run in ``path``; RunNotFoundError (one line naming the file) when its record cannot be read."""
    run = read_run(path)
    if run.problem:
        raise RunNotFoundError(run.problem)
    return run


def read_run(path: Path) -> Run:
    """The run in ``path``, or a stand-in whose ``problem`` names the file and what is wrong with it."""
    folder = RunFolder(path)
    try:
        return Run(path, folder.read_record())
    except FileNotFoundError:
        problem = f"{path}: no {RECORD}; not a tflaunch run folder"
    except UnicodeDecodeError:
        problem = f"{folder.record_path}: not a run record (not UTF-8 text)"
    except ValueError as exc:
        problem = f"{folder.record_path}: not a run record ({exc})"
    except RecursionError:  # json.loads of a deeply nested file
        problem = f"{folder.record_path}: not a run record (nested too deeply)"
    except OSError as exc:
        problem = f"{folder.record_path}: cannot read it ({exc.strerror or exc})"
    return Run(path, RunRecord(run_id=Path(path).name, source="?", status=RunStatus.UNREADABLE), problem)


def find_runs(log_dir: Path | str) -> list[Run]:
    """Every run in ``log_dir``, newest first, unreadable ones among them (a damaged run.json is no
    reason to hide the others). A missing directory is an error; an empty one is not."""
    log_dir = Path(log_dir)
    if not log_dir.is_dir():
        raise RunNotFoundError(f"log directory {_shown(log_dir)} does not exist (choose another with "
                               f"{form('log_dir', 'DIR')})")
    try:
        entries = list(log_dir.iterdir())
    except PermissionError:
        raise RunNotFoundError(f"log directory {_shown(log_dir)} cannot be read by you: a run folder is "
                               f"its owner's alone (docs/security.md)") from None
    runs = []
    for path in entries:
        try:
            recorded = path.is_dir() and RunFolder(path).record_path.is_file()
            pending = not recorded and path.is_dir() and (path / SLURM_RECORD).is_file() and pending_record(path)
        except PermissionError:  # another user's run folder: listed as one that cannot be read
            recorded, pending = True, None
        if recorded:
            runs.append(read_run(path))
        elif pending:
            runs.append(Run(path, pending))  # submitted to Slurm; its run has not started yet
    return sorted(runs, key=lambda r: (r.started or _id_time(r.run_id), r.run_id), reverse=True)


def _id_time(run_id: str) -> float:
    """When a run started, as its id says (ids begin with the local time), for runs that cannot say."""
    try:
        return time.mktime(time.strptime(run_id[:15], "%Y%m%d-%H%M%S"))
    except ValueError:
        return 0.0


def resolve_run(log_dir: Path | str, ref: str | None = None) -> Run:
    """The run ``ref`` names (any of :data:`RUN_FORMS`); a path is read where it points, whatever
    ``log_dir`` is. RunNotFoundError (one line) when there is no such run or its record cannot be read."""
    run = _at_path(ref) if ref is not None and _is_path(ref) else _resolve(log_dir, ref)
    if run.problem:
        raise RunNotFoundError(run.problem)
    return run


def _is_path(ref: str) -> bool:
    """Whether RUN is a path (``logs/20261125-101500-ab12/``, ``.``) rather than an id, which has no ``/``."""
    return os.sep in ref or bool(os.altsep and os.altsep in ref) or ref in (".", "..") or ref.startswith("~")


def _at_path(ref: str) -> Run:
    """The run folder at ``ref``; for a path that does not exist, its last part names a run (a prefix,
    ``latest``) of the folder before it, so ``logs/20261125`` works as ``20261125`` does."""
    path = Path(ref).expanduser()
    if path.name in ("", ".."):  # "." or "x/..": the folder's own name is the run id
        path = path.resolve()
    if path.is_dir():  # a job submitted to Slurm whose run has not started has no run.json yet
        pending = not RunFolder(path).record_path.is_file() and (path / SLURM_RECORD).is_file() and pending_record(path)
        return Run(path, pending) if pending else read_run(path)
    if path.parent.is_dir():
        return _resolve(path.parent, path.name)
    raise RunNotFoundError(f"no run folder {ref!r}: {path.parent} does not exist")


def _resolve(log_dir: Path | str, ref: str | None) -> Run:
    runs = find_runs(log_dir)
    if not runs:
        start = "launch(local=2)" if python_caller() else "'tflaunch --local 2'"
        raise RunNotFoundError(f"no runs in {_shown(log_dir)} yet (start one with {start})")
    if ref is None or ref == LATEST:
        return runs[0]
    exact = [r for r in runs if r.run_id == ref]
    if exact:
        return exact[0]
    # The start of an id (its time) or its end (the random part that tells apart runs started together).
    matches = [r for r in runs if r.run_id.startswith(ref) or r.run_id.endswith(ref)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        more = f" and {len(matches) - 5} more" if len(matches) > 5 else ""
        raise RunNotFoundError(f"run id '{ref}' is ambiguous in {_shown(log_dir)}: it matches "
                               f"{', '.join(r.run_id for r in matches[:5])}{more}; give more of it")
    latest = ", ".join(r.run_id for r in runs[:3])
    raise RunNotFoundError(f"no run '{ref}' in {_shown(log_dir)}; the latest runs are: {latest}")


def resolve_runs(log_dir: Path | str, refs: list[str]) -> list[Run]:
    return [resolve_run(log_dir, ref) for ref in refs]


# -- summaries --------------------------------------------------------------------------------


@dataclass
class RunSummary:
    """One line of ``tflaunch runs``."""

    run_id: str
    started_at: str | None
    source: str
    tasks: int
    attempts: int
    status: str
    exit_code: int | None
    duration_seconds: float | None
    test_accuracy: float | None
    problem: str | None = None  # why run.json cannot be read (the status is then "unreadable")


# What a scheduler says of a run that has not ended (``pending (job 12)``), from its folder and
# recorded status; None when it has nothing to add. The command line passes Slurm's
# (:func:`launcher.slurm.job.job_status`): the read side itself asks no scheduler.
JobState = Callable[[Path, str], str | None]


def summarize(run: Run, now: float | None = None, job_state: JobState | None = None) -> RunSummary:
    if run.problem:
        return RunSummary(run.run_id, None, "?", 0, 0, run.status.value, None, None, None, run.problem)
    status = run.status
    duration = run.record.seconds((now or time.time()) if status is RunStatus.RUNNING else None)
    shown = job_state(run.path, status.value) if job_state and (run.path / SLURM_RECORD).is_file() else None
    return RunSummary(run.run_id, run.record.started_at, run.record.source, len(run.tasks), run.attempt,
                      shown or status.value, run.record.exit_code, duration, final_record(run).get("test_accuracy"))


def final_record(run: Run, metrics: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The chief's last ``final`` record, else any task's; empty when none was reported."""
    metrics = run.metrics() if metrics is None else metrics
    finals = [m for m in metrics if m.get("kind") == "final"]
    chief = run.chief(metrics)
    mine = [m for m in finals if m.get("task") == chief]
    return (mine or finals or [{}])[-1]


def epoch_records(metrics: list[dict[str, Any]], task: str) -> list[dict[str, Any]]:
    """A task's epoch records by epoch; an epoch repeated by a later attempt keeps the later one."""
    by_epoch: dict[int, dict[str, Any]] = {}
    for record in metrics:
        if record.get("kind") == "epoch" and record.get("task") == task and isinstance(record.get("epoch"), int):
            by_epoch[record["epoch"]] = record
    return [by_epoch[e] for e in sorted(by_epoch)]


def epoch_seconds(iso: str | None) -> float | None:
    """An ISO time as seconds since the epoch (None when absent or not a time)."""
    if not iso:
        return None
    try:
        return datetime.fromisoformat(iso).timestamp()
    except ValueError:
        return None


def _shown(log_dir: Path | str) -> str:
    return str(log_dir).rstrip("/") + "/"
