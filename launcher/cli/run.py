"""``tflaunch run`` (the default command) and ``tflaunch check``: parse options, call the run layer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from .group import cli
from .options import ClusterChoice, cluster_options

if TYPE_CHECKING:
    from ..sources import ClusterSource

RUN_HELP = """Run a TensorFlow cluster: one supervised task per entry of CLUSTER (a cluster YAML file),
--local N workers on this machine, or one task per slot of -H HOST:SLOTS,... or --hostfile FILE.
Everything after -- is the command each task runs (default: python -m trainer); "python" there
means each task's configured interpreter.

\b
Examples:
  tflaunch --local 2
  tflaunch clusters/local_two.yaml
  tflaunch -H node1:4,node2:4 --chief
  tflaunch --local 2 -- python my_train.py --lr 0.1
  tflaunch --local 2 --chief --ps 1 --dry-run
  tflaunch --local 2 --env WANDB_API_KEY -- python my_train.py
"""


def _parse_env(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, str | None]:
    """``--env``'s items as a mapping; :func:`launcher.cluster.fields.env_items` owns their syntax."""
    from ..cluster.fields import env_items

    try:
        return env_items(values)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


ENV_HELP = ("Set a variable in every task (repeatable): KEY=VALUE, or KEY alone to pass tflaunch's own KEY by "
            "name, its value on no command line and in no file. Wins over every 'env' of the cluster file. "
            "Values of variables passed by name, or whose name contains TOKEN, SECRET, PASSWORD, API_KEY and "
            "the like, are shown and recorded as <hidden>.")


