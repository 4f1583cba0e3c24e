"""The run record and the console's status line while a run goes on, kept up with its tasks at a
pace set by the run's size.

Each rewrite of ``run.json`` and each state update of the console is a pass over every task, so
both come at most every ``LIVE_WRITE_INTERVAL`` for up to ``LIVE_WRITE_TASKS`` tasks and
proportionally less often for more (at most ``LIVE_WRITE_AT_MOST`` apart): a change that comes
sooner waits for :meth:`LiveRecord.due`, which the supervisor's loop calls, so the record trails
the tasks by at most that long, and the attempt's end (every task ended) is shown at once. A
task's env is made for the record once per launch, and in a cluster of more than
``FULL_TF_CONFIG_TASKS`` tasks its TF_CONFIG names its task part only: the record's ``cluster``
has the rest, and n copies of it would make run.json grow with the square of n.

The record's tasks are always the current attempt's, where each runs in it (a task moved to a
spare names the spare), followed by the tasks of the whole cluster the attempt runs without
(:meth:`LiveRecord.leave_out`), each marked ``left-out``.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Callable

from ...cluster.plan import Plan, TaskLaunch
from ...masking import masked_command
from ...records.folder import RunFolder, iso_time
from ...records.record import RootCause, RunRecord, TaskRecord
from ...records.states import AllFinal, RunStatus, TaskState

if TYPE_CHECKING:
    from ..console.writer import Console
    from .task import Task

LIVE_WRITE_INTERVAL, LIVE_WRITE_TASKS, LIVE_WRITE_AT_MOST = 0.25, 16, 10.0
FULL_TF_CONFIG_TASKS = 64


class LiveRecord:
    """``record`` kept in ``folder``'s run.json, and the tasks' states on ``console``, as they change."""

    def __init__(self, record: RunRecord, folder: RunFolder, console: Console, tasks: int):
        self.record = record
        # Called with the tasks that just ended, before the console hears of it: their output is read
        # first, so nothing the console holds for a task's word is let go while that word is on its way.
        self.read_out: Callable[[list[str], int], None] | None = None
        self._ended: set[str] = set()  # the tasks ended when the console last heard
        self.folder = folder
        self.console = console
        self.pace = min(LIVE_WRITE_AT_MOST, LIVE_WRITE_INTERVAL * max(1.0, tasks / LIVE_WRITE_TASKS))
        self.lock = threading.Lock()  # the record is written from the supervisor and the pump's failure path
        self.failure: str | None = None  # why a live rewrite of run.json failed, the first time
        self.attempt = 1  # the attempt whose tasks the console shows
        self._pending_write: tuple[Plan, list[Task]] | None = None  # states not yet in run.json
        self._next_write = 0.0  # monotonic time before which a live rewrite waits
        self._pending_states: list[Task] | None = None  # states not yet shown on the console
        self._all_ended = AllFinal([], lambda task: task.state.ended)  # of the attempt's task list
        self._next_states = 0.0
        self._shown_env: dict[int, tuple[TaskLaunch, dict[str, str]]] = {}  # id -> (launch, its env in run.json)
        self.left_out: list[TaskRecord] = []  # tasks of the whole cluster the current attempt runs without

    def leave_out(self, launches: list[TaskLaunch], attempt: int) -> None:
        """Attempt ``attempt`` runs without these tasks of the whole cluster (each as it was first planned)."""
        self.left_out = [left_out_record(launch, attempt) for launch in launches]

    def changed(self, plan: Plan, tasks: list[Task]) -> None:
        """The tasks' states changed: rewrite run.json and redraw the status line, now or when due."""
        self.write(plan, tasks)
        self._pending_states = tasks
        if self._all_ended.items is not tasks:  # a new attempt's list
            self._all_ended = AllFinal(tasks, self._all_ended.test)
        if time.monotonic() >= self._next_states or self._all_ended():
            self._states_if_due(force=True)

    def wrote(self) -> None:
        """The record was just written (the run's first copy): the next live rewrite waits its turn,
        so the tasks' start and the pids their agents report go into one rewrite."""
        self._next_write = time.monotonic() + self.pace

    def due_in(self, longest: float) -> float:
        """Seconds until a change waiting for its turn (in run.json or on the console) is due; at most
        ``longest`` when none waits."""
        now, wait = time.monotonic(), longest
        if self._pending_write is not None:
            wait = min(wait, self._next_write - now)
        if self._pending_states is not None:
            wait = min(wait, self._next_states - now)
        return max(0.0, wait)

    def due(self) -> None:
        """Whatever change waited for its turn goes out if the turn came."""
        self._write_if_due()
        self._states_if_due()

    def write(self, plan: Plan, tasks: list[Task], now: bool = False) -> None:
        """Rewrite run.json with the tasks' current states (now, or when the pace allows).

        A rewrite that fails is remembered in :attr:`failure`: the session stops the attempt on it."""
        self._pending_write = (plan, tasks)
        if now or time.monotonic() >= self._next_write:
            self._write_if_due(force=True)

    def tasks(self, plan: Plan, tasks: list[Task]) -> list[TaskRecord]:
        """Every launch of ``plan`` as run.json keeps it, with its task of ``tasks`` if it started, then
        the tasks the attempt runs without."""
        by_name = {t.name: t for t in tasks}
        return [task_record(launch, by_name.get(launch.name), self._env(launch, plan))
                for launch in plan.launches] + self.left_out

    def finish(self, plan: Plan, tasks: list[Task], status: RunStatus, exit_code: int, error: str | None,
               root_cause: RootCause | None, started: float) -> None:
        """Write the final record: the last attempt's tasks, how the run ended, and when."""
        ended = time.time()
        with self.lock:
            record = self.record
            record.tasks = self.tasks(plan, tasks)
            record.status, record.exit_code, record.error = status, exit_code, error
            record.ended_at, record.duration_seconds = iso_time(ended), round(ended - started, 3)
            record.root_cause = root_cause or record.root_cause  # a hang's culprit, when no task failed first
            try:
                self.folder.write_record(record, final=True)
            except OSError as exc:
                if error is None:  # the disk filled at the last moment; say so rather than claim a record
                    record.error = f"{self.folder.record_path}: {exc.strerror or exc}"
                self.console.message(f"could not write {self.folder.record_path}: {exc.strerror or exc}")

    def _write_if_due(self, force: bool = False) -> None:
        pending = self._pending_write
        if pending is None or (not force and time.monotonic() < self._next_write):
            return
        self._pending_write = None
        self._next_write = time.monotonic() + self.pace
        with self.lock:
            self.record.tasks = self.tasks(*pending)
            try:
                self.folder.write_record(self.record)
            except OSError as exc:
                if self.failure is None:
                    self.failure = f"{self.folder.record_path}: {exc.strerror or exc}"

    def _states_if_due(self, force: bool = False) -> None:
        tasks = self._pending_states
        if tasks is None or (not force and time.monotonic() < self._next_states):
            return
        self._pending_states, self._next_states = None, time.monotonic() + self.pace
        ended = {t.name for t in tasks if t.state.ended}
        if self.read_out is not None and ended - self._ended:
            self.read_out(sorted(ended - self._ended), self.attempt)
        self._ended = ended
        self.console.task_states({t.name: t.state for t in tasks}, self.attempt)

    def _env(self, launch: TaskLaunch, plan: Plan) -> dict[str, str]:
        shown = self._shown_env.get(id(launch))
        if shown is None or shown[0] is not launch:
            env = launch.shown_env(tf_cluster=len(plan.launches) <= FULL_TF_CONFIG_TASKS)
            shown = self._shown_env[id(launch)] = (launch, env)
        return shown[1]


