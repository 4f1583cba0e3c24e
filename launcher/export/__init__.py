"""``tflaunch export``: a cluster file (or ``--local`` options) as manifests or shell commands.

Four formats, all built from the same plan ``tflaunch run`` uses (:mod:`launcher.cluster.plan`):

- ``jobset``: one JobSet (:mod:`.jobset`), needing only the JobSet controller;
- ``tfjob``: one TFJob (:mod:`.tfjob`) for the Kubeflow training operator;
- ``trainjob``: a Kubeflow Trainer v2 runtime and the TrainJob that runs it (:mod:`.trainjob`);
- ``sh``: one shell command per task (:mod:`.shell`), to paste on each machine.

The manifests share the pods' plan (:mod:`.pods`), one pod template (:mod:`.podspec`) and one YAML
layout (:mod:`.manifest`). Their settings come from the file's ``kubernetes:`` section
(:mod:`.settings`), with ``--image``, ``--name`` and ``--namespace`` winning; ``--env`` wins over
every ``env`` layer, as in a run. A variable passed by name, or whose name marks a secret, is
written as a reference (a Kubernetes Secret's key, or the shell's ``"$KEY"``), never as its value.
What the file says that pods cannot honour comes back as notes, one line each, for the command
line to show.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..cluster.machine import cpu_count, local_host_names
from ..cluster.plan import DEFAULT_COMMAND
from ..cluster.spec import ClusterSpec, EnvLayer, check_launch_input
from ..errors import ConfigError
from ..sources import ClusterSource
from . import jobset as jobset_format
from . import tfjob as tfjob_format
from . import trainjob as trainjob_format
from .manifest import dump_documents
from .pods import plan_pods, secret_note
from .settings import KubernetesSettings, read_settings, with_overrides
from .shell import shell_commands

FORMATS = ("jobset", "tfjob", "trainjob", "sh")
MODULES: dict[str, Any] = {"jobset": jobset_format, "tfjob": tfjob_format, "trainjob": trainjob_format}
DEFAULT_NAME = "tflaunch"
MAX_HOSTNAME = 63  # a pod's hostname is one DNS label


@dataclass(frozen=True)
class ExportRequest:
    source: ClusterSource
    format: str = "jobset"
    image: str | None = None
    name: str | None = None
    namespace: str | None = None
    command: tuple[str, ...] | None = None  # ``-- CMD``; None: the file's command, else the trainer
    max_restarts: int | None = None  # None: the file's max_restarts
    env: EnvLayer = field(default_factory=dict)  # --env KEY=VALUE (None: by name), over every env layer
    cluster_runtime: bool = False  # trainjob: a ClusterTrainingRuntime instead of a namespaced TrainingRuntime


@dataclass(frozen=True)
class Export:
    text: str  # what goes to stdout or the -o file
    notes: tuple[str, ...]  # one line each: what was mapped or left out
    summary: str  # e.g. "JobSet mnist: chief 1, worker 2, ps 1"


def export(request: ExportRequest) -> Export:
    """Read the source, plan it, and render it in ``request.format``."""
    if request.format not in FORMATS:
        raise ConfigError("--format", "", f"expected one of {', '.join(FORMATS)}, got {request.format!r}")
    if request.cluster_runtime and request.format != "trainjob":
        raise ConfigError("--cluster-runtime", "", f"only applies to --format trainjob, got --format {request.format}")
    local_hosts = local_host_names()
    spec = request.source.spec(local_hosts)
    # Values passed by name are not looked up: the target's shell or a Kubernetes Secret holds them.
    check_launch_input(spec, request.env, request.command, environ=None)
    if request.max_restarts is not None:
        spec = replace(spec, max_restarts=request.max_restarts)
    spec = replace(spec, max_restarts=int(spec.max_restarts))  # a plain int: YAML numbers carry their text
    settings = with_overrides(read_settings(spec.kubernetes, spec.source), spec.source, image=request.image,
                              name=request.name, namespace=request.namespace)
    name = settings.name or default_name(request.source.label)
    header = f"# tflaunch export --format {request.format} {request.source.label}"
    if request.format == "sh":
        result = shell_commands(spec, name, local_hosts=local_hosts, cores_by_host={"localhost": cpu_count()},
                                default_python=sys.executable, default_workdir=os.getcwd(), command=request.command,
                                override_env=request.env)
        notes = result.notes + _unused_settings_notes(spec, request)
        return Export(f"{header}\n{result.text}", notes, f"{_role_counts(spec)} as shell commands")
    if not settings.image:
        raise ConfigError(spec.source, "--image", "missing; expected the container image that has TensorFlow and "
                          "the training code (--image IMAGE, or 'image:' in the kubernetes section)")
    module = MODULES[request.format]
    name = _fitting_name(spec, request, settings, name, module)
    plan = plan_pods(spec, settings, name, request.command, lambda role, index: module.pod_host(name, role, index),
                     override_env=request.env)
    if request.format == "tfjob":
        tfjob_format.check_tfjob(plan, spec.source)
        documents, kind = [tfjob_format.tfjob(plan)], "TFJob"
    elif request.format == "trainjob":
        documents = [trainjob_format.runtime(plan, request.cluster_runtime),
                     trainjob_format.trainjob(plan, request.cluster_runtime)]
        kind = f"{trainjob_format.runtime_kind(request.cluster_runtime)} and TrainJob"
        plan = replace(plan, notes=plan.notes + tuple(trainjob_format.trainjob_notes(plan, request.cluster_runtime)))
    else:
        documents, kind = [jobset_format.jobset(plan)], "JobSet"
    notes = plan.notes
    if plan.hidden:  # the Secret goes with the manifests, also into a file written with -o
        header += "\n# " + secret_note(plan)
    if (request.command or spec.command or DEFAULT_COMMAND) == DEFAULT_COMMAND:
        # Said twice: now, and in the manifest, where whoever builds the image reads it.
        notes += (trainer_image_note(settings.image),)
        header += "\n# " + notes[-1]
    return Export(dump_documents(documents, header), notes, f"{kind} {name}: {_role_counts(spec)}")


def trainer_image_note(image: str) -> str:
    """What an image needs to run the built-in trainer, which tflaunch's own package holds."""
    return (f"the task command is tflaunch's built-in trainer (python -m trainer): the image {image} must contain "
            "its 'trainer' package (copy tflaunch's source folder into the image and pip install it there), or "
            "give your own command after '--'")


