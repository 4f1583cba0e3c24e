"""What ``tflaunch status`` shows of a run: each task's state, pid, host, uptime and last metric, read
from the run's folder, and, for a live run on this machine, its tasks' CPU and memory measured now."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..records.record import RunStatus
from ..records.states import TaskState
from .runs import Run, epoch_seconds, pid_alive


@dataclass
class TaskStatus:
    name: str
    role: str
    host: str
    local: bool
    state: str
    pid: int | None
    started_at: str | None
    uptime_seconds: float | None
    exit_code: int | None
    signal: int | None
    error: str | None
    alive: bool | None  # the task's process exists on this host (None: cannot tell from here)
    last_metric: dict[str, Any] | None
    usage: dict[str, Any] | None  # measured now: cpu_percent, rss_mb, processes
    resources: dict[str, Any] | None  # from resources.json: means, peaks, samples
    restarts: int = 0  # in-place restarts of this task in the latest attempt
    leftovers: list[str] = field(default_factory=list)  # processes it left behind that were stopped


@dataclass
class RunState:
    """What ``tflaunch status`` shows of a run."""

    run_id: str
    path: str
    source: str
    status: str
    exit_code: int | None
    attempt: int
    started_at: str | None
    uptime_seconds: float | None
    launcher: dict[str, Any]
    tasks: list[TaskStatus] = field(default_factory=list)
    error: str | None = None  # what ended the run from outside its tasks
    root_cause: str | None = None  # the task that ended the run and why (a hang's verdict), in one line
    excluded: list[str] = field(default_factory=list)  # hosts left out of an attempt, and why (one line each)
    stragglers: list[str] = field(default_factory=list)  # tasks the others kept waiting for (one line each)


# Measures live tasks of this machine ({task: pid}) over some seconds: {task: {"cpu_percent", "rss_mb",
# "processes", ...}}. The command line passes launcher.run.output.resources.measure_tasks, which measures
# the way every task's agent samples it; the read side itself touches no process.
Measure = Callable[[dict[str, int], float, Path], dict[str, dict[str, Any]]]


def run_status(run: Run, measure_seconds: float = 0.5, measure: Measure | None = None) -> RunState:
    """Each task's state, pid, host, uptime and last metric; with ``measure``, CPU% and RSS of live local tasks."""
    now = time.time()
    status = run.status
    metrics = run.metrics()
    last = {m.get("task"): m for m in metrics}
    figures = run.resources()
    live_local = {}
    tasks = []
    for task in run.record.tasks:  # those left out too: the console said so
        started = epoch_seconds(task.started_at)
        ended = epoch_seconds(task.ended_at)
        running = task.state == TaskState.RUNNING
        alive = None
        if task.local and run.on_this_host and task.pid:
            alive = running and pid_alive(int(task.pid), not_after=started)
            if alive and status is RunStatus.RUNNING:
                live_local[task.name] = int(task.pid)
        uptime = None
        if started is not None:
            uptime = round((now if running and alive is not False else (ended or now)) - started, 3)
        ran = task.state is not TaskState.LEFT_OUT  # a task left out may share its name with one that ran
        tasks.append(TaskStatus(task.name, task.role, task.host, task.local, task.state, task.pid, task.started_at,
                                uptime, task.exit_code, task.signal, task.error, alive,
                                last.get(task.name) if ran else None, None, figures.get(task.name) if ran else None,
                                task.restarts, list(task.leftovers)))
    usage = measure(live_local, measure_seconds, run.path) if live_local and measure else {}
    for task in tasks:
        task.usage = usage.get(task.name)
    uptime = run.record.seconds(now if status is RunStatus.RUNNING else None)
    launcher = asdict(run.record.launcher)
    launcher["alive"] = run.launcher_alive()
    return RunState(run.run_id, str(run.path), run.record.source, status.value, run.record.exit_code, run.attempt,
                    run.record.started_at, uptime, launcher, tasks, run.record.error, cause_line(run),
                    run.record.excluded_lines(),
                    [straggler.line() for straggler in run.record.stragglers])


def cause_line(run: Run) -> str | None:
    """The run's root cause in one line (:meth:`~launcher.records.record.RootCause.line`), if it has one."""
    root = run.record.root_cause
    return None if root is None else root.line()
