"""Run folders: where they go (``logs/`` unless told otherwise), how one is made, and their layout.

Every name in a run folder is defined here, once, and imported by whoever writes or reads it.
Layout of one run::

    logs/20261122-140501-a3f9/
        run.json            the run record (records/record.py): cluster, tasks, commands, env, attempts, exit codes
        merged.log          every line of every task: "<date> <time> [<attempt>] <task> | <text>"
        metrics.jsonl       the metric records tasks printed (their format and its limit: records/metrics.py)
        resources.json      each task's CPU and memory figures, when they were sampled
        worker-0.log        each task's own stdout and stderr of its latest attempt, byte for byte
        attempt-1/worker-0.log   an earlier attempt's, moved there when the next attempt started
        attempt-1/stacks/   each task's stacks (<task>.txt) and verdict.json, when a hang watchdog sampled them
        backup/             the trainer's backup, when the run may restart
        checkpoints/        the chief's per-epoch checkpoints, when there is an evaluator
        tensorboard/        the TensorBoard scalars tasks write
        tensorboard.log     the output of a TensorBoard started beside the run
        learning_curves.png drawn by 'tflaunch report --plot'
        control.sock        while the run lasts: where 'tflaunch stacks' asks (records/control.py)
        debug.log           tflaunch's own trace, with --debug or TFLAUNCH_DEBUG=1 (records/trace.py)

A Slurm run's folder also holds ``job.sbatch``, ``slurm.json`` (:mod:`launcher.records.slurm`), the
job's own output ``slurm-<job id>.out`` and, after requeues, ``requeue-<k>/`` with the run.json,
task logs and attempt folders of earlier executions.

A run folder and everything tflaunch writes in it are its owner's alone (folders 0700, files 0600),
or also its group's to read (2750, 0640) when the run is given a group (``--log-group``, a
cluster file's ``log_group``) or the log directory is shared with its group (set-group-ID,
:func:`launcher.records.files.shared_with_group`); it is made only in a log directory
no other user can rename it out of (:func:`launcher.records.files.swappable_by_others`), and
tflaunch never follows a link in it: every temporary or part file is created
exclusively (``O_EXCL | O_NOFOLLOW``), temporary ones under unpredictable names, and a log is
appended to only when it is a regular file of this user's with no other name
(:func:`launcher.records.files.open_own`), so that a folder others can write (a shared log
directory with a default ACL, a folder opened up by hand) cannot make tflaunch write through a
planted link into a file of its user's.

A task's log is one file, at the top of the folder, for as long as the task runs in one attempt:
a run that never restarts has no attempt folder (a run of 8,192 tasks makes 8,192 files, not also
a link to each: on a shared or network filesystem each one is a metadata operation of its own).
"""

from __future__ import annotations

import errno
import functools
import json
import os
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..options import DEFAULT_LOG_DIR, name
from ..units import group_id
from .files import (FOLDER_MODE, SHARED_FOLDER_MODE, file_mode, make_folder, open_own, shared_with_group, swappable_by_others,
                    write_atomically)
from .livejson import CompactRecord
from .record import RunRecord

# The layout (see the module docstring).
RECORD = "run.json"
MERGED = "merged.log"
METRICS = "metrics.jsonl"
RESOURCES = "resources.json"
ATTEMPT_PREFIX = "attempt-"  # attempt-<k>/
TASK_LOG_SUFFIX = ".log"  # <task>.log
PART_INFIX = ".part-"  # <log>.part-<offset>: a log's latest output past its size limit (records/boundedlog.py)
STACKS = "stacks"  # attempt-<k>/stacks/
STACKS_SUFFIX = ".txt"  # attempt-<k>/stacks/<task>.txt
VERDICT = "verdict.json"  # attempt-<k>/stacks/verdict.json
BACKUP = "backup"
CHECKPOINTS = "checkpoints"
TENSORBOARD = "tensorboard"
TENSORBOARD_LOG = "tensorboard.log"
LEARNING_CURVES = "learning_curves.png"
CONTROL_SOCKET = "control.sock"
DEBUG_LOG = "debug.log"  # tflaunch's own trace, when the run asked for it (records/trace.py)
SLURM_RECORD = "slurm.json"
SBATCH_SCRIPT = "job.sbatch"
SLURM_OUTPUT = "slurm-%j.out"  # sbatch's --output pattern: %j is the job id
REQUEUE_PREFIX = "requeue-"  # requeue-<k>/
RUN_ID_PLACEHOLDER = "<run-id>"  # the folder's name where a dry run shows paths in it
RUN_ID_DRAWS = 1000  # new ids a run draws when the one it drew is taken (a second holds 65,536)
READABLE_TASKS = 64  # a final run.json of up to this many tasks is indented throughout


