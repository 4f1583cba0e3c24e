"""Watchdogs for one attempt: a cluster that never forms, and a cluster that hangs.

- start timeout: every training task (the chief with ``ps`` tasks, else the chief and workers)
  must report progress (a metric line, see :mod:`launcher.records.metrics`) within S seconds of
  the start.
  When it trips on a cluster that spans hosts, the mesh probe (:mod:`launcher.run.mesh`) checks,
  while the tasks still hold their ports, that every host reaches every task, and the reason
  names the pairs that cannot connect;
- hang timeout: some task must write some output within every S seconds. When it trips, the
  Python stacks of every running task are collected (py-spy, no change to the task needed)
  into ``attempt-<k>/stacks/<task>.txt`` before the attempt is stopped.

The supervisor calls the watchdog on every poll; it returns a :class:`Trip` to stop the attempt.
It reads what the output pump saw through the shared :class:`~.progress.Progress`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from ..cluster.plan import TaskLaunch
from ..records.states import TaskState
from .progress import Progress
from .supervisor import Task, Trip


@dataclass(frozen=True)
class WatchdogSettings:
    start_timeout: float | None = None
    hang_timeout: float | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.start_timeout or self.hang_timeout)


class Watchdog:
    def __init__(self, settings: WatchdogSettings, progress: Progress, attempt: int, trainers: Sequence[str],
                 stacks_dir: Path, message: Callable[[str], None], clock: Callable[[], float] = time.time,
                 mesh_problems: Callable[[list[TaskLaunch]], list[str]] | None = None):
        self.settings = settings
        self.progress = progress
        self.attempt = attempt
        self.trainers = list(trainers)
        self.stacks_dir = stacks_dir
        self.message = message
        self.clock = clock
        self.started = clock()
        self.formed = not settings.start_timeout
        self.mesh_problems = mesh_problems or _mesh_problems  # the broken pairs of a live cluster

    def __call__(self, tasks: list[Task]) -> Trip | None:
        now = self.clock()
        if not self.formed:
            missing = self.progress.silent(self.attempt, self.trainers)
            if not missing:
                self.formed = True
            elif now - self.started > self.settings.start_timeout:
                reason = (f"start timeout: {', '.join(missing)} made no training progress within "
                          f"{self.settings.start_timeout:g} s (the cluster never formed)")
                return Trip(reason + self.explain_stall(tasks), tuple(missing))
        hang = self.settings.hang_timeout
        if hang and now - max(self.progress.last_output, self.started) > hang:
            running = [t for t in tasks if t.state is TaskState.RUNNING]
            self.message(f"no output from any task for {hang:g} s: collecting stack traces")
            written = self.collect_stacks(running)
            return Trip(f"hang timeout: no output from any task for {hang:g} s; "
                        f"stack traces of {len(written)} tasks in {self.stacks_dir}", tuple(t.name for t in running))
        return None

    def explain_stall(self, tasks: list[Task]) -> str:
        """What the mesh probe finds while the tasks hold their ports, as a reason's tail ('' if not run)."""
        launches = [t.launch for t in tasks]
        if all(launch.local for launch in launches):
            return ""  # one machine: no network between its tasks to blame
        self.message("start timeout: probing the mesh (every host to every task's address)")
        try:
            problems = self.mesh_problems(launches)
        except OSError as exc:
            return f"; the mesh probe could not run ({exc})"
        for line in problems:
            self.message(f"mesh: {line}")
        if not problems:
            return "; every host reaches every task's address"
        return f"; the mesh is broken: {'; '.join(problems)}"

    def collect_stacks(self, tasks: list[Task]) -> list[Path]:
        """Dump every task's stacks in parallel into the stacks folder."""
        self.stacks_dir.mkdir(parents=True, exist_ok=True)

        def dump(task: Task) -> Path:
            path = self.stacks_dir / f"{task.name}.txt"
            path.write_text(task.process.dump_stacks() if task.process else "")
            return path

        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=max(1, min(16, len(tasks)))) as pool:
            return list(pool.map(dump, tasks))


def _mesh_problems(launches: list[TaskLaunch]) -> list[str]:
    from .mesh import stall_problems  # imported here: a local run never needs it

    return stall_problems(launches)


def training_tasks(names_and_roles: Sequence[tuple[str, str]]) -> list[str]:
    """The tasks whose progress shows the cluster formed: the chief with ps tasks, else chief and workers."""
    roles = {role for _, role in names_and_roles}
    wanted = ("chief",) if "ps" in roles else ("chief", "worker")
    return [name for name, role in names_and_roles if role in wanted]
