"""``tflaunch submit``: write a commented sbatch script into a new run folder and submit it to Slurm."""

from __future__ import annotations

import sys
from typing import Any

import click

from ..records.folder import SBATCH_SCRIPT
from .group import TaskCommand, cli
from .options import run_option, run_options

SUBMIT_HELP = f"""Submit a TensorFlow cluster to Slurm: (CLUSTER.yaml with a 'slurm:' section | --nodes N).

Writes {SBATCH_SCRIPT} (every #SBATCH line commented) into a new run folder, submits it with sbatch and
prints the job id and the run folder. Inside the job, 'tflaunch --slurm' starts one srun step whose
agent on each node starts that node's tasks, and supervises them; runs, logs, status and report read the folder as for any run.
Everything after -- is the command each task runs (default: python -m trainer).

\b
Examples:
  tflaunch submit --nodes 2 --wait
  tflaunch submit --nodes 2 --ntasks-per-node 2 --chief --ps 1 --time 1:00:00
  tflaunch submit clusters/slurm.yaml --requeue -- python my_train.py
"""


@cli.command("submit", cls=TaskCommand, help=SUBMIT_HELP, sources="(CLUSTER.yaml | --nodes N)", choosers=("--nodes",))
@click.argument("cluster", required=False, metavar="CLUSTER.yaml")
@click.option("--nodes", type=click.IntRange(min=1), metavar="N", help="Nodes to allocate.")
@click.option("--ntasks-per-node", type=click.IntRange(min=1), metavar="K", help="Task slots per node (default 1).")
@click.option("--chief", is_flag=True, help="The first slot runs a chief.")
@click.option("--ps", type=click.IntRange(min=0), metavar="K", help="The next K slots run ps tasks (implies --chief).")
@click.option("--evaluator", is_flag=True, help="The last slot runs an evaluator.")
@click.option("--spares", type=click.IntRange(min=1), metavar="K",
              help="Ask for K more nodes and hold them back as spares: a failed node's tasks move to one at the "
                   "next restart (with --max-restarts); the job is submitted with --no-kill, so a failed node does "
                   "not end it.")
@click.option("--partition", metavar="P", help="Slurm partition.")
@click.option("--time", "time_limit", metavar="T", help="Time limit, in Slurm's syntax (e.g. 1:00:00).")
@click.option("--gpus-per-task", type=click.IntRange(min=1), metavar="G", help="GPUs Slurm binds to each task.")
@click.option("--account", metavar="A", help="Slurm account.")
@click.option("--sbatch-option", "sbatch_options", multiple=True, metavar="OPT",
              help="An extra sbatch option such as --qos=high (repeatable).")
@click.option("--requeue", is_flag=True, help="Before the time limit or at preemption (USR1), save and requeue the job.")
@click.option("--warning-seconds", type=click.IntRange(min=1), metavar="S",
              help="With --requeue: how long before the end Slurm warns tflaunch (default 120).")
# The run options the job's 'tflaunch --slurm' is given: none unless given here (its own defaults apply).
@run_option("max_restarts")
@run_option("restart_delay")
@run_option("grace", default=None, show_default=False)
@run_option("keepalive_timeout")
@run_option("log_dir")
@run_option("log_group")
@run_option("env", "-e",
            help="Set a variable in every task (repeatable): KEY=VALUE, written into the script, or KEY alone to "
                 "pass this environment's KEY by name: sbatch passes its value on, and the script holds only the "
                 "name. A KEY whose name marks a secret (TOKEN, SECRET, PASSWORD, API_KEY, ...) must be passed by "
                 "name.")
@click.option("--wait", is_flag=True, help="Block until the job ends; exit with the cluster's exit code.")
@click.option("--dry-run", is_flag=True, help="Print the sbatch script; submit nothing.")
@click.pass_context
def submit_command(ctx: click.Context, cluster: str | None, **options: Any) -> None:
    from ..slurm.submit import SubmitOptions, dry_run, submit

    bad = [o for o in options["sbatch_options"] if not o.startswith("-")]
    if bad:
        raise click.BadParameter(f"expected an sbatch option such as --qos=high, got {bad[0]!r}",
                                 param_hint="'--sbatch-option'")
    # Checked here, so that a bad value fails now rather than in the job.
    run_options({option: value for option, value in options.items() if value is not None})
    passed: list[str] = []
    if options["max_restarts"] is not None:
        passed += ["--max-restarts", str(options["max_restarts"])]
    if options["restart_delay"] is not None:
        passed += ["--restart-delay", f"{options['restart_delay']:g}"]
    if options["grace"] is not None:
        passed += ["--grace", f"{options['grace']:g}"]
    if options["keepalive_timeout"] is not None:
        passed += ["--keepalive-timeout", f"{options['keepalive_timeout']:g}"]
    overrides = {"nodes": options["nodes"], "ntasks_per_node": options["ntasks_per_node"], "chief": options["chief"],
                 "ps": options["ps"], "evaluator": options["evaluator"], "spares": options["spares"],
                 "partition": options["partition"],
                 "time": options["time_limit"], "gpus_per_task": options["gpus_per_task"],
                 "account": options["account"], "sbatch_options": tuple(options["sbatch_options"]),
                 "requeue": options["requeue"], "warning_seconds": options["warning_seconds"]}
    request = SubmitOptions(cluster_file=cluster, overrides=overrides, command=ctx.meta.get("tflaunch.command") or (),
                            run_options=tuple(passed), log_dir=options["log_dir"],
                            log_group=options["log_group"], argv=("tflaunch", *sys.argv[1:]), env=options["env"])
    if options["dry_run"]:
        click.echo(dry_run(request), nl=False)
        return

    def submitted(job) -> None:
        click.echo(f"submitted job {job.job_id}; run folder {job.run_dir}", err=False)
        sys.stdout.flush()

    ctx.exit(submit(request, options["wait"], submitted))