def iso_time(when: float) -> str:
    """A local timestamp with its UTC offset, to the millisecond, as run files record times."""
    return datetime.fromtimestamp(when).astimezone().isoformat(timespec="milliseconds")


def readable_json(data: dict[str, Any], tasks: int) -> str:
    """A final run.json for people: indented throughout while the run is small; past READABLE_TASKS
    tasks one line per task (json's C encoder writes each; indenting takes its slower Python
    encoder: measured for 2,048 tasks, 49 ms indented, 22 ms this way, 14 ms compact)."""
    if tasks <= READABLE_TASKS:
        return json.dumps(data, indent=2)
    lines = []
    for key, value in data.items():
        if isinstance(value, list) and value:
            items = ",\n".join(f"    {json.dumps(item, separators=(', ', ': '))}" for item in value)
            lines.append(f"  {json.dumps(key)}: [\n{items}\n  ]")
        else:
            lines.append(f"  {json.dumps(key)}: {json.dumps(value, separators=(', ', ': '))}")
    return "{\n" + ",\n".join(lines) + "\n}"


def part_of(name: str) -> tuple[str, int] | None:
    """(the log a part file belongs to, its offset) for a name ``<log>.part-<offset>``; None for
    any other name, also one that holds the infix without a number after it."""
    log, infix, offset = name.rpartition(PART_INFIX)
    if not infix or not (offset.isascii() and offset.isdigit()):
        return None
    return log, int(offset)


def attempt_name(attempt: int) -> str:
    return f"{ATTEMPT_PREFIX}{attempt}"


def task_log_name(task: str) -> str:
    return f"{task}{TASK_LOG_SUFFIX}"


def requeue_name(restart_count: int) -> str:
    return f"{REQUEUE_PREFIX}{restart_count}"


