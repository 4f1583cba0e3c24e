"""What the inspection commands show: tables of runs, status, per-epoch reports, comparisons, plots.

Each ``*_lines`` function turns figures into text lines (the CLI prints them); each builder returns
plain data that is also the ``--json`` output. matplotlib is imported only to draw the learning
curves, and its absence costs the plot alone.
"""

from __future__ import annotations

import shlex
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..records.logformat import format_size
from ..records.folder import LEARNING_CURVES, RECORD, RESOURCES, TASK_LOG_SUFFIX
from ..records.exits import exit_words
from ..records.files import create_beside
from ..records.logview import left_out
from ..records.metrics import trained_seconds
from ..records.metrictext import time_text
from ..records.states import RunStatus, TaskState, clock_text, duration_text, plural
from .runs import NoMetricsError, Run, RunSummary, epoch_records, final_record
from .status import RunState, cause_line

# tflaunch installs matplotlib; it is missing only where it was removed, from this interpreter.
PLOT_MISSING = (f"learning curves: not drawn, matplotlib is not installed for {sys.executable} "
                f"({shlex.quote(sys.executable)} -m pip install matplotlib)")


# -- formatting -------------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str) -> list[str]:
    """Aligned columns; ``align`` has one letter per column, ``l`` (text) or ``r`` (figures)."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    numeric = [a == "r" for a in align]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)]
        return "  ".join(parts).rstrip()

    return [line(headers)] + [line(r) for r in cells]


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def num(value: float | None, digits: int) -> str:
    """A figure with ``digits`` decimals, or "-" when it was not reported (anything else a task
    reported shows as it is: a figure of the wrong type is the task's to fix, not a reason to fail)."""
    if not is_number(value):
        return "-" if value is None else str(value)
    return f"{value:.{digits}f}"


def _epochs(count: Any) -> str:
    return plural(count, "epoch") if isinstance(count, int) and not isinstance(count, bool) else f"{count} epochs"


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def status_text(status: str, exit_code: int | None) -> str:
    """``failed (exit 3)``: the exit code is shown wherever it is not plain success."""
    status = getattr(status, "value", status)  # a RunStatus prints as its spelling, not as "RunStatus.X"
    if status in (RunStatus.FAILED, RunStatus.STOPPED) and exit_code is not None:
        return f"{status} (exit {exit_code})"
    if status == RunStatus.LAUNCHER_LOST:
        return RunStatus.LAUNCHER_LOST.describe()
    return status


# -- tflaunch runs ----------------------------------------------------------------------------


def runs_lines(summaries: list[RunSummary]) -> list[str]:
    rows = [[s.run_id, clock_text(s.started_at), s.source, s.tasks, s.attempts, status_text(s.status, s.exit_code),
             duration_text(s.duration_seconds), s.test_accuracy] for s in summaries]
    lines = table(["RUN", "STARTED", "CLUSTER", "TASKS", "ATTEMPTS", "STATUS", "DURATION", "TEST ACC"], rows,
                  "lllrrlrr")
    return lines + [s.problem for s in summaries if s.problem]


# -- tflaunch status --------------------------------------------------------------------------


def status_lines(status: RunState, now: float | None = None) -> list[str]:
    launcher = status.launcher
    where = f"launcher pid {launcher.get('pid')} on {launcher.get('host')}"
    if status.status == RunStatus.RUNNING:
        head = f"running for {duration_text(status.uptime_seconds)}, attempt {status.attempt}; {where}"
        if launcher.get("alive") is None:
            head += " (another host: not checked from here)"
    elif status.status == RunStatus.LAUNCHER_LOST:
        head = (f"launcher lost: {RECORD} says running but the {where} is gone; "
                f"task states below are the last ones recorded")
    else:
        head = (f"not running: {status_text(status.status, status.exit_code)} after "
                f"{duration_text(status.uptime_seconds)}, {plural(status.attempt, 'attempt')}")
    lines = [f"run {status.run_id} ({status.source}): {head}"]
    rows = []
    for task in status.tasks:
        state = task.state
        if task.state in (TaskState.FAILED, TaskState.STOPPED, TaskState.SUCCEEDED) and (
                task.exit_code is not None or task.signal is not None or task.error is not None):
            state += f" ({exit_words(task.exit_code, task.signal, task.error, task.state == TaskState.STOPPED)})"
        elif task.state == TaskState.RUNNING and task.alive is False:
            state += " (process gone)"
        if task.restarts:
            state += f", restarted {task.restarts}x in place"
        usage = task.usage or {}
        rows.append([task.name, task.role, task.host, state, task.pid, duration_text(task.uptime_seconds),
                     num(usage.get("cpu_percent"), 1), num(usage.get("rss_mb"), 1),
                     describe_metric(task.last_metric, now)])
    lines += table(["TASK", "ROLE", "HOST", "STATE", "PID", "UPTIME", "CPU%", "RSS MB", "LAST METRIC"], rows,
                   "llllrrrrl")
    lines += [f"{task.name} left {plural(len(task.leftovers), 'process', 'processes')} behind: "
              f"{', '.join(task.leftovers)}, stopped"
              for task in status.tasks if task.leftovers]
    if status.error:
        lines.append(f"error: {status.error}")
    lines += [f"root cause: {status.root_cause}"] if status.root_cause else []
    lines += [f"excluded: {line}" for line in status.excluded]
    lines += [f"straggler: {line}" for line in status.stragglers]
    figures = {t.name: t.resources for t in status.tasks if t.resources}
    if figures:
        lines += ["", f"resource use over the run so far ({RESOURCES}):" if status.status == RunStatus.RUNNING
                  else f"resource use over the run ({RESOURCES}):"]
        lines += resources_lines(figures)
    return lines


def describe_metric(record: dict[str, Any] | None, now: float | None = None) -> str:
    if not record:
        return "-"
    if record.get("kind") == "final":
        text = f"final: test acc {_cell(record.get('test_accuracy'))}, test loss {_cell(record.get('test_loss'))}"
    else:
        text = (f"epoch {record.get('epoch')}: loss {_cell(record.get('loss'))}, "
                f"acc {_cell(record.get('accuracy'))}, val acc {_cell(record.get('val_accuracy'))}")
    if isinstance(record.get("time"), (int, float)):
        text += f" ({duration_text(max(0.0, (now or time.time()) - record['time']))} ago)"
    return text


def resources_lines(figures: dict[str, dict[str, Any]]) -> list[str]:
    rows = [[name, num(f.get("cpu_percent_mean"), 1), num(f.get("cpu_percent_peak"), 1), num(f.get("rss_mb_mean"), 1),
             num(f.get("rss_mb_peak"), 1), f.get("samples")] for name, f in figures.items()]
    return table(["TASK", "CPU% MEAN", "CPU% PEAK", "RSS MB MEAN", "RSS MB PEAK", "SAMPLES"], rows, "lrrrrr")


# -- tflaunch report --------------------------------------------------------------------------


EPOCH_KEYS = ("epoch", "loss", "accuracy", "val_loss", "val_accuracy", "epoch_seconds", "samples_per_second")
# Fields of an epoch record that are no figure of the model's (a Keras script's other figures,
# sparse_categorical_accuracy or lr, get columns of their own).
_NOT_FIGURES = {"kind", "task", "time", "attempt", "epochs", "global_batch", "replicas", "steps", "step_seconds",
                "keras_seconds", "source", "train_seconds", "first_step_seconds"}


@dataclass
class Report:
    run_id: str
    source: str
    status: str
    exit_code: int | None
    chief: str | None
    epochs: dict[str, list[dict[str, Any]]]  # task -> one record per epoch
    final: dict[str, Any]
    resources: dict[str, dict[str, Any]]
    plot: str | None = None  # the PNG's path, when one was asked for and drawn
    plot_note: str | None = None  # why there is none, when one was asked for
    notes: list[str] = field(default_factory=list)
    root_cause: str | None = None  # one line on what ended a failed run (a hang's culprit and where it stopped)
    seconds: float | None = None  # the run's duration (RunRecord.seconds): so far, while it runs
    trained_seconds: float | None = None  # training time over every attempt (records.metrics.trained_seconds)
    excluded: list[str] = field(default_factory=list)  # hosts left out of an attempt, and why (one line each)
    stragglers: list[str] = field(default_factory=list)  # tasks the others kept waiting for (one line each)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def build_report(run: Run, task: str | None = None, all_tasks: bool = False, plot: bool = False) -> Report:
    """Per-epoch figures of the chief (or ``task``, or every task) and resource use.

    Reading a run never changes its folder: only ``plot=True`` writes ``learning_curves.png`` there.
    """
    metrics = run.metrics()
    chief = run.chief(metrics)
    if task is not None:
        names = [task]
    elif all_tasks:
        names = [n for n in run.task_names() if epoch_records(metrics, n)]
    else:
        names = [chief] if chief else []
    epochs = {name: [_epoch_row(r) for r in epoch_records(metrics, name)] for name in names}
    epochs = {name: rows for name, rows in epochs.items() if rows}
    status = run.status
    if not epochs:
        whose = f"task {task}" if task else "its tasks"
        if status == RunStatus.RUNNING:
            raise NoMetricsError(f"run {run.run_id} is still running and {whose} reported no epoch yet; "
                                 f"watch it with 'tflaunch logs --follow {run.run_id}'")
        cause = cause_line(run)
        cut = ", ".join(f"{name} ({format_size(count)} left out)" for name, count in logs_cut(run))
        raise NoMetricsError(f"run {run.run_id} has no epoch metrics: {whose} printed no TFLAUNCH_METRIC lines "
                             f"and no Keras epoch lines"
                             + (f"; root cause: {cause}" if cause else "")
                             + (f"; logs over their size limit: {cut}" if cut else ""))
    report = Report(run.run_id, str(run.record.source), status, run.record.exit_code,
                    chief, epochs, final_record(run, metrics), run.resources(), root_cause=cause_line(run),
                    seconds=run.record.seconds(time.time() if status is RunStatus.RUNNING else None),
                    trained_seconds=trained_seconds(metrics), excluded=run.record.excluded_lines(),
                    stragglers=[straggler.line() for straggler in run.record.stragglers])
    report.notes += [f"{name} outgrew its size limit: {format_size(count)} ({count:,} bytes) of output left out "
                     f"between its start and its latest output" for name, count in logs_cut(run)]
    if status == RunStatus.RUNNING:
        report.notes.append(f"run {run.run_id} is still running: figures up to epoch "
                            f"{max(r['epoch'] for rows in epochs.values() for r in rows)} so far")
    if plot:
        try:
            report.plot = str(learning_curves(epochs, run.path / LEARNING_CURVES, title=f"{run.run_id} ({report.source})"))
        except ImportError:
            report.plot_note = PLOT_MISSING
    return report


def logs_cut(run: Run) -> list[tuple[str, int]]:
    """(file name, bytes left out) of each log of the run (the tasks' latest, merged.log,
    metrics.jsonl) that outgrew its size limit, as its marker line says."""
    paths = [(f"{name}{TASK_LOG_SUFFIX}", run.folder.latest_task_log(name)) for name in run.task_names()]
    paths += [(path.name, path) for path in (run.folder.merged_path, run.folder.metrics_path)]
    counts = [(name, left_out(path)) for name, path in paths]
    return [(name, count) for name, count in counts if count]


def _epoch_row(record: dict[str, Any]) -> dict[str, Any]:
    row = {key: record.get(key) for key in EPOCH_KEYS}
    row["attempt"] = record.get("attempt")
    row.update((key, value) for key, value in record.items() if key not in row and key not in _NOT_FIGURES
               and (value is None or is_number(value)))
    return row


def _figure(value: Any) -> Any:
    """A figure of any size in a table cell: a learning rate of 1e-05 is not 0.0000."""
    if isinstance(value, float) and value and abs(value) < 1e-3:
        return f"{value:.2e}"
    return value


def report_lines(report: Report) -> list[str]:
    epochs_total = max(len(rows) for rows in report.epochs.values())
    took = f"{' for' if report.status == RunStatus.RUNNING else ' in'} {duration_text(report.seconds)}"
    lines = [f"run {report.run_id} ({report.source}): {status_text(report.status, report.exit_code)}"
             f"{took if report.seconds is not None else ''}, {plural(epochs_total, 'epoch')}"]
    lines += [f"root cause: {report.root_cause}"] if report.root_cause else []
    lines += [f"excluded: {line}" for line in report.excluded]
    lines += [f"straggler: {line}" for line in report.stragglers]
    lines += [f"note: {n}" for n in report.notes]
    for name, rows in report.epochs.items():
        role = " (chief)" if name == report.chief else ""
        lines += ["", f"{name}{role}:"]
        attempts = {r["attempt"] for r in rows}
        headers = ["EPOCH", "LOSS", "ACCURACY", "VAL LOSS", "VAL ACC", "EPOCH S", "SAMPLES/S"]
        body = [[r["epoch"], r["loss"], r["accuracy"], r["val_loss"], r["val_accuracy"], num(r["epoch_seconds"], 3),
                 num(r["samples_per_second"], 1)] for r in rows]
        others = list(dict.fromkeys(key for r in rows for key in r if key not in EPOCH_KEYS and key != "attempt"))
        headers += [key.upper() for key in others]
        body = [row + [_figure(r.get(key)) for key in others] for row, r in zip(body, rows)]
        if len(attempts) > 1:
            headers.append("ATTEMPT")
            body = [row + [r["attempt"]] for row, r in zip(body, rows)]
        lines += table(headers, body, "r" * len(headers))
    final = report.final
    if final:
        trained = f" in {duration_text(report.trained_seconds)}" if report.trained_seconds is not None else ""
        lines += ["", f"final ({final.get('task')}): test accuracy {_cell(final.get('test_accuracy'))}, "
                      f"test loss {_cell(final.get('test_loss'))}, {_epochs(final.get('epochs'))}{trained}"]
        rows = [r for r in report.epochs.get(final.get("task"), []) if r.get("attempt") == final.get("attempt")]
        spent = time_text(final, sum(r["epoch_seconds"] for r in rows if is_number(r.get("epoch_seconds"))))
        if spent:
            lines.append(f"{final.get('task')}'s time: {spent}")
        elif final.get("total_seconds") is not None:  # a figure of the wrong type shows as it is
            lines.append(f"{final.get('task')}'s time since it started: {duration_text(final['total_seconds'])}")
    lines.append("")
    if report.resources:
        lines += [f"resource use per task ({RESOURCES}):", *resources_lines(report.resources)]
    else:
        lines.append(f"resource use: not recorded for this run (no {RESOURCES})")
    if report.plot or report.plot_note:
        lines += ["", f"learning curves: {report.plot}" if report.plot else report.plot_note]
    return lines


def learning_curves(epochs: dict[str, list[dict[str, Any]]], path: Path, title: str = "") -> Path:
    """Two panels, loss and accuracy against epoch, training solid and validation dashed, per task."""
    import matplotlib  # ImportError here means "no plot"; the caller says how to install it

    matplotlib.use("Agg")  # files only: no display is needed, or wanted, on a training host
    import matplotlib.pyplot as plt

    figure, (loss_axes, acc_axes) = plt.subplots(1, 2, figsize=(10, 4), dpi=100)
    try:
        for index, (name, rows) in enumerate(epochs.items()):
            colour = f"C{index % 10}"
            x = [r["epoch"] for r in rows]
            for axes, key in ((loss_axes, "loss"), (acc_axes, "accuracy")):
                for prefix, style in (("", "-"), ("val_", "--")):
                    points = [(e, r[prefix + key]) for e, r in zip(x, rows) if r.get(prefix + key) is not None]
                    if points:
                        axes.plot(*zip(*points), style, marker="o", markersize=3, color=colour,
                                  label=f"{name} {'validation' if prefix else 'training'}")
        for axes, label in ((loss_axes, "loss"), (acc_axes, "accuracy")):
            axes.set_xlabel("epoch")
            axes.set_ylabel(label)
            axes.set_title(label)
            axes.grid(True, alpha=0.3)
            axes.xaxis.get_major_locator().set_params(integer=True)
            if axes.lines:
                axes.legend(fontsize="small")
        if title:
            figure.suptitle(title)
        figure.tight_layout()
        fd, spare = create_beside(Path(path), "tmp")  # a new file, renamed into place: never through a link
        try:
            with open(fd, "wb") as handle:
                figure.savefig(handle, format="png")
            spare.replace(path)
        except BaseException:
            spare.unlink(missing_ok=True)
            raise
    finally:
        plt.close(figure)
    return Path(path)
