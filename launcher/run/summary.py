"""Human-readable text for plans and results (the CLI prints it; nothing here prints)."""

from __future__ import annotations

import shlex

from pathlib import Path

from ..cluster.spec import ClusterSpec
from .launch import TAIL_LINES, RunResult
from .pump import tail_lines
from ..cluster.plan import Plan
from .supervisor import Outcome, Task


def describe_plan(spec: ClusterSpec, plan: Plan) -> list[str]:
    """What ``--dry-run`` shows: per task, host, workdir, command and the env tflaunch adds."""
    lines = [f"{len(plan.launches)} tasks from {spec.source} (nothing started)"]
    for launch in plan.launches:
        where = "this machine" if launch.local else "ssh"
        lines.append(f"{launch.name}: host {launch.host} ({where}), address {launch.address}")
        lines.append(f"  workdir: {launch.workdir}")
        if launch.setup:
            lines.append(f"  setup:   {launch.setup}")
        lines.append(f"  command: {shlex.join(launch.argv)}")
        for key, value in launch.env.items():
            source = launch.env_sources.get(key)
            lines.append(f"  env: {key}={shlex.quote(value)}" + (f"  ({source})" if source else ""))
    lines += [f"note: {note}" for note in plan.notes]
    return lines


def describe_result(result: RunResult) -> list[str]:
    """The closing lines of a run: a success line, or the failure summary, root cause first."""
    final = result.final
    duration = _duration(final.tasks)
    attempts = f" after {len(result.attempts)} attempts" if len(result.attempts) > 1 else ""
    if final.outcome is Outcome.SUCCEEDED:
        return [f"run {result.run_id} succeeded{attempts} in {duration} ({len(final.tasks)} tasks); "
                f"logs in {result.run_dir}"]
    lines: list[str] = []
    root = final.root_cause
    if final.outcome is Outcome.INTERRUPTED or result.exit_code != final.exit_code:
        lines.append(f"run {result.run_id} stopped{attempts}: {final.reason or 'interrupted'}; exit code {result.exit_code}")
    elif root is not None:
        lines.append(f"run {result.run_id} failed: {root.name} on {root.launch.host}: {root.status.describe()}")
        lines.append(f"root cause: {root.name} (host {root.launch.host}, {root.status.describe()}); "
                     f"last {len(result.root_cause_tail)} lines of its output:")
        lines += [f"  {root.name} | {line}" for line in result.root_cause_tail]
        known = result.diagnosis
        if known is not None:
            lines.append(f"diagnosis ({known.rule}): {known.summary}")
            lines.append(f"fix: {known.fix}")
    else:
        lines.append(f"run {result.run_id} failed{attempts}: {final.reason}")
        for task in final.tasks:
            if task.name in final.blamed:
                tail = tail_lines(Path(task.log_path), TAIL_LINES // 2) if task.log_path else []
                lines.append(f"{task.name} (host {task.launch.host}): last {len(tail)} lines of its output:")
                lines += [f"  {task.name} | {line}" for line in tail]
    if root is not None and len(result.attempts) > 1:
        lines[0] += attempts
    others = [t for t in final.tasks if t is not root]
    if others:
        lines.append("other tasks:")
        width = max(len(t.name) for t in others)
        lines += [f"  {t.name.ljust(width)}  {t.launch.host}  {_state(t)}" for t in others]
    lines.append(f"logs in {result.run_dir}; tflaunch exits with {result.exit_code}")
    return lines


def _state(task: Task) -> str:
    text = task.state.value
    if task.status is not None:
        text += f" ({task.status.describe()})"
    return text


def _duration(tasks: list[Task]) -> str:
    starts = [t.started_at for t in tasks if t.started_at]
    ends = [t.ended_at for t in tasks if t.ended_at]
    if not starts or not ends:
        return "0.0 s"
    return f"{max(ends) - min(starts):.1f} s"
