"""Device settings, the tf.distribute strategy and the in-process gRPC server.

Importing this module imports TensorFlow (with tf_keras as its Keras unless
TF_USE_LEGACY_KERAS asks for Keras 3). The
caller must then call configure_devices() and create_strategy() before running
any other TensorFlow op: memory growth can only be set before the runtime
starts ("Visible devices cannot be modified after being initialized"), and
MultiWorkerMirroredStrategy must configure collectives at program startup
("Collective ops must be configured at program startup").
"""

from __future__ import annotations

import gc
import importlib
import os
from types import ModuleType

from trainer.cluster import TaskInfo


def _import_tensorflow() -> ModuleType:
    """TensorFlow and its Keras, imported with the cyclic garbage collector paused.

    Their import makes hundreds of thousands of objects that live as long as the process; the
    collector, run every 700 allocations, walked them again and again: 0.3-0.5 s of a 4 s import.
    Frozen once imported, they are left out of every later collection too."""
    # tf.keras resolves to tf_keras unless the user chose Keras 3 (Keras 3 cannot run
    # Model.fit under MultiWorkerMirroredStrategy); this only works when set before the import.
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    collecting = gc.isenabled()
    gc.disable()
    try:
        module = importlib.import_module("tensorflow")
        module.keras.Model  # noqa: B018  (tf.keras is imported on first use: here, with the rest)
        return module
    finally:
        gc.freeze()
        if collecting:
            gc.enable()


tf = _import_tensorflow()

_IMPLEMENTATIONS = {
    "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
    "ring": tf.distribute.experimental.CommunicationImplementation.RING,
    "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
}


def configure_devices() -> int:
    """Turn on GPU memory growth (so several tasks can share a GPU); return the GPU count."""
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    return len(gpus)


def create_strategy(name: str, collective: str, task: TaskInfo) -> tf.distribute.Strategy:
    """The strategy for a resolved name (see cluster.choose_strategy)."""
    if name == "multi_worker_mirrored":
        options = tf.distribute.experimental.CommunicationOptions(implementation=_IMPLEMENTATIONS[collective])
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    if name == "parameter_server":
        return tf.distribute.ParameterServerStrategy(cluster_resolver(task))
    if name == "mirrored":
        return tf.distribute.MirroredStrategy()
    if name == "central_storage":
        # Variables on the CPU, compute on every local GPU (or the CPU when there is none).
        return tf.distribute.experimental.CentralStorageStrategy()
    if name == "default":
        return tf.distribute.get_strategy()
    raise ValueError(f"unknown strategy {name!r}")


def strategy_label(strategy: tf.distribute.Strategy) -> str:
    return type(strategy).__name__


def is_parameter_server(strategy: tf.distribute.Strategy) -> bool:
    return isinstance(strategy, tf.distribute.ParameterServerStrategy)


def cluster_resolver(task: TaskInfo) -> tf.distribute.cluster_resolver.ClusterResolver:
    """TF_CONFIG's cluster without any evaluator (a ParameterServerStrategy chief would wait for it)."""
    from_env = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({kind: list(addresses) for kind, addresses in task.training_cluster.items()}),
        task_type=task.task_type, task_id=task.task_index, rpc_layer=from_env.rpc_layer or "grpc")


def start_server(task: TaskInfo) -> tf.distribute.Server:
    """Start this ps or worker task's gRPC server for a ParameterServerStrategy chief."""
    resolver = cluster_resolver(task)
    return tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=task.task_type,
        task_index=task.task_index,
        protocol=resolver.rpc_layer,
        start=True,
    )