def task_record(launch: TaskLaunch, task: Task | None, env: dict[str, str] | None = None) -> TaskRecord:
    """``launch`` (and ``task``, once it started) as run.json keeps it, with ``env`` as its shown env."""
    env = launch.shown_env() if env is None else env
    record = TaskRecord(name=launch.name, role=launch.role, index=launch.index, host=launch.host,
                        address=launch.address, local=launch.local, argv=list(masked_command(tuple(launch.argv))), workdir=launch.workdir,
                        gpus=None if launch.gpus is None else list(launch.gpus), env=env,
                        attempt=launch.attempt)
    if task is not None:
        record.state = task.state
        record.pid = task.process.pid if task.process else None
        record.started_at = iso_time(task.started_at) if task.started_at else None
        record.ended_at = iso_time(task.ended_at) if task.ended_at else None
        record.restarts = task.restarts
        record.leftovers = list(task.leftovers)
        fields = status_fields(task)
        record.exit_code, record.signal, record.error = fields["exit_code"], fields["signal"], fields["error"]
    return record


def left_out_record(launch: TaskLaunch, attempt: int) -> TaskRecord:
    """A task of the whole cluster (``launch``, where the file puts it) that attempt ``attempt`` runs
    without: no process, no env of that attempt."""
    return TaskRecord(name=launch.name, role=launch.role, index=launch.index, host=launch.host,
                      address=launch.address, local=launch.local, argv=list(masked_command(tuple(launch.argv))),
                      workdir=launch.workdir, gpus=None if launch.gpus is None else list(launch.gpus),
                      state=TaskState.LEFT_OUT, attempt=attempt)


def status_fields(task: Task) -> dict:
    status = task.status
    return {"exit_code": status.shell_code if status else None,
            "signal": status.signal if status else None,
            "error": status.error if status else None}
