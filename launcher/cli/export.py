"""``tflaunch export``: print a cluster as Kubernetes manifests (JobSet, TFJob, TrainJob) or shell commands."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import ConfigError
from .group import RUN_SOURCES, TaskCommand, cli
from ..options import MAX_RESTARTS
from .options import ClusterChoice, cluster_options, run_option, run_options

EXPORT_HELP = """Print CLUSTER (a cluster YAML file) or --local N as manifests that run the same TensorFlow
cluster elsewhere: a JobSet (default), a Kubeflow TFJob, or a Kubeflow Trainer runtime and
TrainJob to 'kubectl apply -f', or one shell command per task (--format sh). Everything after --
is the command each task runs (default: the file's command, else python -m trainer, tflaunch's
built-in trainer, which the image must then contain).

\b
Examples:
  tflaunch export clusters/kubernetes.yaml > job.yaml
  tflaunch export --local 2 --chief --ps 1 --image registry.example/train:1 -o job.yaml
  tflaunch export --format tfjob --local 4 --image IMAGE -- python train.py --epochs 5
  tflaunch export --format trainjob --local 2 --chief --image IMAGE --env DATA=/data
  tflaunch export --format sh clusters/two_node.yaml
"""


@cli.command("export", cls=TaskCommand, help=EXPORT_HELP, sources=RUN_SOURCES,
             choosers=("--local", "-H", "--hosts", "--hostfile"))
@cluster_options(gpus=False, words={
    "local": "N worker tasks: N worker pods (with --format sh, N commands for this machine).",
    "hosts": "One task per slot of these hosts, e.g. node1:4,node2:4: a pod per task (with --format sh, the "
             "commands to paste on each host)."})
@click.option("--format", "fmt", type=click.Choice(["jobset", "tfjob", "trainjob", "sh"]), default="jobset", show_default=True,
              help="What to print.")
# Not the cluster options' --gpus LIST (GPU indices of this machine): a count, as a pod asks for them.
@click.option("--gpus", "gpus_per_task", type=click.IntRange(min=0), metavar="N",
              help="N GPUs for each chief and worker task: nvidia.com/gpu N per pod, or with --format sh N GPUs of "
                   "its machine (default: the cluster file's gpus, else none: every task on the CPU).")
@click.option("--image", metavar="IMAGE", help="Container image with TensorFlow and the training code "
              "(default: the file's kubernetes.image).")
@click.option("--name", metavar="NAME", help="Name of the job (default: kubernetes.name, else the file's name; for "
              "--local and -H, the command's program and a suffix that differs with the cluster, the command, the "
              "image and --gpus, e.g. trainer-1a2b3).")
@click.option("--namespace", metavar="NS", help="Namespace of the job (default: kubernetes.namespace, else kubectl's).")
# Run options with what they mean in a manifest; RunOptions checks their values.
@run_option("max_restarts",
            help=f"Whole-cluster restarts on failure (default: the file's max_restarts, else {MAX_RESTARTS}).")
@run_option("env", "-e",
            help="Set a variable in every task (repeatable); wins over every 'env' of the cluster file. KEY "
                 "alone, or a KEY whose name marks a secret (TOKEN, SECRET, PASSWORD, API_KEY, ...), is written "
                 "as a reference: a Kubernetes Secret's key (secretKeyRef), or \"$KEY\" in --format sh.")
@click.option("--cluster-runtime", is_flag=True,
              help="With --format trainjob: a cluster-wide ClusterTrainingRuntime instead of a TrainingRuntime.")
@click.option("--supervised", is_flag=True,
              help="With --format jobset: pods that run tflaunch (--nodes-from kubernetes), pod 0 owning the run: "
                   "the merged log, the run record, watchdogs and restarts (the image must hold tflaunch).")
@click.option("-o", "--output", metavar="FILE", help="Write to FILE instead of standard output.")
@click.pass_context
def export_command(ctx: click.Context, choice: ClusterChoice, fmt: str, gpus_per_task: int | None, image: str | None,
                   name: str | None,
                   namespace: str | None, max_restarts: int | None, env: dict[str, str | None],
                   cluster_runtime: bool, supervised: bool, output: str | None) -> None:
    from ..export import ExportRequest, export  # imported here so "tflaunch --help" stays light

    run_options({"max_restarts": max_restarts, "env": env})
    result = export(ExportRequest(source=choice.source(), format=fmt, image=image, name=name, namespace=namespace,
                                  command=ctx.meta.get("tflaunch.command") or None, max_restarts=max_restarts,
                                  env=env, cluster_runtime=cluster_runtime, gpus=gpus_per_task,
                                  supervised=supervised))
    for note in result.notes:
        click.echo(f"tflaunch: note: {note}", err=True)
    if output is None:
        click.echo(result.text, nl=False)
        return
    try:
        Path(output).write_text(result.text)
    except OSError as exc:
        raise ConfigError(output, "", f"cannot write ({exc.strerror or exc})") from None
    click.echo(f"tflaunch: wrote {output}: {result.summary}", err=True)
