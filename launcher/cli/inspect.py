"""Command line of the inspection commands: ``runs``, ``logs``, ``status``, ``report``, ``compare``, ``stacks``.

They read run folders that ``tflaunch`` runs left in the log directory (see :mod:`launcher.inspect.runs`)
and print what :mod:`launcher.inspect.report` makes of them. The library is imported inside each command
so that ``tflaunch --help`` stays light.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from typing import TypeVar

import click

from ..inspect.runs import RUN_FORMS
from ..records.control import escaped
from ..records.folder import DEFAULT_LOG_DIR, LEARNING_CURVES
from ..records.states import RunStatus
from .group import cli

RUN_ARG_HELP = f"RUN is {RUN_FORMS}."
# compare names every run it compares: no RUN stands for the latest there.
COMPARE_FORMS = RUN_FORMS.replace(" (the default)", "")
T = TypeVar("T")

log_dir_option = click.option("--log-dir", default=DEFAULT_LOG_DIR, show_default=True, metavar="DIR",
                              help="The directory holding the run folders.")
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts instead of a table.")


def _show(as_json: bool, found: T, as_data: Callable[[T], object], as_lines: Callable[[T], list[str]]) -> None:
    """What a command found: as JSON for scripts (--json), else as the lines people read, with the
    control characters of what tasks wrote into them (names, metric keys, output) escaped."""
    click.echo(json.dumps(as_data(found), indent=2, default=str) if as_json
               else "\n".join(escaped(line) for line in as_lines(found)))


def _regex(ctx: click.Context, param: click.Parameter, value: str | None) -> re.Pattern[str] | None:
    if value is None:
        return None
    try:
        return re.compile(value)
    except re.error as exc:
        raise click.BadParameter(f"not a valid regular expression: {exc}") from None


@cli.command("runs")
@log_dir_option
@click.option("--last", type=click.IntRange(min=1), metavar="N", help="Show only the N newest runs.")
@json_option
def runs_command(log_dir: str, last: int | None, as_json: bool) -> None:
    """List the runs in the log directory, newest first."""
    from dataclasses import asdict

    from ..inspect.report import runs_lines
    from ..inspect.runs import find_runs, summarize
    from ..slurm.job import job_status

    # No log directory yet is no run yet: the first run makes it (other commands, which need a run, refuse).
    runs = find_runs(log_dir)[:last] if os.path.lexists(log_dir) else []
    summaries = [summarize(run, job_state=job_status) for run in runs]
    if summaries or as_json:
        _show(as_json, summaries, lambda found: [asdict(s) for s in found], runs_lines)
    else:
        click.echo(f"no runs in {log_dir.rstrip('/')}/ yet", err=True)


@cli.command("logs", epilog=RUN_ARG_HELP)
@click.argument("run_ref", required=False, metavar="[RUN]")
@click.option("--task", metavar="NAME", help="Show this task's own output instead of the merged log.")
@click.option("--attempt", type=click.IntRange(min=1), metavar="K", help="Only attempt K (default: all lines of "
              "the merged log; a task's latest attempt).")
@click.option("--grep", "pattern", callback=_regex, metavar="RE",
              help="Only lines matching this regular expression, as the log holds them or as the console "
                   "showed them (a metric line as its epoch line).")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines until the run ends.")
@log_dir_option
def logs_command(run_ref: str | None, task: str | None, attempt: int | None, pattern: re.Pattern[str] | None,
                 follow: bool, log_dir: str) -> None:
    """Show a run's merged log, or one task's output."""
    from ..inspect.runlogs import LogQuery, follow_log, read_log
    from ..inspect.runs import resolve_run

    run = resolve_run(log_dir, run_ref)
    query = LogQuery(task=task, attempt=attempt, pattern=pattern)
    for line in (follow_log if follow else read_log)(run, query):
        click.echo(escaped(line, colours=True))  # a task's output is shown, never obeyed
    if follow and run.reload().status is RunStatus.LAUNCHER_LOST:
        click.echo(f"tflaunch: run {run.run_id}: launcher lost (its process is gone); stopped following", err=True)


@cli.command("status", epilog=RUN_ARG_HELP)
@click.argument("run_ref", required=False, metavar="[RUN]")
@log_dir_option
@json_option
def status_command(run_ref: str | None, log_dir: str, as_json: bool) -> None:
    """Each task's state, pid, host, uptime, last metric, and CPU% and memory of local tasks."""
    from dataclasses import asdict

    from ..inspect.report import status_lines
    from ..inspect.runs import resolve_run
    from ..inspect.status import run_status
    from ..run.output.resources import measure_tasks

    status = run_status(resolve_run(log_dir, run_ref), measure=measure_tasks)
    _show(as_json, status, asdict, status_lines)


@cli.command("report", epilog=RUN_ARG_HELP)
@click.argument("run_ref", required=False, metavar="[RUN]")
@click.option("--task", metavar="NAME", help="Figures of this task (default: the chief, or worker-0).")
@click.option("--all", "all_tasks", is_flag=True, help="Figures of every task that reported epochs.")
@click.option("--plot/--no-plot", default=False,
              help=f"Also draw the learning curves into {LEARNING_CURVES} in the run folder (needs matplotlib; "
                   "default: no plot).")
@log_dir_option
@json_option
def report_command(run_ref: str | None, task: str | None, all_tasks: bool, plot: bool, log_dir: str,
                   as_json: bool) -> None:
    """Per-epoch table and resource use per task. Reads the run folder; only --plot writes into it."""
    from ..inspect.report import build_report, report_lines
    from ..inspect.runs import resolve_run

    if task and all_tasks:
        raise click.UsageError("give either --task NAME or --all")
    if plot and as_json:
        raise click.UsageError("--json only prints; draw the learning curves with a separate 'report --plot'")
    run = resolve_run(log_dir, run_ref)
    if task is not None:
        run.require_task(task)
    report = build_report(run, task=task, all_tasks=all_tasks, plot=plot)
    _show(as_json, report, lambda found: found.to_json(), report_lines)


@cli.command("compare", epilog=f"Each RUN is {COMPARE_FORMS}.")
@click.argument("run_refs", nargs=-1, required=True, metavar="RUN RUN...")
@log_dir_option
@json_option
def compare_command(run_refs: tuple[str, ...], log_dir: str, as_json: bool) -> None:
    """Compare runs: workers, global batch, epoch and step time, samples/s, accuracy, speedup vs the first."""
    from ..inspect.compare import compare_json, compare_lines, compare_runs
    from ..inspect.runs import resolve_runs

    if len(run_refs) < 2:
        raise click.UsageError("compare needs at least two runs: the first is the baseline")
    rows = compare_runs(resolve_runs(log_dir, list(run_refs)))
    _show(as_json, rows, compare_json, compare_lines)


@cli.command("stacks", epilog=RUN_ARG_HELP)
@click.argument("run_ref", required=False, metavar="[RUN]")
@log_dir_option
@json_option
def stacks_command(run_ref: str | None, log_dir: str, as_json: bool) -> None:
    """Every task's Python stacks of a running run, now, and which task differs from the rest.

    Asks the run's tflaunch (on this machine, as the user who started it); the run goes on.
    """
    from ..inspect.runs import resolve_run
    from ..inspect.stacks import live_stacks, stacks_lines

    answer = live_stacks(resolve_run(log_dir, run_ref))
    _show(as_json, answer, lambda found: found, stacks_lines)
