"""``tflaunch stacks``: every task's Python stacks of a running run, now, and which task differs.

The run's own tflaunch samples the stacks through its agents and compares them; this module
finds the run, asks over the run folder's control socket (:mod:`launcher.records.control`), and
lays the answer out. The run goes on untouched.
"""

from __future__ import annotations

from typing import Any

from ..records.states import RunStatus, plural
from ..records.control import ControlError, ask, escaped
from .runs import Run


def live_stacks(run: Run) -> dict[str, Any]:
    """The answer of the run's tflaunch (see :mod:`launcher.records.control`); ControlError when it cannot give one."""
    status = run.status
    if status is not RunStatus.RUNNING:
        where = run.folder.stack_dirs()
        kept = f"; the stacks of its last hang are in {where[-1]}" if where else ""
        raise ControlError(f"run {run.run_id} is not running ({status.describe()}): 'tflaunch stacks' asks a "
                           f"running run's tflaunch{kept}")
    if run.launcher_alive() is None:
        raise ControlError(f"run {run.run_id} is run by tflaunch on {run.record.launcher.host}: "
                           "ask there (tflaunch stacks works on the machine tflaunch runs on)")
    return ask(run.path, run.run_id, {"op": "stacks"})


def stacks_lines(answer: dict[str, Any]) -> list[str]:
    """The verdict first, then each task's stacks as py-spy printed them; every character a terminal
    would act on is shown escaped (a task names its own threads and functions)."""
    tasks = [task for task in answer.get("tasks") or [] if isinstance(task, dict)]
    verdict = answer.get("verdict") if isinstance(answer.get("verdict"), dict) else {}
    lines = [f"run {answer.get('run_id')}, attempt {answer.get('attempt')}: stacks of {plural(len(tasks), 'running task')}, "
             f"sampled at {answer.get('sampled_at')} in {answer.get('seconds')} s",
             f"verdict: {verdict.get('summary', '-')}"]
    for task in tasks:
        lines += ["", f"== {task.get('name')} ({task.get('role')} on {task.get('host')}, pid {task.get('pid')})"]
        lines += str(task.get("stacks") or "").rstrip("\n").split("\n")
    return [escaped(line) for line in lines]
