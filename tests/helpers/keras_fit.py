"""A small Keras script that knows nothing of tflaunch: Model.fit under MultiWorkerMirroredStrategy.

    python keras_fit.py [VERBOSE] [callback]

VERBOSE is Model.fit's (1 by default). With ``callback`` it also prints its own metric lines with
trainer.metrics.print_epoch. Tiny model, random data, 3 epochs of 5 steps.
"""

import sys

import numpy as np
import tensorflow as tf

verbose = int(sys.argv[1]) if len(sys.argv) > 1 else 1
callbacks = []
if "callback" in sys.argv[2:]:
    from trainer.metrics import print_epoch

    callbacks.append(tf.keras.callbacks.LambdaCallback(on_epoch_end=print_epoch))

strategy = tf.distribute.MultiWorkerMirroredStrategy()
rng = np.random.default_rng(0)
x = rng.random((160, 8), dtype=np.float32)
y = rng.integers(0, 3, size=160)
data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(16)
with strategy.scope():
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input(shape=(8,)), tf.keras.layers.Dense(8, activation="relu"),
                                 tf.keras.layers.Dense(3)])
    model.compile(optimizer="sgd", loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["sparse_categorical_accuracy"])
model.fit(data, epochs=3, steps_per_epoch=5, verbose=verbose, callbacks=callbacks)
print("trained", flush=True)