def _parse_names(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[str, ...]:
    return tuple(name.strip() for name in (value or "").split(",") if name.strip())


def _parse_threads(ctx: click.Context, param: click.Parameter, value: str | None) -> int | str | None:
    if value is None or value in ("auto", "off"):
        return value
    if value.isdigit() and int(value) >= 1:
        return int(value)
    raise click.BadParameter(f"expected 'auto', 'off' or a thread count >= 1, got {value!r}")


@cli.command(help=RUN_HELP)
@cluster_options(gpus=True)
@click.option("--log-dir", metavar="DIR", help="Where run folders go (default: the file's log_dir, else ./logs).")
@click.option("--threads", callback=_parse_threads, metavar="N|auto|off",
              help="Thread limit per task (default auto: cores shared among a host's tasks).")
@click.option("--grace", type=click.FloatRange(min=0), default=5.0, show_default=True,
              help="Seconds between SIGTERM and SIGKILL when stopping tasks.")
@click.option("--tasks", "show_tasks", callback=_parse_names, metavar="NAMES",
              help="Show only these tasks on the console, e.g. worker-0,chief-0.")
@click.option("--quiet", is_flag=True, help="Show only tflaunch's own messages on the console.")
@click.option("--verbose", is_flag=True,
              help="Show every task line as written: TensorFlow's start-up chatter and raw metric lines too.")
@click.option("--dry-run", is_flag=True, help="Print each task's host, workdir, command and env; start nothing.")
@click.option("--no-check", is_flag=True, help="Skip the host checks that run before launching on remote hosts.")
@click.option("--isolate-network", is_flag=True,
              help="Run every task in one network namespace of its own: they reach each other on loopback, "
                   "nothing outside reaches them, and they have no outside network (tasks on this machine only).")
@click.option("--max-restarts", type=click.IntRange(min=0), metavar="N",
              help="Restart the whole cluster up to N times when a task fails (default: the file's max_restarts, else 0).")
@click.option("--restart-delay", type=click.FloatRange(min=0), metavar="S",
              help="Seconds to wait before a restart (default: the file's restart_delay, else 1).")
@click.option("--start-timeout", type=click.FloatRange(min=0, min_open=True), metavar="S",
              help="Fail the attempt when some training task reports no progress (metric line) within S seconds.")
@click.option("--hang-timeout", type=click.FloatRange(min=0, min_open=True), metavar="S",
              help="When no chief or worker makes progress for S seconds (no new metric line, under 10% of a core; "
                   "output does not count): sample every task's stacks, name the task that differs, fail the attempt.")
@click.option("-e", "--env", "env", multiple=True, callback=_parse_env, metavar="KEY[=VALUE]", help=ENV_HELP)
@click.option("--evaluator-timeout", type=click.FloatRange(min=0), default=300.0, show_default=True, metavar="S",
              help="After training succeeds, seconds a running evaluator may take to finish its last "
                   "evaluation before it is stopped.")
@click.option("--tensorboard", is_flag=True,
              help="Start TensorBoard on the run's folder beside the run (127.0.0.1, from port 6006 up) and stop "
                   "it with the run (needs the 'tensorboard' extra).")
@click.option("--slurm", is_flag=True,
              help="Inside a Slurm allocation: one task per slot, started with srun (roles: --chief, --ps, --evaluator).")
@click.option("--requeue", is_flag=True,
              help="With --slurm: on SIGUSR1 (Slurm's warning signal) stop the tasks so they save, then requeue the job.")
@click.option("--run-dir", metavar="DIR", hidden=True, help="With --slurm: the run folder 'tflaunch submit' made.")
@click.pass_context
def run(ctx: click.Context, choice: ClusterChoice, **options: Any) -> None:
    from ..run.launch import LaunchRequest  # imported here so "tflaunch --help" stays light
    from ..run.watchdog import WatchdogSettings

    source = _source(choice, options)
    request = LaunchRequest(cluster=source.spec, command=ctx.meta.get("tflaunch.command") or None,
                            log_dir=options["log_dir"], threads=options["threads"], grace=options["grace"],
                            preflight=not options["no_check"] and not options["slurm"],
                            max_restarts=options["max_restarts"],
                            restart_delay=options["restart_delay"], show_tasks=options["show_tasks"],
                            evaluator_timeout=options["evaluator_timeout"], env=options["env"],
                            isolate_network=options["isolate_network"],
                            watchdog=WatchdogSettings(start_timeout=options["start_timeout"],
                                                      hang_timeout=options["hang_timeout"]))
    if options["dry_run"]:
        from ..run.launch import dry_run as plan_only
        from ..run.summary import describe_plan

        from ..cluster.exposure import exposure_warning

        spec, plan = plan_only(request)
        warning = exposure_warning(spec)
        if warning:
            click.echo(f"tflaunch: {warning}", err=True)
        click.echo("\n".join(describe_plan(spec, plan)))
        return
    from ..run.console import Console
    from ..run.launch import run as run_cluster
    from ..run.summary import describe_result

    board = None
    if options["tensorboard"]:
        from ..tensorboard import BesideRun, require

        if options["slurm"]:
            raise click.UsageError("--tensorboard does not apply to --slurm; start 'tflaunch tensorboard RUN' "
                                   "where the run folder is readable")
        require()  # before anything starts: one line naming the extra
    # Colour follows the terminal and NO_COLOR (see Console); the status line shows only on a terminal.
    console = Console(tasks=options["show_tasks"] or None, quiet=options["quiet"], verbose=options["verbose"])
    try:
        if options["slurm"]:
            from ..run.slurmjob import run_in_job

            result = run_in_job(request, console, run_dir=options["run_dir"], requeue=options["requeue"])
        else:
            board = BesideRun(console.message) if options["tensorboard"] else None
            result = run_cluster(request, console, on_folder=lambda folder: board.start(folder.path) if board else None)
        if board is not None:
            board.stop()  # with the run, before the summary
        console.message("\n".join(describe_result(result)))
    finally:
        if board is not None:
            board.stop()
        console.close()  # writes what is queued; a closed or stalled terminal does not change the exit code
    ctx.exit(result.exit_code)


def _source(choice: ClusterChoice, options: dict[str, Any]) -> ClusterSource:
    """The cluster source the options name: a Slurm allocation, or what the cluster options name."""
    if options["slurm"]:
        from ..sources.slurm import SlurmSource

        if choice.local is not None or choice.gpus or choice.hosts is not None or choice.hostfile is not None:
            raise click.UsageError("--slurm takes its hosts, tasks and GPUs from the allocation; "
                                   "drop --local, -H, --hostfile and --gpus")
        return SlurmSource(chief=choice.chief or None, ps=choice.ps or None, evaluator=choice.evaluator or None,
                           cluster_file=choice.cluster)
    if options["requeue"] or options["run_dir"]:
        raise click.UsageError("--requeue and --run-dir only apply to --slurm")
    return choice.source()


@cli.command("check")
@cluster_options(gpus=True)
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.pass_context
def check_command(ctx: click.Context, choice: ClusterChoice, as_json: bool) -> None:
    """Check every host of the cluster in parallel: ssh, python, tensorflow, ports, workdirs, GPUs."""
    import json
    from dataclasses import asdict

    from ..run.launch import LaunchRequest, check

    report = check(LaunchRequest(cluster=choice.source().spec))
    if as_json:
        click.echo(json.dumps({"ok": report.ok, "items": [asdict(i) for i in report.items]}, indent=2))
    else:
        click.echo("\n".join(report.table()))
        click.echo("all checks passed" if report.ok else f"{len(report.failures)} check(s) failed")
    ctx.exit(0 if report.ok else 1)
