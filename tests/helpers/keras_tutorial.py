"""A multi-worker training script written the way TensorFlow's multi-worker Keras tutorial teaches.

`tf.keras` model built in `strategy.scope()`, `Model.fit` under MultiWorkerMirroredStrategy, TF_CONFIG
read by TensorFlow itself. The only change from the tutorial: MNIST-shaped random data made here,
because `tf.keras.datasets.mnist.load_data()` downloads and this machine has no internet.
"""

import json
import os

import numpy as np
import tensorflow as tf

per_worker_batch_size = 32
tf_config = json.loads(os.environ["TF_CONFIG"])
num_workers = len(tf_config["cluster"]["worker"])

strategy = tf.distribute.MultiWorkerMirroredStrategy()


def mnist_like_dataset(batch_size):
    rng = np.random.default_rng(0)
    x_train = rng.random((1024, 28, 28), dtype=np.float32)
    y_train = rng.integers(0, 10, size=1024).astype(np.int64)
    return tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(1024, seed=0).repeat().batch(batch_size)


def build_and_compile_cnn_model():
    model = tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(28, 28)),
        tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
        tf.keras.layers.Conv2D(8, 3, activation="relu"),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(32, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=tf.keras.optimizers.SGD(learning_rate=0.001),
                  metrics=["accuracy"])
    return model


global_batch_size = per_worker_batch_size * num_workers
multi_worker_dataset = mnist_like_dataset(global_batch_size)

with strategy.scope():
    multi_worker_model = build_and_compile_cnn_model()

history = multi_worker_model.fit(multi_worker_dataset, epochs=3, steps_per_epoch=10)
print("TUTORIAL_LOSSES " + json.dumps([round(float(x), 6) for x in history.history["loss"]]), flush=True)
