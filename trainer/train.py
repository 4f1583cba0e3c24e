"""One training run once the strategy exists: model, loop, test evaluation, saving.

Import this module only after trainer.strategy.create_strategy() has run: it
imports Keras, and the strategy must come before any other TensorFlow work.
"""

from __future__ import annotations

import argparse
import time

from trainer import checkpoints as epoch_checkpoints
from trainer import custom_loop, fit_loop, inputs, resize
from trainer.kerasapi import LABEL as KERAS_LABEL
from trainer.kerasapi import keras, save_model
from trainer.cluster import TaskInfo
from trainer.data import Splits
from trainer.metrics import Reporter
from trainer.model import build_model, build_optimizer
from trainer.session import Scratch, Session
from trainer.strategy import strategy_label


def run(args: argparse.Namespace, task: TaskInfo, splits: Splits, reporter: Reporter,
        strategy, started: float, found: resize.Record | None) -> None:
    """Train, evaluate on the test split, save the model (chief) and print the final metric line.
    ``found``: the backup folder's record of the run's shape, as read at the start (None: none)."""
    # Same seed on every worker: identical initial weights and identical shuffling,
    # which the DATA sharding of the input relies on.
    keras.utils.set_random_seed(args.seed)
    replicas = strategy.num_replicas_in_sync
    # The global batch is what attempts with another replica count keep (trainer.resize).
    target = resize.target_global_batch(args.global_batch, args.batch_per_worker, replicas, found)
    per_replica, global_batch = resize.split_batch(target, replicas)
    steps_per_epoch = args.steps_per_epoch or inputs.default_steps_per_epoch(len(splits.x_train), global_batch)
    keeper = None
    if args.backup_dir:
        shape = resize.Shape(task.num_workers, replicas, global_batch, steps_per_epoch)
        keeper = resize.Keeper(args.backup_dir, found, target, shape, writes=task.is_chief)
    with Scratch(task.name) as scratch:
        session = Session(args=args, task=task, strategy=strategy, splits=splits, reporter=reporter,
                          replicas=replicas, global_batch=global_batch, steps_per_epoch=steps_per_epoch,
                          scratch=scratch, keeper=keeper)
        uneven = resize.uneven_note(target, replicas)
        if uneven:
            reporter.say(uneven)
        reporter.say(
            f"{reporter.task}: {strategy_label(strategy)} replicas={replicas} global_batch={global_batch} "
            f"per_replica_batch={per_replica} steps_per_epoch={steps_per_epoch} loop={args.loop} "
            f"keras={KERAS_LABEL.replace(' ', '-')} dataset={splits.name} ({splits.sizes()})"
        )
        if keeper is not None:
            keeper.start()
        with strategy.scope():
            model = build_model(splits.input_shape, args.width)
            optimizer = build_optimizer(args.optimizer, args.lr)
            if args.loop == "fit":
                fit_loop.compile_model(model, optimizer)
        checkpoints = epoch_checkpoints.for_session(session, model, optimizer)
        startup_seconds = time.perf_counter() - started
        if args.loop == "fit":
            fit_loop.train(session, model, checkpoints)
        else:
            loop = custom_loop.CustomLoop(session, model, optimizer)
            loop.train(checkpoints)
        if checkpoints is not None:
            checkpoints.finish(args.epochs)
        testing = time.perf_counter()
        if args.loop == "fit":
            test_loss, test_accuracy = fit_loop.evaluate(session, model)
        else:
            test_loss, test_accuracy = loop.evaluate(splits.x_test, splits.y_test)
        test_seconds = time.perf_counter() - testing
        model_dir = session.model_write_dir()
        if model_dir:
            # Every worker saves (saving may need all of them); only the chief's copy is kept.
            save_model(model, model_dir)
        if session.is_chief:
            saved = f", model saved to {model_dir}" if model_dir else ""
            reporter.say(f"test accuracy {test_accuracy:.4f}, test loss {test_loss:.4f}{saved}")
        reporter.final(test_loss=test_loss, test_accuracy=test_accuracy, startup_seconds=startup_seconds,
                       test_seconds=test_seconds, total_seconds=time.perf_counter() - started, epochs=args.epochs)
