"""Watchdogs for one attempt: a cluster that never forms, and a cluster that hangs.

- start timeout: every training task (the chief with ``ps`` tasks, else the chief and workers)
  must report progress (a metric line, see output.METRIC_PREFIX) within S seconds of the start;
- hang timeout: some task must write some output within every S seconds. When it trips, the
  Python stacks of every running task are collected (py-spy, no change to the task needed)
  into ``attempt-<k>/stacks/<task>.txt`` before the attempt is stopped.

The supervisor calls the watchdog on every poll; it returns a :class:`Trip` to stop the attempt.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from .pump import OutputPump
from .supervisor import Task, TaskState, Trip


@dataclass(frozen=True)
class WatchdogSettings:
    start_timeout: float | None = None
    hang_timeout: float | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.start_timeout or self.hang_timeout)


class Watchdog:
    def __init__(self, settings: WatchdogSettings, pump: OutputPump, attempt: int, trainers: Sequence[str],
                 stacks_dir: Path, on_event: Callable[[str], None], clock: Callable[[], float] = time.time):
        self.settings = settings
        self.pump = pump
        self.attempt = attempt
        self.trainers = list(trainers)
        self.stacks_dir = stacks_dir
        self.on_event = on_event
        self.clock = clock
        self.started = clock()
        self.formed = not settings.start_timeout

    def __call__(self, tasks: list[Task]) -> Trip | None:
        now = self.clock()
        if not self.formed:
            missing = [n for n in self.trainers if (self.attempt, n) not in self.pump.progress]
            if not missing:
                self.formed = True
            elif now - self.started > self.settings.start_timeout:
                return Trip(f"start timeout: {', '.join(missing)} made no training progress within "
                            f"{self.settings.start_timeout:g} s (the cluster never formed)", tuple(missing))
        hang = self.settings.hang_timeout
        if hang and now - max(self.pump.last_activity, self.started) > hang:
            running = [t for t in tasks if t.state is TaskState.RUNNING]
            self.on_event(f"no output from any task for {hang:g} s: collecting stack traces")
            written = self.collect_stacks(running)
            return Trip(f"hang timeout: no output from any task for {hang:g} s; "
                        f"stack traces of {len(written)} tasks in {self.stacks_dir}", tuple(t.name for t in running))
        return None

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


def training_tasks(names_and_roles: Sequence[tuple[str, str]]) -> list[str]:
    """The tasks whose progress shows the cluster formed: the chief with ps tasks, else chief and workers."""
    roles = {role for _, role in names_and_roles}
    wanted = ("chief",) if "ps" in roles else ("chief", "worker")
    return [name for name, role in names_and_roles if role in wanted]