def default_name(label: str) -> str:
    """A manifest name from the cluster file's name (``clusters/two_node.yaml`` -> ``two-node``)."""
    if not label.endswith((".yaml", ".yml")):
        return DEFAULT_NAME
    name = re.sub(r"[^a-z0-9]+", "-", Path(label).stem.lower())
    name = re.sub(r"^[^a-z]+", "", name).strip("-")
    return name or DEFAULT_NAME


def _fitting_name(spec: ClusterSpec, request: ExportRequest, settings: KubernetesSettings, name: str,
                  module: Any) -> str:
    """``name``, checked (or, when tflaunch chose it, shortened) so that every pod's hostname is one DNS label."""
    longest = max(spec.tasks, key=lambda t: len(module.pod_host("", t.role, t.index).split(".")[0]))
    room = MAX_HOSTNAME - len(module.pod_host("", longest.role, longest.index).split(".")[0])
    if len(name) <= room:
        return name
    if request.name is None and settings.name is None:
        return name[:room].rstrip("-") or DEFAULT_NAME[:room]
    key = "--name" if request.name is not None else "kubernetes.name"
    host = module.pod_host(name, longest.role, longest.index).split(".")[0]
    raise ConfigError(spec.source, key, f"{name!r} makes the pod hostname {host!r} longer than {MAX_HOSTNAME} "
                                        f"characters; expected a name of at most {room}")


def _role_counts(spec: ClusterSpec) -> str:
    counts: dict[str, int] = {}
    for task in spec.tasks:
        counts[task.role] = counts.get(task.role, 0) + 1
    return ", ".join(f"{role} {n}" for role, n in counts.items())


def _unused_settings_notes(spec: ClusterSpec, request: ExportRequest) -> tuple[str, ...]:
    given = [opt for opt, value in (("--image", request.image), ("--name", request.name),
                                    ("--namespace", request.namespace)) if value is not None]
    if spec.kubernetes:
        given.append("the kubernetes section")
    return (f"{', '.join(given)}: not used by --format sh",) if given else ()


__all__ = ["FORMATS", "Export", "ExportRequest", "export", "KubernetesSettings"]
