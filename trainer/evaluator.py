"""The evaluator task: evaluates the chief's checkpoints as they appear, until training ends.

Like tf.keras.utils.SidecarEvaluator, it polls --checkpoint-dir for the latest
checkpoint (trainer.checkpoints), restores the model's weights from it and
evaluates them on the validation split, printing one "eval" metric line per
checkpoint (trainer.metrics). Checkpoints written while it evaluates are skipped
in favour of the newest. When the chief's marker (trainer.handoff) names the
final checkpoint, it evaluates that one on the validation and test splits and
exits 0 (the final checkpoint may then be reported twice: once when it appeared,
and once, with "final": true, when the marker did). If training never ends, it
waits until it is stopped.

It runs no TensorFlow server and trains nothing, so it is in no strategy.
"""

from __future__ import annotations

import os
import time
from typing import Callable

import tensorflow as tf

from trainer import handoff
from trainer.cluster import TaskInfo
from trainer.data import Splits
from trainer.evaluation import exact_evaluator
from trainer.metrics import Reporter
from trainer.model import build_model

POLL_SECONDS = 0.5


class EvaluatorError(Exception):
    """A checkpoint that cannot belong to this model (other --width or --dataset than the chief's)."""


def run(args, task: TaskInfo, splits: Splits, reporter: Reporter, *,
        poll_seconds: float = POLL_SECONDS, sleep: Callable[[float], None] = time.sleep) -> None:
    directory = args.checkpoint_dir
    run_id = handoff.run_id_of(os.environ)
    model = build_model(splits.input_shape, args.width)
    # The checkpoint also holds the optimizer, which evaluation does not need.
    checkpoint = tf.train.Checkpoint(model=model)
    evaluate = exact_evaluator(model, args.batch_per_worker)
    reporter.say(f"{reporter.task}: evaluating the checkpoints in {directory} as they appear "
                 f"(dataset={splits.name}, {splits.sizes()})")
    evaluated = None  # (checkpoint path, final) of the last evaluation
    retried = set()
    while True:
        marker = handoff.read_marker(directory, run_id)
        target = (os.path.join(directory, marker["checkpoint"]) if marker
                  else tf.train.latest_checkpoint(directory))
        final = marker is not None
        if target and (target, final) != evaluated:
            try:
                restore(checkpoint, target)
            except tf.errors.OpError as exc:
                # The chief removes old checkpoints (CheckpointManager's max_to_keep): one named
                # a moment ago may be gone. A final one is never removed, so that is an error.
                if final and target in retried:
                    raise EvaluatorError(f"{target}: cannot be read ({type(exc).__name__})") from None
                retried.add(target)
                sleep(poll_seconds)
                continue
            started = time.perf_counter()
            val_loss, val_accuracy = evaluate(splits.x_val, splits.y_val)
            test_loss = test_accuracy = None
            if final:
                test_loss, test_accuracy = evaluate(splits.x_test, splits.y_test)
            reporter.evaluation(epoch=handoff.checkpoint_epoch(target), checkpoint=os.path.basename(target),
                                val_loss=val_loss, val_accuracy=val_accuracy,
                                eval_seconds=time.perf_counter() - started, final=final,
                                test_loss=test_loss, test_accuracy=test_accuracy)
            evaluated = (target, final)
            if final:
                reporter.say(f"training ended; final checkpoint {os.path.basename(target)}: "
                             f"test accuracy {test_accuracy:.4f}, test loss {test_loss:.4f}")
                return
        sleep(poll_seconds)


def restore(checkpoint: tf.train.Checkpoint, path: str) -> None:
    """Load the model's weights from path; a model that does not match is an EvaluatorError."""
    try:
        status = checkpoint.restore(path)
        status.expect_partial()
        status.assert_existing_objects_matched()
    except (ValueError, AssertionError) as exc:
        # The half-done restore logs a warning per unrestored value when it is collected;
        # the one-line error says all there is to say.
        tf.get_logger().setLevel("ERROR")
        first = " ".join(str(exc).split())[:160]
        raise EvaluatorError(f"{path}: does not match this model; give the evaluator the same --width "
                             f"and --dataset as the chief ({first})") from None
