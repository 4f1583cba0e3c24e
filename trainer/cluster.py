"""Where this process sits in the cluster: TF_CONFIG parsing, the chief rule,
the metric task label, the choice of strategy and whether the chosen Keras can run it.

Everything here is a pure function of the environment mapping (no TensorFlow),
so it is unit-tested without starting processes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Mapping

TRAINING_TYPES = ("chief", "worker")
KNOWN_TYPES = ("chief", "worker", "ps", "evaluator")
# Strategies that run in one process (several GPUs at most), so never with other training tasks.
SINGLE_PROCESS = ("mirrored", "central_storage", "default")
LEGACY_KERAS_ENV = "TF_USE_LEGACY_KERAS"
TASK_ENV = "TFLAUNCH_TASK"  # set by the launcher (launcher/taskenv.py holds its copy of the name)


class ClusterError(Exception):
    """TF_CONFIG is malformed or describes a cluster the trainer cannot run."""


@dataclass(frozen=True)
class TaskInfo:
    """This process's task, from TF_CONFIG; task_type None means no TF_CONFIG (a lone process)."""

    cluster: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    task_type: str | None = None
    task_index: int = 0

    @property
    def is_evaluator(self) -> bool:
        return self.task_type == "evaluator"

    @property
    def training_cluster(self) -> dict[str, tuple[str, ...]]:
        """The cluster without the evaluator, which trains nothing and runs no server.

        A ParameterServerStrategy chief given an evaluator in its cluster waits for it
        forever (TensorFlow issue 46169); some launchers still put it there.
        """
        return {kind: addresses for kind, addresses in self.cluster.items() if kind != "evaluator"}

    @property
    def has_ps(self) -> bool:
        return bool(self.cluster.get("ps"))

    @property
    def num_training_tasks(self) -> int:
        """Tasks that run the training program together (chief and workers)."""
        return sum(len(self.cluster.get(kind, ())) for kind in TRAINING_TYPES)

    @property
    def num_workers(self) -> int:
        """Tasks that take training steps: the workers under a ps cluster's chief, else the
        chief and workers (1 for a lone process)."""
        if self.has_ps:
            return len(self.cluster.get("worker", ()))
        return max(1, self.num_training_tasks)

    @property
    def is_chief(self) -> bool:
        """The chief task, else worker 0 when there is no chief, else the lone process."""
        if self.task_type is None:
            return True
        if self.task_type == "chief":
            return True
        return self.task_type == "worker" and self.task_index == 0 and not self.cluster.get("chief")

    @property
    def name(self) -> str:
        return f"{self.task_type}-{self.task_index}" if self.task_type else "local"


def read_tf_config(environ: Mapping[str, str]) -> TaskInfo:
    """Parse TF_CONFIG from environ; an unset or empty TF_CONFIG means a lone process."""
    raw = environ.get("TF_CONFIG", "").strip()
    if not raw:
        return TaskInfo()
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ClusterError(f"TF_CONFIG: not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise ClusterError("TF_CONFIG: expected a JSON object")
    cluster = config.get("cluster") or {}
    task = config.get("task") or {}
    if not isinstance(cluster, dict) or not isinstance(task, dict):
        raise ClusterError("TF_CONFIG: 'cluster' and 'task' must be objects")
    parsed: dict[str, tuple[str, ...]] = {}
    for kind, addresses in cluster.items():
        if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
            raise ClusterError(f"TF_CONFIG: cluster.{kind}: expected a list of host:port strings")
        parsed[kind] = tuple(addresses)
    if not parsed:
        return TaskInfo()
    task_type = task.get("type")
    task_index = task.get("index", 0)
    if task_type not in KNOWN_TYPES:
        raise ClusterError(f"TF_CONFIG: task.type: expected one of {', '.join(KNOWN_TYPES)}, got {task_type!r}")
    if not isinstance(task_index, int) or isinstance(task_index, bool):
        raise ClusterError(f"TF_CONFIG: task.index: expected an integer, got {task_index!r}")
    if not 0 <= task_index < len(parsed.get(task_type, ())):
        raise ClusterError(
            f"TF_CONFIG: task {task_type}-{task_index} is not in cluster.{task_type} "
            f"({len(parsed.get(task_type, ()))} entries)"
        )
    unknown = sorted(set(parsed) - set(KNOWN_TYPES))
    if unknown:
        raise ClusterError(f"TF_CONFIG: cluster.{unknown[0]}: task type not supported by the trainer")
    return TaskInfo(cluster=parsed, task_type=task_type, task_index=task_index)


def task_label(environ: Mapping[str, str], task: TaskInfo) -> str:
    """The `task` field of metric lines: $TFLAUNCH_TASK, else type-index, else local."""
    return environ.get(TASK_ENV) or task.name


def choose_strategy(requested: str, task: TaskInfo, num_gpus: int) -> str:
    """Resolve --strategy to one of multi_worker_mirrored, parameter_server, mirrored,
    central_storage, default.

    auto: parameter_server when TF_CONFIG names ps tasks, multi_worker_mirrored when it
    names more than one training task, mirrored when this one task sees several GPUs,
    else the default strategy.
    """
    if requested == "auto":
        if task.has_ps:
            requested = "parameter_server"
        elif task.num_training_tasks > 1:
            requested = "multi_worker_mirrored"
        elif num_gpus > 1:
            requested = "mirrored"
        else:
            requested = "default"
    if requested == "parameter_server":
        if not task.has_ps:
            raise ClusterError("--strategy parameter_server needs ps tasks in TF_CONFIG")
        if not task.cluster.get("chief"):
            raise ClusterError("--strategy parameter_server needs a chief task in TF_CONFIG (the coordinator)")
    elif task.has_ps:
        raise ClusterError(f"TF_CONFIG names ps tasks, which only --strategy parameter_server can use, not {requested}")
    elif requested in SINGLE_PROCESS and task.num_training_tasks > 1:
        raise ClusterError(
            f"TF_CONFIG names {task.num_training_tasks} tasks; --strategy {requested} runs in one process "
            "(use multi_worker_mirrored)"
        )
    return requested


def uses_legacy_keras(environ: Mapping[str, str]) -> bool:
    """Whether tf.keras is tf_keras: TF_USE_LEGACY_KERAS unset (the trainer's default) or set
    to a value TensorFlow reads as true ("1", "true", "True"); any other value means Keras 3."""
    value = environ.get(LEGACY_KERAS_ENV)
    return value is None or value in ("1", "true", "True")


def check_keras(legacy: bool, strategy: str, loop: str) -> None:
    """Refuse the combinations Keras 3 cannot run, naming the way out."""
    if legacy:
        return
    keep = f"{LEGACY_KERAS_ENV}=0 (Keras 3)"
    if strategy == "parameter_server":
        raise ClusterError(f"{keep}: Keras 3 has no ParameterServerStrategy support; "
                           f"set {LEGACY_KERAS_ENV}=1 to use tf_keras")
    if loop == "fit" and strategy == "multi_worker_mirrored":
        raise ClusterError(f"{keep}: Model.fit cannot run under {strategy}; use --loop custom, "
                           f"or set {LEGACY_KERAS_ENV}=1 to use tf_keras")
