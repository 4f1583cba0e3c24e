"""The ps and worker tasks of a ParameterServerStrategy cluster.

They only run a tf.distribute.Server: the chief builds the model, places its
variables on the ps tasks and schedules training steps on the workers through a
ClusterCoordinator. These tasks never finish by themselves; the launcher stops
them (SIGTERM) once the chief has exited 0.

A worker that dies can come back in place (same TF_CONFIG, started again alone):
the coordinator reschedules the steps it lost on the other workers meanwhile,
and when the worker is reachable again it re-creates the worker's datasets
(Model.fit builds them with ClusterCoordinator.create_per_worker_dataset) and
gives it steps again. The chief says so in its log (watch_workers). A ps that
dies ends the chief's training; a restarted cluster resumes from the backup.
"""

from __future__ import annotations

import logging
import os
import re

from trainer.cluster import TaskInfo
from trainer.metrics import Reporter


def prepare_environment() -> str | None:
    """Settings every task of a parameter-server cluster needs before TensorFlow starts.

    Returns a note for the log when a setting from the environment was changed.
    """
    # TensorFlow's guidance for ParameterServerStrategy: let RPCs to an unavailable task
    # fail fast so the coordinator can reschedule work instead of hanging.
    os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
    # Remote function calls between the tasks deadlock with a single inter-op
    # thread (measured: training never finishes its first epoch), so at least two.
    if os.environ.get("TF_NUM_INTEROP_THREADS", "").strip() == "1":
        os.environ["TF_NUM_INTEROP_THREADS"] = "2"
        return "TF_NUM_INTEROP_THREADS raised from 1 to 2 (parameter-server tasks deadlock with one)"
    return None


def serve(task: TaskInfo, reporter: Reporter) -> None:
    """Start this task's server and block until the process is stopped."""
    from trainer import strategy

    strategy.configure_devices()
    server = strategy.start_server(task)
    reporter.say(f"{reporter.task}: serving as {task.task_type} {task.task_index} "
                 f"at {task.cluster[task.task_type][task.task_index]} ({server.target})")
    server.join()


class _WorkerEvents(logging.Filter):
    """A filter on TensorFlow's logger: says worker events as trainer lines, keeps INFO hidden."""

    EVENTS = (
        (re.compile(r"^Worker /job:worker/replica:\d+/task:(\d+) failed with"),
         "worker {} lost; its steps go to the other workers"),
        (re.compile(r"^Worker /job:worker/replica:\d+/task:(\d+) has been recovered"), "worker {} rejoined"),
    )

    def __init__(self, reporter: Reporter):
        super().__init__()
        self.reporter = reporter
        self.last: dict[str, str] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        for pattern, text in self.EVENTS:
            match = pattern.match(message)
            # The coordinator repeats each event (once per closure in flight); say it once.
            if match and self.last.get(match.group(1)) != text:
                self.last[match.group(1)] = text
                self.reporter.say(text.format(match.group(1)))
        return record.levelno >= logging.WARNING


def watch_workers(reporter: Reporter) -> None:
    """On the chief: say in the log when a worker is lost and when it rejoins.

    The recovery message is logged at INFO, below what TensorFlow's logger shows. The
    logger is opened to INFO and a filter on it reads every record, then lets only
    WARNING and above through to its handlers, as before.
    """
    import tensorflow as tf

    logger = tf.get_logger()
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    logger.addFilter(_WorkerEvents(reporter))
