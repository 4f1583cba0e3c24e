"""``tflaunch export``: a cluster file (or ``--local`` options) as manifests or shell commands.

Four formats, all built from the same plan ``tflaunch run`` uses (:mod:`launcher.cluster.plan`):

- ``jobset``: one JobSet (:mod:`.jobset`), needing only the JobSet controller; with ``--supervised``
  its pods run tflaunch itself, pod 0 owning the run (:mod:`.supervised`);
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

import hashlib
import re
import shlex
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..cluster.machine import cpu_count, local_host_names
from ..cluster.plan import DEFAULT_COMMAND
from ..cluster.ranks import TRAINING_ROLES
from ..cluster.spec import ClusterSpec, EnvLayer, check_launch_input, is_local
from ..errors import ConfigError
from ..sources import ClusterSource
from . import jobset as jobset_format
from . import supervised as supervised_format
from . import tfjob as tfjob_format
from . import trainjob as trainjob_format
from .manifest import comment, dump_documents
from .pods import plan_pods, secret_note
from .settings import GPU_RESOURCE, KubernetesSettings, read_settings, with_overrides
from .shell import shell_commands

FORMATS = ("jobset", "tfjob", "trainjob", "sh")
MODULES: dict[str, Any] = {"jobset": jobset_format, "tfjob": tfjob_format, "trainjob": trainjob_format}
DEFAULT_NAME = "tflaunch"
MAX_HOSTNAME = 63  # a pod's hostname is one DNS label
SUFFIX_LENGTH = 5  # hex digits of the default name's suffix: "trainer-1a2b3"


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
    gpus: int | None = None  # GPUs for each chief and worker task; None: the file's gpus, else none
    supervised: bool = False  # jobset: pods that run tflaunch (--nodes-from kubernetes), pod 0 the owner


@dataclass(frozen=True)
class Export:
    text: str  # what goes to stdout or the -o file
    notes: tuple[str, ...]  # one line each: what was mapped or left out
    summary: str  # e.g. "JobSet mnist: chief 1, worker 2, ps 1"


def export(request: ExportRequest) -> Export:
    """Read the source, plan it, and render it in ``request.format``."""
    if request.format not in FORMATS:
        raise ConfigError("--format", "", f"expected one of {', '.join(FORMATS)}, got {request.format!r}")
    if request.supervised and request.format != "jobset":
        raise ConfigError("--supervised", "", f"only applies to --format jobset, got --format {request.format}")
    if request.cluster_runtime and request.format != "trainjob":
        raise ConfigError("--cluster-runtime", "", f"only applies to --format trainjob, got --format {request.format}")
    local_hosts = local_host_names()
    spec = request.source.spec(local_hosts)
    # Values passed by name are not looked up: the target's shell or a Kubernetes Secret holds them.
    check_launch_input(spec, request.env, request.command, environ=None)
    if request.max_restarts is not None:
        spec = replace(spec, max_restarts=request.max_restarts)
    spec = replace(spec, max_restarts=int(spec.max_restarts))  # a plain int: YAML numbers carry their text
    if request.gpus is not None:
        spec = with_gpus(spec, request.gpus, local_hosts)
    settings = with_overrides(read_settings(spec.kubernetes, spec.source), spec.source, image=request.image,
                              name=request.name, namespace=request.namespace)
    command = request.command or spec.command or DEFAULT_COMMAND
    name = settings.name or default_name(request.source.label, command, (settings.image or "", request.gpus))
    header = comment(f"tflaunch export --format {request.format} {request.source.label}")
    gpu_notes = (cpu_note(request.format),) if all(t.gpus == () for t in spec.tasks) else ()
    if request.format == "sh":
        result = shell_commands(spec, name, local_hosts=local_hosts, cores_by_host={"localhost": cpu_count()},
                                command=request.command, override_env=request.env)
        notes = result.notes + _unused_settings_notes(spec, request) + gpu_notes
        return Export(f"{header}\n{result.text}", notes, f"{_role_counts(spec)} as shell commands")
    if not settings.image:
        raise ConfigError(spec.source, "--image", "missing; expected the container image that has TensorFlow and "
                          "the training code (--image IMAGE, or 'image:' in the kubernetes section)")
    module = supervised_format if request.supervised else MODULES[request.format]
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
    elif request.supervised:
        documents, kind = [supervised_format.supervised_jobset(plan)], "JobSet (supervised by tflaunch)"
        plan = replace(plan, notes=plan.notes + tuple(supervised_format.supervised_notes(plan)))
    else:
        documents, kind = [jobset_format.jobset(plan)], "JobSet"
    notes = plan.notes + gpu_notes
    if plan.hidden:  # the Secret goes with the manifests, also into a file written with -o
        header += "\n" + comment(secret_note(plan))
    if command == DEFAULT_COMMAND:
        # Said twice: now, and in the manifest, where whoever builds the image reads it.
        notes += (trainer_image_note(settings.image),)
        header += "\n" + comment(notes[-1])
    return Export(dump_documents(documents, header), notes, f"{kind} {name}: {_role_counts(spec)}")


def with_gpus(spec: ClusterSpec, count: int, local_hosts: frozenset[str]) -> ClusterSpec:
    """``spec`` with ``count`` GPUs for each chief and worker task (``--gpus N``), instead of the file's:
    GPUs of their own, numbered on from 0 on each machine (a pod's are its own, numbered from 0 anyway).
    ps and evaluator tasks keep theirs, as ``tflaunch run --gpus`` deals GPUs to the chief and workers only."""
    dealt: Counter[str] = Counter()
    tasks = []
    for task in spec.tasks:
        if task.role in TRAINING_ROLES:
            machine = "localhost" if is_local(task.host, local_hosts) else task.host
            task = replace(task, gpus=tuple(range(dealt[machine], dealt[machine] + count)))
            dealt[machine] += count
        tasks.append(task)
    return replace(spec, tasks=tuple(tasks), share_gpus=False)


def cpu_note(fmt: str) -> str:
    """What a cluster without a GPU does, and how to give it some: said every time, a run on the CPU is
    otherwise only noticed by its speed."""
    given = "each chief and worker N GPUs of its machine" if fmt == "sh" else \
        f"each chief and worker pod N GPUs ({GPU_RESOURCE})"
    return f"gpus: none asked for, so every task trains on the CPU (CUDA_VISIBLE_DEVICES=-1); --gpus N gives {given}"


def trainer_image_note(image: str) -> str:
    """What an image needs to run the built-in trainer, which tflaunch's own package holds."""
    return (f"the task command is tflaunch's built-in trainer (python -m trainer): the image {image} must contain "
            "its 'trainer' package (copy tflaunch's source folder into the image and pip install it there), or "
            "give your own command after '--'")


def default_name(label: str, command: tuple[str, ...] = DEFAULT_COMMAND, more: tuple[Any, ...] = ()) -> str:
    """A job name when none is given: the cluster file's name (``clusters/two_node.yaml`` ->
    ``two-node``); for a cluster of options (``--local``, ``-H``), the program the command runs and a
    short suffix from the options, the command and ``more`` (the image, the GPUs), so that two
    different exports never share a name and the same export always gets the same one
    (``--local 2 -- python train.py`` -> ``train-`` and 5 hex digits)."""
    if label.endswith((".yaml", ".yml")):
        return _label(Path(label).stem) or DEFAULT_NAME
    digest = hashlib.sha256("\0".join([label, shlex.join(command), *map(str, more)]).encode()).hexdigest()
    return f"{_label(_program(command))[:MAX_HOSTNAME // 2].rstrip('-') or DEFAULT_NAME}-{digest[:SUFFIX_LENGTH]}"


def _label(text: str) -> str:
    """``text`` as a DNS label's letters: lowercase letters, digits and '-', starting with a letter."""
    name = re.sub(r"[^a-z0-9]+", "-", text.lower())
    return re.sub(r"^[^a-z]+", "", name).strip("-")


def _program(command: tuple[str, ...]) -> str:
    """The program a command runs: the module after ``python -m``, the script after ``python``, else its first word."""
    words = list(command)
    if words and Path(words[0]).name.startswith("python"):
        words = words[1:]
        while words and words[0].startswith("-") and words[0] != "-m":
            words = words[1:]  # the interpreter's own options (-u, -O)
        if words[:1] == ["-m"]:
            return words[1].rpartition(".")[2] if len(words) > 1 else ""
    return Path(words[0]).stem if words else ""


def _fitting_name(spec: ClusterSpec, request: ExportRequest, settings: KubernetesSettings, name: str,
                  module: Any) -> str:
    """``name``, checked (or, when tflaunch chose it, shortened) so that every pod's hostname is one DNS label."""
    longest = max(spec.tasks, key=lambda t: len(module.pod_host("", t.role, t.index).split(".")[0]))
    room = MAX_HOSTNAME - len(module.pod_host("", longest.role, longest.index).split(".")[0])
    if len(name) <= room:
        return name
    if request.name is None and settings.name is None:
        if not request.source.label.endswith((".yaml", ".yml")):  # keep the suffix that tells exports apart
            base, _, suffix = name.rpartition("-")
            return f"{base[:room - len(suffix) - 1].rstrip('-') or DEFAULT_NAME[0]}-{suffix}"
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
