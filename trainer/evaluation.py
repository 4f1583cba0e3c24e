"""Exact (loss, accuracy) over in-memory arrays, run in this process with the model's variables.

Used where Keras's own distributed evaluation cannot run: by a ParameterServerStrategy
chief (the variables live on the ps tasks; Keras's exact evaluation cannot shard
in-memory data in TF 2.21) and by the evaluator task.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import tensorflow as tf

from trainer.kerasapi import keras


def exact_evaluator(model, batch: int) -> Callable[[np.ndarray, np.ndarray], tuple[float, float]]:
    """A function (x, y) -> (mean loss, accuracy) that evaluates ``model`` in batches of ``batch``."""
    loss_fn = keras.losses.SparseCategoricalCrossentropy(reduction="sum")

    @tf.function
    def sums(x, y):
        probs = model(x, training=False)
        predicted = tf.argmax(probs, axis=-1, output_type=tf.int32)
        return loss_fn(y, probs), tf.reduce_sum(tf.cast(tf.equal(predicted, y), tf.float32))

    def evaluate(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        loss = correct = 0.0
        for start in range(0, len(x), batch):
            batch_loss, batch_correct = sums(x[start:start + batch], y[start:start + batch])
            loss += float(batch_loss)
            correct += float(batch_correct)
        return loss / len(x), correct / len(x)

    return evaluate
