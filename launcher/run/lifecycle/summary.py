"""Human-readable text for plans and results (the CLI prints it; nothing here prints).

The closing summary of a run reads its folder as well as its result: ``metrics.jsonl`` for the
training figures and ``resources.json`` for each task's peak memory and CPU.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from ...cluster.plan import Plan
from ...cluster.spec import ClusterSpec, Network
from ...masking import masked_command, masked_text
from ...records.folder import DEFAULT_LOG_DIR, LEARNING_CURVES, RunFolder
from ...records.logview import TAIL_LINES, tail_lines
from ...records.metrics import read_metrics, speaker, trained_seconds
from ...records.metrictext import time_text
from ...records.states import Outcome, TaskState, duration_text, plural
from ..console.metricview import number as figure
from ..console.chatter import meaningful
from ..console.pyerror import exception_lines
from .session import RunResult
from .task import Task
from ..console.twins import names_text


def describe_plan(spec: ClusterSpec, plan: Plan) -> list[str]:
    """What ``--dry-run`` shows: per task, host, workdir, command and the env tflaunch adds (hidden
    values masked: variables passed by name and secrets' names, see launcher.cluster.spec)."""
    lines = [f"{plural(len(plan.launches), 'task')} from {spec.source} (nothing started)"]
    if spec.network is Network.ISOLATED:
        lines.append("network: isolated (every task in one network namespace of the run's own; "
                     "nothing outside reaches it, and it reaches nothing outside)")
    elif spec.network is Network.SEALED:
        lines.append("network: sealed (every task in one network namespace of the run's own; "
                     "nothing outside reaches it)")
    for launch in plan.launches:
        where = "this machine" if launch.local else launch.transport
        lines.append(f"{launch.name}: host {launch.host} ({where}), address {launch.address}")
        lines.append(f"  workdir: {launch.workdir}")
        if launch.setup:
            lines.append(f"  setup:   {masked_text(launch.setup)}")
        lines.append(f"  command: {shlex.join(masked_command(tuple(launch.argv)))}")
        for key, value in launch.shown_env().items():
            source = launch.env_sources.get(key)
            lines.append(f"  env: {key}={shlex.quote(value)}" + (f"  ({source})" if source else ""))
    if spec.spares:
        slots = ", ".join(f"{slot.host}:{slot.port}" for slot in spec.spares)
        lines.append(f"spares: {slots} (a lost host's tasks move there at the next restart)")
    if spec.min_workers is not None:
        lines.append(f"min_workers: {spec.min_workers} (with no spare left, restarts shrink to this many training tasks)")
    lines += [f"note: {note}" for note in plan.notes]
    return lines


def describe_result(result: RunResult, exit_line: bool = True) -> list[str]:
    """The closing lines of a run: a success line, or the failure summary, root cause first, ending
    with the exit code tflaunch exits with (not for a Python caller, ``exit_line=False``, who gets a result)."""
    final = result.final
    duration = duration_text(result.record.seconds() if result.record else None)
    attempts = f" after {plural(len(result.attempts), 'attempt')}" if len(result.attempts) > 1 else ""
    usage = RunFolder(Path(result.run_dir)).read_resources()
    if final.outcome is Outcome.SUCCEEDED:
        training = training_lines(read_metrics(RunFolder(Path(result.run_dir)).metrics_path), len(result.attempts))
        return [f"run {result.run_id} succeeded{attempts} in {duration} ({plural(len(final.tasks), 'task')})",
                *task_table(final.tasks, usage), *leftover_lines(result), *straggler_lines(result), *training,
                f"logs in {result.run_dir}", *([_report_hint(result)] if training else [])]
    lines: list[str] = []
    root = final.root_cause
    if final.outcome is Outcome.INTERRUPTED or result.exit_code != final.exit_code:
        lines.append(f"run {result.run_id} stopped{attempts}: {final.reason or 'interrupted'}; exit code {result.exit_code}")
    elif root is not None:
        lines.append(f"run {result.run_id} failed: {root.name} on {root.launch.host}: {root.status.describe()}")
        raised = _exception(root)
        shown = raised or result.root_cause_tail
        what = "its exception" if raised else f"{_last_lines(len(shown))} of its output"
        lines.append(f"root cause: {root.name} (host {root.launch.host}, {root.status.describe()})"
                     + (f"; {what}:" if shown else ""))
        lines += [f"  {root.name} | {line}" for line in shown]
        lines.append(f"  (all of its output, TensorFlow's start-up chatter included: {root.log_path})")
        known = result.diagnosis
        if known is not None:
            lines.append(f"diagnosis ({known.rule}): {known.summary}")
            lines.append(f"fix: {known.fix}")
    else:
        lines.append(f"run {result.run_id} failed{attempts}: {final.reason}")
        for task in final.tasks:
            if task.name in final.blamed:
                raised = _exception(task)
                tail = raised or (tail_lines(Path(task.log_path), TAIL_LINES // 2, keep=meaningful())
                                  if task.log_path else [])
                if tail:
                    what = "its exception" if raised else f"{_last_lines(len(tail))} of its output"
                    lines.append(f"{task.name} (host {task.launch.host}): {what}:")
                    lines += [f"  {task.name} | {line}" for line in tail]
    if root is not None and len(result.attempts) > 1:
        lines[0] += attempts
    others = [t for t in final.tasks if t is not root]
    if others:
        lines.append("other tasks:" if root is not None else "tasks:")
        lines += task_table(others, usage, fold=len(final.tasks) >= FOLD_FROM)
    lines += leftover_lines(result)
    lines += straggler_lines(result)
    lines += training_lines(read_metrics(RunFolder(Path(result.run_dir)).metrics_path), len(result.attempts))
    lines.append(f"logs in {result.run_dir}" + (f"; tflaunch exits with {result.exit_code}" if exit_line else ""))
    return lines


def leftover_lines(result: RunResult) -> list[str]:
    """What tasks left running when they ended (and had to be stopped), attempt by attempt."""
    lines = []
    for number, attempt in enumerate(result.attempts, 1):
        where = f" in attempt {number}" if len(result.attempts) > 1 else ""
        for task in attempt.tasks:
            if task.leftovers:
                count = len(task.leftovers)
                lines.append(f"{task.name} left {plural(count, 'process', 'processes')} behind{where}: "
                             f"{', '.join(task.leftovers)}, stopped")
    return lines


def straggler_lines(result: RunResult) -> list[str]:
    """Each straggler named during the run, attempt by attempt, as ``status`` and ``report`` say it."""
    return [f"straggler: {straggler.line()}" for straggler in (result.record.stragglers if result.record else [])]


FOLD_FROM = 8  # a table of this many tasks or more folds alike tasks into one row
# Figures alike enough to share a row: peak RSS within a quarter (or 32 MB), mean CPU within 20 points.
RSS_SPREAD, RSS_SLACK_MB, CPU_SPREAD = 0.25, 32.0, 20.0


def task_table(tasks: list[Task], usage: dict[str, dict[str, Any]], fold: bool | None = None) -> list[str]:
    """Each task's host, state, exit status, peak RSS and CPU (mean and peak; 100 % is one core).

    Folded (by default from :data:`FOLD_FROM` tasks on), tasks that ended alike (same state and
    exit) with similar figures share a row named by their range, ``worker-[0-6,8] (8 tasks)``,
    with their highest peaks and the mean of their CPU means, so a task that differs keeps a row
    of its own; run.json and ``tflaunch status`` still list every task.
    """
    rows = [("task", "host", "state", "exit", "peak RSS", "CPU mean", "CPU peak")]
    fold = len(tasks) >= FOLD_FROM if fold is None else fold
    groups = alike_groups(tasks, usage) if fold else [[task] for task in tasks]
    for group in groups:
        first = group[0]
        figures = [usage.get(task.name, {}) for task in group]
        rss = _highest(f.get("rss_mb_peak") for f in figures)
        peak = _highest(f.get("cpu_percent_peak") for f in figures)
        means = [m for f in figures if figure(m := f.get("cpu_percent_mean"))]
        mean = sum(means) / len(means) if means else None
        hosts = sorted({task.launch.host for task in group})
        name = first.name if len(group) == 1 else f"{names_text(t.name for t in group)} ({plural(len(group), 'task')})"
        rows.append((name, hosts[0] if len(hosts) == 1 else f"{len(hosts)} hosts", _state(first), _exit(first),
                     f"{rss:,.0f} MB" if figure(rss) else "-", f"{mean:.0f} %" if figure(mean) else "-",
                     f"{peak:.0f} %" if figure(peak) else "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(cell.rjust(w) if i >= 4 else cell.ljust(w)
                             for i, (cell, w) in enumerate(zip(row, widths))).rstrip() for row in rows]


def alike_groups(tasks: list[Task], usage: dict[str, dict[str, Any]]) -> list[list[Task]]:
    """The tasks cut into groups that ended alike (state and exit) with similar figures, in the
    order of each group's first task; a task joins the first group it fits.

    Similar: every measured peak RSS of a group within :data:`RSS_SPREAD` (or :data:`RSS_SLACK_MB`)
    of each other, every mean CPU within :data:`CPU_SPREAD` points. A figure that was not measured
    (a task too short to sample) differs from none.
    """
    groups: list[tuple[tuple[str, str], list[Task], list[_Span]]] = []
    for task in tasks:
        ended = (_state(task), _exit(task))
        mine = usage.get(task.name, {})
        figures = (mine.get("rss_mb_peak"), mine.get("cpu_percent_mean"))
        for alike, group, spans in groups:
            wider = [_widen(span, value) for span, value in zip(spans, figures)]
            if alike == ended and _close_rss(wider[0]) and _close_cpu(wider[1]):
                group.append(task)
                spans[:] = wider
                break
        else:
            groups.append((ended, [task], [_widen(None, value) for value in figures]))
    return [group for _, group, _ in groups]


_Span = tuple[float, float] | None  # the lowest and highest of a figure in a group, None if never measured


def _widen(span: _Span, value: Any) -> _Span:
    if not figure(value):
        return span
    return (value, value) if span is None else (min(span[0], value), max(span[1], value))


def _close_rss(span: _Span) -> bool:
    return span is None or span[1] - span[0] <= max(RSS_SPREAD * span[1], RSS_SLACK_MB)


def _close_cpu(span: _Span) -> bool:
    return span is None or span[1] - span[0] <= CPU_SPREAD


def _highest(values) -> float | None:
    numbers = [v for v in values if figure(v)]
    return max(numbers) if numbers else None


def _state(task: Task) -> str:
    """The task's state; a task stopped before it ever started says so."""
    if task.state is TaskState.STOPPED and task.started_at is None and task.status is None:
        return "not started"
    return task.state.value


def training_lines(records: list[dict[str, Any]], attempt: int) -> list[str]:
    """Epochs, the last epoch's figures, throughput and the test result of the final attempt, the
    training time of every attempt together, and where the reporting task's time went.

    Training time is what the epoch lines add up to (:func:`launcher.records.metrics.trained_seconds`);
    the task's start-up (TensorFlow's import, the data, the strategy) and its test are said apart,
    with the parts adding up to the task's whole time (:func:`launcher.records.metrictext.time_text`).
    """
    trained = trained_seconds(records)
    records = [r for r in records if r.get("attempt", 1) == attempt]
    reporter = _reporter(records)
    epochs = [r for r in records if r.get("kind") == "epoch" and r.get("task") == reporter
              and isinstance(r.get("epoch"), int)]
    final = next((r for r in reversed(records) if r.get("kind") == "final" and r.get("task") == reporter), None)
    if not epochs and final is None:
        return []
    lines = []
    if epochs:
        last = epochs[-1]
        rates = [r["samples_per_second"] for r in epochs if figure(r.get("samples_per_second"))]
        head = f"training: {plural(last['epoch'], 'epoch')}"
        if trained is not None:
            head += f" in {duration_text(trained)}"
            if attempt > 1:
                head += " (every attempt's epochs)"
        if rates:
            import statistics  # here: it loads fractions and decimal, and only a run with metrics needs it

            head += f", median {statistics.median(rates):,.0f} samples/s"
        figures = [f"{label} {text}" for key, label in
                   (("loss", "loss"), ("accuracy", "acc"), ("val_loss", "val_loss"), ("val_accuracy", "val_acc"))
                   if (text := figure(last.get(key))) is not None]
        lines.append(head + (f"; last epoch: {'  '.join(figures)}" if figures else ""))
    if final is not None:
        figures = [f"{label} {text}" for key, label in (("test_accuracy", "acc"), ("test_loss", "loss"))
                   if (text := figure(final.get(key))) is not None]
        if figures:
            lines.append(f"test: {'  '.join(figures)}")
        seconds = sum(r["epoch_seconds"] for r in epochs if figure(r.get("epoch_seconds")))
        spent = time_text(final, seconds)
        if spent:
            where = f"{reporter}'s time" + (f" in attempt {attempt}" if attempt > 1 else "")
            lines.append(f"{where}: {spent}")
    return lines


def _reporter(records: list[dict[str, Any]]) -> str | None:
    """The task whose training records stand for the cluster's, among those that sent some."""
    tasks = [r.get("task") for r in records if r.get("kind") in ("epoch", "final")]
    return speaker(tasks, tasks)


def _report_hint(result: RunResult) -> str:
    run_dir = Path(result.run_dir)
    where = "" if run_dir.parent.resolve() == Path(DEFAULT_LOG_DIR).resolve() else f" --log-dir {shlex.quote(str(run_dir.parent))}"
    return (f"per-epoch table: tflaunch report {result.run_id}{where}; learning curves: add --plot "
            f"(draws {run_dir / LEARNING_CURVES})")


def _exit(task: Task) -> str:
    return "-" if task.status is None else task.status.describe(stopped=task.state is TaskState.STOPPED)


EXCEPTION_SEARCH = 1 << 18  # bytes at the end of a task's log searched for its exception


def _exception(task: Task) -> list[str] | None:
    """The task's last Python exception, as :func:`launcher.run.console.pyerror.exception_lines` shows
    it, for a task that ended as an uncaught exception ends Python (exit code 1): a task that ended
    otherwise (a signal, its own exit code) shows its last lines, whatever it printed before."""
    status = task.status
    if not task.log_path or status is None or status.signal is not None or status.code != 1:
        return None
    return exception_lines(tail_lines(Path(task.log_path), 1 << 30, EXCEPTION_SEARCH, keep=meaningful()))


def _last_lines(count: int) -> str:
    return "last line" if count == 1 else f"last {count} lines"