def new_run_id(now: float | None = None) -> str:
    """A run id that sorts by start time and stays unique between runs started together."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return f"{stamp}-{os.urandom(2).hex()}"


class RunFolder:
    """The files of one run."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._milestone: tuple | None = None  # what run.json said when its folder was last synced
        self._attempt_dirs: dict[int, str] = {}  # attempt folders known to exist, by number
        self._log_attempts: dict[str, int] = {}  # task -> the attempt its log at the top belongs to
        self._parts_left: dict[str, list[str]] = {}  # log -> its part files at the top, when an attempt ended
        self._compact = CompactRecord()  # the live rewrites' text

    @classmethod
    def create(cls, log_dir: str | Path | None, source: str, option: str | None = None,
               group: str | None = None) -> "RunFolder":
        """A new run folder in ``log_dir`` (None: :data:`DEFAULT_LOG_DIR`), shared with ``group`` when
        given (a group of the user's: :func:`launcher.options.group_id`), else with the log
        directory's group when that is shared (:func:`launcher.records.files.shared_with_group`).

        ConfigError names ``source``, the directory, where it came from (``option`` when given,
        else the default) and the system's reason, when the folder cannot be made.
        """
        base = Path(log_dir or DEFAULT_LOG_DIR)
        where = (option or name("log_dir")) if log_dir else "the default log directory"
        try:
            gid = None if group is None else group_id(group)
        except ValueError as exc:
            raise ConfigError(source, "log_group", str(exc)) from None
        try:
            swappable = swappable_by_others(base)
        except OSError:
            swappable = None  # the mkdir below names what is wrong with the folder
        if swappable:
            raise ConfigError(source, "log_dir", f"will not make a run folder in {str(base)!r} ({where}): {swappable}, "
                                                 f"so another user could swap the run folder for one of theirs; use a "
                                                 f"folder of your own, or make that one sticky (chmod +t)")
        # The folder is made with an exclusive mkdir: a run started in the same second that drew
        # the same id got there first, and this one draws another (16 bits each: rare, not never).
        for _ in range(RUN_ID_DRAWS):
            path = base / new_run_id()
            try:
                make_folder(base)
                mode = SHARED_FOLDER_MODE if gid is not None or shared_with_group(base) else FOLDER_MODE
                path.mkdir(FOLDER_MODE)  # the owner's alone until it has the group it is shared with
                if gid is not None:
                    try:
                        os.chown(path, -1, gid, follow_symlinks=False)
                    except OSError:
                        path.rmdir()  # refused with nothing made, as for a group found wanting before
                        raise
                os.chmod(path, mode)  # the umask took nothing it should not, and S_ISGID is kept
                return cls(path)
            except OSError as exc:
                if isinstance(exc, FileExistsError) and os.path.lexists(path):
                    continue
                raise ConfigError(source, "log_dir", f"cannot create a run folder in {str(base)!r} ({where}): "
                                                     f"{exc.strerror or exc}") from None
        raise ConfigError(source, "log_dir", f"cannot create a run folder in {str(base)!r}: {RUN_ID_DRAWS} run ids "
                                             f"drawn in a row were taken")

    def discard_if_empty(self) -> None:
        """Remove the folder when nothing was written into it (a run refused before it started)."""
        try:
            self.path.rmdir()
        except OSError:
            pass

    @property
    def run_id(self) -> str:
        return self.path.name

    @property
    def record_path(self) -> Path:
        return self.path / RECORD

    @property
    def merged_path(self) -> Path:
        return self.path / MERGED

    @property
    def metrics_path(self) -> Path:
        return self.path / METRICS

    @property
    def debug_log_path(self) -> Path:
        return self.path / DEBUG_LOG

    @property
    def backup_dir(self) -> Path:
        return self.path / BACKUP

    def attempt_dir(self, attempt: int) -> Path:
        return self.path / attempt_name(attempt)

    def task_log(self, name: str, attempt: int) -> Path:
        """The task's log of one attempt: in the attempt's folder once a later attempt has started
        (or in a folder written before logs lived at the top), else at the top of the run folder."""
        earlier = self.attempt_dir(attempt) / task_log_name(name)
        return earlier if os.path.lexists(earlier) else self.latest_task_log(name)

    def latest_task_log(self, name: str) -> Path:
        """The task's log of the latest attempt it ran in."""
        return self.path / task_log_name(name)

    def stacks_dir(self, attempt: int) -> Path:
        return self.attempt_dir(attempt) / STACKS

    def stack_dirs(self) -> list[Path]:
        """The stacks folders of every attempt, oldest first."""
        found = [p for p in self.path.glob(f"{ATTEMPT_PREFIX}*/{STACKS}") if p.is_dir()]
        return sorted(found, key=lambda p: (len(p.parent.name), p.parent.name))  # attempt-9 before attempt-10

    @functools.cached_property
    def _real_path(self) -> str:
        """Its path resolved, once: the task logs' paths are joined to it."""
        return os.path.realpath(self.path)

    @functools.cached_property
    def log_mode(self) -> int:
        """The mode of its task logs, the folder's file mode: looked up once, not once per task."""
        return file_mode(self._real_path)

    def create_task_log(self, name: str, attempt: int) -> str:
        """Create the log of a task's stdout and stderr at the top of the run folder (kept when it is
        there: a task restarted in place appends), after moving its log of an earlier attempt into
        that attempt's folder; returns its path, resolved once. Paths are joined as text: this runs
        once per task at a run's start."""
        log_name = task_log_name(name)
        path = os.path.join(self._real_path, log_name)
        earlier = self._log_attempts.get(name)
        if earlier is not None and earlier != attempt:
            self._move_aside(log_name, earlier)
        self._log_attempts[name] = attempt
        os.close(open_own(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, self.log_mode))
        return path

    def _move_aside(self, log_name: str, attempt: int) -> None:
        """Move a task's log of an ended attempt, with any part files a full disk kept from being
        stitched into it, into that attempt's folder: renames, which keep every byte."""
        folder = self._attempt_dirs.get(attempt)
        if folder is None:  # once per attempt, not once per task
            made = self.attempt_dir(attempt)
            make_folder(made)
            folder = self._attempt_dirs[attempt] = os.path.realpath(made)
            # Every log of the attempt was closed before the next one started: its part files are
            # all there now, found in one listing rather than one per task (8,192 of them, each a
            # listing of the 8,192 logs, at a restart of 1,024 hosts x 8 tasks).
            self._parts_left = {}
            for entry in os.listdir(self._real_path):
                part = part_of(entry)
                if part is not None:
                    self._parts_left.setdefault(part[0], []).append(entry)
        for moved in [log_name, *self._parts_left.pop(log_name, ())]:
            try:
                os.rename(os.path.join(self._real_path, moved), os.path.join(folder, moved))
            except FileNotFoundError:
                pass  # removed by hand while the run went on: nothing to keep

    def read_resources(self) -> dict[str, dict[str, Any]]:
        """Per-task CPU and memory figures from ``resources.json``; empty when it was not sampled."""
        try:
            tasks = json.loads((self.path / RESOURCES).read_text()).get("tasks")
        except (OSError, ValueError, AttributeError, RecursionError):
            return {}
        if not isinstance(tasks, dict):
            return {}
        return {name: figures for name, figures in tasks.items() if isinstance(figures, dict)}

    def write_record(self, record: RunRecord, final: bool = False) -> None:
        """Replace run.json with the run's typed record (see :mod:`launcher.records.record`), atomically.

        Live rewrites are compact (:class:`CompactRecord`: each task's text kept while it stays the
        same); the final one is for people (:func:`readable_json`). When a
        full disk leaves no room for the new copy beside the old, the final record replaces the old
        one in place, compact: the space the old one held is enough for it more often than not.
        """
        # Every copy is fsynced before its rename (see write_atomically). The folder, which makes
        # the rename durable, is synced at the milestones only: the first record, a task ending,
        # failing in place or starting a new attempt, and the final record. Between them a crash
        # may bring back the previous copy, which lacks only states that the tasks' ends will write.
        # Measured on ext4 (2 cores, virtual disk): a 2 KB rewrite 0.2 ms, +0.2 ms with the file's
        # fsync, +0.1 ms with the folder's; live rewrites come at most 4 times a second.
        milestone = (record.attempt, tuple((t.state.ended, t.restarts) for t in record.tasks))
        sync = final or milestone != self._milestone
        if not final:
            write_atomically(self.record_path, self._compact.text(record) + "\n", sync_folder=sync)
        else:
            data = record.to_json()
            try:
                write_atomically(self.record_path, readable_json(data, len(record.tasks)) + "\n", sync_folder=True)
            except OSError as exc:
                if exc.errno != errno.ENOSPC or not self.record_path.exists():
                    raise
                self._record_in_place(data)
        if sync:
            self._milestone = milestone

    def _record_in_place(self, data: dict) -> None:
        """The final record over the old copy, on a disk with no room for a new one: compact, and
        when even that outgrows the old copy's space, without what only details the run (each
        task's argv and env, each attempt's hosts), so that run.json stays one whole record."""
        slim = {**data, "tasks": [{k: v for k, v in task.items() if k not in ("argv", "env")}
                                  for task in data.get("tasks", [])],
                "attempts": [{k: v for k, v in attempt.items() if k != "hosts"} for attempt in data.get("attempts", [])]}
        fd = open_own(self.record_path, os.O_WRONLY)
        try:
            for copy in (data, slim):
                os.ftruncate(fd, 0)
                view = memoryview(json.dumps(copy, separators=(",", ":")).encode() + b"\n")
                try:
                    offset = 0
                    while offset < len(view):
                        offset += os.pwrite(fd, view[offset:], offset)
                    os.fsync(fd)
                    return
                except OSError as exc:
                    if exc.errno != errno.ENOSPC or copy is slim:
                        raise
        finally:
            os.close(fd)

    def read_record(self) -> RunRecord:
        """The run's record; ValueError when run.json is not a run record, OSError when unreadable."""
        return RunRecord.from_json(json.loads(self.record_path.read_text()), RECORD)
