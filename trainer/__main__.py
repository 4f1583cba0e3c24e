"""Entry point: python -m trainer [options] (see --help).

Startup order is fixed here because TensorFlow is strict about it: options are
parsed, TF_CONFIG read, the data loaded in numpy and the backup's record checked
first (a user's mistake is said before the slow import); then TensorFlow is
imported, GPU memory growth set and the strategy created before any other
TensorFlow op runs.

Send SIGUSR1 to the process to get the Python stack of every thread on stderr
(faulthandler); a supervisor can use this to see where a hung task is stuck.
SIGTERM ends the process: with --backup-dir, after writing the backup at the next
step boundary (at most 3 s later; trainer.termination), otherwise at once.

An evaluator task (TF_CONFIG task type "evaluator") takes no part in training:
it evaluates the chief's checkpoints (trainer.evaluator). ps and worker tasks of
a ParameterServerStrategy cluster only serve (trainer.ps).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import time

USER_ERROR_EXIT = 2


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # Keep TensorFlow's INFO chatter out of the logs; warnings and errors still show.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    # tf.keras is tf_keras unless the user chose Keras 3 with TF_USE_LEGACY_KERAS=0 (Keras 3
    # cannot run Model.fit under MultiWorkerMirroredStrategy; cluster.check_keras says where
    # it cannot run); set before anything, as the mnist download imports TensorFlow early.
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

    from trainer import cli, cluster, data, resize
    from trainer.metrics import Reporter

    args = cli.parse_args(argv)
    try:
        task = cluster.read_tf_config(os.environ)
        reporter = Reporter(cluster.task_label(os.environ, task))
        legacy_keras = cluster.uses_legacy_keras(os.environ)
        if task.is_evaluator:
            if not args.checkpoint_dir:
                raise cluster.ClusterError("the evaluator task needs --checkpoint-dir (or $TFLAUNCH_CHECKPOINT_DIR), "
                                           "the folder the chief writes its checkpoints into")
            return evaluate(args, task, reporter)
        # Checked now to fail before the slow TensorFlow import; resolved again below
        # once the GPU count is known.
        name = cluster.choose_strategy(args.strategy, task, num_gpus=0)
        cluster.check_keras(legacy_keras, name, args.loop)
        if name == "parameter_server":
            from trainer import ps

            if args.loop != "fit":
                raise cluster.ClusterError("--strategy parameter_server supports --loop fit only")
            if args.backup_every:
                # Keras allows no batch-level callbacks under ParameterServerStrategy.
                raise cluster.ClusterError("--strategy parameter_server backs up every epoch; "
                                           "--backup-every N is not supported")
            note = ps.prepare_environment()
            if note:
                reporter.say(note)
            if task.task_type in ("ps", "worker"):
                ps.serve(task, reporter)
                return 0
        splits = data.load(args.dataset)
        # Read before the slow import, so that a record that cannot be read is said at once.
        record = resize.read_record(args.backup_dir) if args.backup_dir else None
    except (cluster.ClusterError, data.DataError, resize.RecordError) as exc:
        print(f"trainer: error: {exc}", file=sys.stderr, flush=True)
        return USER_ERROR_EXIT

    from trainer import strategy

    num_gpus = strategy.configure_devices()
    name = cluster.choose_strategy(args.strategy, task, num_gpus)
    try:
        # auto may pick another strategy now that the GPUs are known.
        cluster.check_keras(legacy_keras, name, args.loop)
    except cluster.ClusterError as exc:
        print(f"trainer: error: {exc}", file=sys.stderr, flush=True)
        return USER_ERROR_EXIT
    distribution = strategy.create_strategy(name, args.collective, task)
    # MultiWorkerMirroredStrategy installs TensorFlow's preemption notifier, which catches
    # SIGTERM and lets training carry on; a supervisor's SIGTERM must end us: with a backup
    # folder, after saving where training is (trainer.termination), else at once.
    from trainer import termination

    termination.install(saves=bool(args.backup_dir) and name != "parameter_server")

    from trainer import train

    try:
        train.run(args, task, splits, reporter, distribution, started, record)
    except Exception:
        if termination.requested():
            # Stopping broke a collective (a peer went first): the stop was asked for, so end as
            # SIGTERM would have, not with that error's traceback.
            termination.end()
        raise
    return 0


def evaluate(args, task, reporter) -> int:
    """Run the evaluator task; a checkpoint that does not fit the model is a user error."""
    from trainer import data

    try:
        splits = data.load(args.dataset)
    except data.DataError as exc:
        print(f"trainer: error: {exc}", file=sys.stderr, flush=True)
        return USER_ERROR_EXIT
    from trainer import strategy

    strategy.configure_devices()
    from trainer import evaluator

    try:
        evaluator.run(args, task, splits, reporter)
    except evaluator.EvaluatorError as exc:
        print(f"trainer: error: {exc}", file=sys.stderr, flush=True)
        return USER_ERROR_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
