"""A MultiWorkerMirroredStrategy program (tf_keras ``Model.fit`` on a ``from_generator`` dataset)
in which one task may be slow: its input pipeline sleeps per batch.

    python mwms_straggler.py --steps N [--pace S] [--slow TASK | --slow-host HOST] [--sleep S]
                             [--recover-after S] [--width N]

Every task trains ``--steps`` steps (rounded down to tens), its input sleeping ``--pace`` seconds
per batch (0 by default: a source as fast as it can be); ``--width`` sets the dense layers' width
(the work of a step). The slow task (``--slow`` names it as TFLAUNCH_TASK does, ``--slow-host`` by
its host name) sleeps ``--sleep`` seconds per batch instead, until ``--recover-after`` seconds
after its first batch, when it prints ``RECOVERED <time>`` and goes on at the others' pace. Each
task prints ``TRAINING <time>`` at its first batch, an epoch metric line every 10 steps
(``trainer.metrics.print_epoch``) and ``DONE`` at its end.
"""

import argparse
import os
import socket
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

ME = os.environ.get("TFLAUNCH_TASK", "worker-0")
BATCH, FEATURES = 32, 64


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--pace", type=float, default=0.0)
    parser.add_argument("--slow")
    parser.add_argument("--slow-host")
    parser.add_argument("--sleep", type=float, default=0.1)
    parser.add_argument("--recover-after", type=float)
    parser.add_argument("--width", type=int, default=128)
    args = parser.parse_args()
    slow = args.slow == ME or (args.slow_host is not None and socket.gethostname() == args.slow_host)
    steps = max(10, args.steps // 10 * 10)

    strategy = tf.distribute.MultiWorkerMirroredStrategy()

    def source():
        rng = np.random.default_rng(0)
        first, sleeping = None, slow
        while True:
            now = time.time()
            if first is None:
                first = now
                print(f"TRAINING {now:.3f}", flush=True)
            if sleeping and args.recover_after is not None and now - first >= args.recover_after:
                sleeping = False
                print(f"RECOVERED {now:.3f}", flush=True)
            pause = args.sleep if sleeping else args.pace
            if pause:
                time.sleep(pause)
            yield rng.random((BATCH, FEATURES), dtype=np.float32), rng.random((BATCH, 1), dtype=np.float32)

    spec = (tf.TensorSpec((BATCH, FEATURES), tf.float32), tf.TensorSpec((BATCH, 1), tf.float32))
    data = tf.data.Dataset.from_generator(source, output_signature=spec)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    data = data.with_options(options)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(args.width, activation="relu"),
                                     tf.keras.layers.Dense(args.width, activation="relu"),
                                     tf.keras.layers.Dense(1)])
        model.compile("sgd", "mse")
    from trainer.metrics import print_epoch  # the documented callback: an epoch metric line each epoch

    model.fit(data, epochs=steps // 10, steps_per_epoch=10, verbose=0,
              callbacks=[tf.keras.callbacks.LambdaCallback(on_epoch_end=print_epoch)])
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
