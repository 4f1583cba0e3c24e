"""One training run once the strategy exists: model, loop, test evaluation, saving.

Import this module only after trainer.strategy.create_strategy() has run: it
imports Keras, and the strategy must come before any other TensorFlow work.
"""

from __future__ import annotations

import argparse
import time

from trainer import checkpoints as epoch_checkpoints
from trainer import custom_loop, fit_loop, inputs
from trainer.kerasapi import LABEL as KERAS_LABEL
from trainer.kerasapi import keras, save_model
from trainer.cluster import TaskInfo
from trainer.data import Splits
from trainer.metrics import Reporter
from trainer.model import build_model, build_optimizer
from trainer.session import Scratch, Session
from trainer.strategy import strategy_label


def run(args: argparse.Namespace, task: TaskInfo, splits: Splits, reporter: Reporter,
        strategy, started: float) -> None:
    """Train, evaluate on the test split, save the model (chief) and print the final metric line."""
    # Same seed on every worker: identical initial weights and identical shuffling,
    # which the DATA sharding of the input relies on.
    keras.utils.set_random_seed(args.seed)
    replicas = strategy.num_replicas_in_sync
    global_batch = args.batch_per_worker * replicas
    steps_per_epoch = args.steps_per_epoch or inputs.default_steps_per_epoch(len(splits.x_train), global_batch)
    with Scratch(task.name) as scratch:
        session = Session(args=args, task=task, strategy=strategy, splits=splits, reporter=reporter,
                          replicas=replicas, global_batch=global_batch, steps_per_epoch=steps_per_epoch,
                          scratch=scratch)
        reporter.say(
            f"{reporter.task}: {strategy_label(strategy)} replicas={replicas} global_batch={global_batch} "
            f"steps_per_epoch={steps_per_epoch} loop={args.loop} keras={KERAS_LABEL.replace(' ', '-')} "
            f"dataset={splits.name} ({splits.sizes()})"
        )
        with strategy.scope():
            model = build_model(splits.input_shape, args.width)
            optimizer = build_optimizer(args.optimizer, args.lr)
            if args.loop == "fit":
                fit_loop.compile_model(model, optimizer)
        checkpoints = epoch_checkpoints.for_session(session, model, optimizer)
        if args.loop == "fit":
            fit_loop.train(session, model, checkpoints)
        else:
            loop = custom_loop.CustomLoop(session, model, optimizer)
            loop.train(checkpoints)
        if checkpoints is not None:
            checkpoints.finish(args.epochs)
        if args.loop == "fit":
            test_loss, test_accuracy = fit_loop.evaluate(session, model)
        else:
            test_loss, test_accuracy = loop.evaluate(splits.x_test, splits.y_test)
        model_dir = session.model_write_dir()
        if model_dir:
            # Every worker saves (saving may need all of them); only the chief's copy is kept.
            save_model(model, model_dir)
        if session.is_chief:
            saved = f", model saved to {model_dir}" if model_dir else ""
            reporter.say(f"test accuracy {test_accuracy:.4f}, test loss {test_loss:.4f}{saved}")
        reporter.final(test_loss=test_loss, test_accuracy=test_accuracy,
                       total_seconds=time.perf_counter() - started, epochs=args.epochs)
