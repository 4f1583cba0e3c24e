"""``tflaunch run`` (the default command) and ``tflaunch check``: parse options, call the run layer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from .group import RUN_SOURCES, ClusterCommand, TaskCommand, cli
from .joining import join_options, join_run, joined_source, platform_nodes, ray_source
from .options import ClusterChoice, cluster_options, run_option, run_options

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


@cli.command(help=RUN_HELP, cls=TaskCommand, sources=RUN_SOURCES, choosers=("--local", "-H", "--hosts", "--hostfile", "--slurm", "--nnodes", "--ray"))
@cluster_options(gpus=True, slurm=True)
# The run options' defaults, help and checks are launcher.options.RunOptions'; their flags only parse.
@run_option("log_dir")
@run_option("log_group")
@run_option("threads")
@run_option("grace")
@run_option("log_max_size", show_default=False)
@run_option("tasks")
@run_option("quiet")
@run_option("verbose")
@click.option("--dry-run", is_flag=True, help="Print each task's host, workdir, command and env; start nothing.")
@run_option("no_check")
@run_option("isolate_network")
@run_option("no_seal")
@run_option("max_restarts")
@run_option("restart_delay")
@run_option("min_workers")
@run_option("cooldown")
@run_option("start_timeout")
@run_option("hang_timeout")
@run_option("keepalive_timeout")
@run_option("on_straggler")
@run_option("straggler_timeout")
@run_option("straggler_warm_up")
@run_option("straggler_window")
@run_option("env", "-e")
@run_option("evaluator_timeout")
@run_option("tensorboard")
@run_option("debug")
@click.option("--slurm", is_flag=True,
              help="Inside a Slurm allocation: one task per slot, started with srun (roles: --chief, --ps, --evaluator).")
@click.option("--requeue", is_flag=True,
              help="With --slurm: on SIGUSR1 (Slurm's warning signal) stop the tasks so they save, then requeue the job.")
@click.option("--run-dir", metavar="DIR", hidden=True, help="With --slurm: the run folder 'tflaunch submit' made.")
@join_options
@click.pass_context
def run(ctx: click.Context, choice: ClusterChoice, **options: Any) -> None:
    given = run_options(options, ctx.meta.get("tflaunch.command") or None)  # checked before the cluster is read
    if options["gpus_per_task"] and not options["ray"]:
        from ..errors import OptionsError

        raise OptionsError("--gpus-per-task goes with --ray; elsewhere --gpus LIST names each host's GPUs")
    if not options["ray"]:
        options = platform_nodes(options)
        if options["nnodes"] is not None and options["node_rank"] != 0:
            ctx.exit(join_run(choice, options, given))  # a node that joins a run loads nothing of the run layer
    from ..run.lifecycle.launch import LaunchRequest  # imported here so "tflaunch --help" stays light
    source = ray_source(choice, options, given) if options["ray"] else _source(choice, options)
    request = LaunchRequest(cluster=source.spec, options=given)
    try:
        _run(ctx, request, given, options)
    finally:
        finish = getattr(source, "finish", None)
        if finish is not None:  # nodes that joined: they exit with the run's code
            finish(ctx.meta.get("tflaunch.exit_code", 1))


def _run(ctx: click.Context, request, given, options: dict[str, Any]) -> None:
    if options["dry_run"]:
        ctx.meta["tflaunch.exit_code"] = 0
        from ..run.lifecycle.launch import dry_run as plan_only
        from ..run.lifecycle.summary import describe_plan

        from ..cluster.exposure import exposure_warning

        spec, plan = plan_only(request)
        warning = exposure_warning(spec)
        if warning:
            click.echo(f"tflaunch: {warning}", err=True)
        click.echo("\n".join(describe_plan(spec, plan)))
        return
    from ..run.console.writer import Console
    from ..run.lifecycle.launch import run as run_cluster

    board = None
    if given.tensorboard:
        from ..tensorboard import BesideRun, require

        if options["slurm"]:
            raise click.UsageError("--tensorboard does not apply to --slurm; start 'tflaunch tensorboard RUN' "
                                   "where the run folder is readable")
        require()  # before anything starts: one line naming the extra
    # Colour follows the terminal and NO_COLOR (see Console); the status line shows only on a terminal.
    # Written to a file (slurm-<job>.out), the console keeps its task lines' start and end within --log-max-size.
    console = Console(tasks=given.tasks or None, quiet=given.quiet, verbose=given.verbose,
                      file_limit=given.log_max_size)
    try:
        if options["slurm"]:
            from ..run.lifecycle.slurmjob import run_in_job

            result = run_in_job(request, console, run_dir=options["run_dir"], requeue=options["requeue"])
        else:
            board = BesideRun(console.message) if given.tensorboard else None
            result = run_cluster(request, console, on_folder=lambda folder: board.start(folder.path) if board else None)
        if board is not None:
            board.stop()  # with the run, before the summary
        from ..run.lifecycle.summary import describe_result  # after the run: its modules load while hosts are reached

        console.message("\n".join(describe_result(result)))
    finally:
        if board is not None:
            board.stop()
        console.close()  # writes what is queued; a closed or stalled terminal does not change the exit code
    ctx.meta["tflaunch.exit_code"] = result.exit_code
    ctx.exit(result.exit_code)


def _source(choice: ClusterChoice, options: dict[str, Any]) -> ClusterSource:
    """The cluster source the options name: a Slurm allocation, or what the cluster options name."""
    if options["slurm"]:
        from ..sources.slurm import SlurmSource, spare_count

        if choice.local is not None or choice.gpus or choice.hosts is not None or choice.hostfile is not None:
            raise click.UsageError("--slurm takes its hosts, tasks and GPUs from the allocation; "
                                   "drop --local, -H, --hostfile and --gpus")
        return SlurmSource(chief=choice.chief or None, ps=choice.ps or None, evaluator=choice.evaluator or None,
                           spares=spare_count(choice.spares), cluster_file=choice.cluster)
    if options["requeue"] or options["run_dir"]:
        raise click.UsageError("--requeue and --run-dir only apply to --slurm")
    if options["nnodes"] is not None:
        return joined_source(choice, options)
    return choice.source(runs=True)


@cli.command("check", cls=ClusterCommand, sources=RUN_SOURCES)
@cluster_options(gpus=True)
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.pass_context
def check_command(ctx: click.Context, choice: ClusterChoice, as_json: bool) -> None:
    """Check every host of the cluster in parallel: ssh, python, tensorflow, ports, workdirs, GPUs, and
    whether the hosts' Python, TensorFlow, tf_keras and Keras versions agree."""
    import json
    from dataclasses import asdict

    from ..run.lifecycle.launch import LaunchRequest, check

    report = check(LaunchRequest(cluster=choice.source().spec))
    if as_json:
        click.echo(json.dumps({"ok": report.ok, "items": [asdict(i) for i in report.items]}, indent=2))
    else:
        click.echo("\n".join(report.table()))
        click.echo("all checks passed" if report.ok else f"{len(report.failures)} check(s) failed")
    ctx.exit(0 if report.ok else 1)
