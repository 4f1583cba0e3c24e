"""A MultiWorkerMirroredStrategy program (tf_keras ``Model.fit`` on a ``from_generator`` dataset)
in which one task may be slow: its input pipeline sleeps per batch.

    python mwms_straggler.py --steps N [--pace S] [--slow TASK | --slow-host HOST] [--sleep S]
                             [--recover-after S] [--width N] [--epoch-steps N] [--rebuild-each-epoch]
                             [--until-file PATH]

Every task trains ``--steps`` steps (rounded down to whole epochs of ``--epoch-steps``, 10 by
default), its input sleeping ``--pace`` seconds
per batch (0 by default: a source as fast as it can be); ``--width`` sets the dense layers' width
(the work of a step). The slow task (``--slow`` names it as TFLAUNCH_TASK does, ``--slow-host`` by
its host name) sleeps ``--sleep`` seconds per batch instead, until ``--recover-after`` seconds
after its first batch, when it prints ``RECOVERED <time>`` and goes on at the others' pace. Each
task prints ``TRAINING <time>`` at its first batch, an epoch metric line every epoch
(``trainer.metrics.print_epoch``) and ``DONE`` at its end. With ``--rebuild-each-epoch`` it calls
``fit`` once per epoch, as a training loop over a finite dataset does: each call makes a new input
iterator, whose tf.data threads are new ones (the generator runs on them). With ``--until-file`` (and
``--rebuild-each-epoch``) the tasks train on, epoch after epoch past ``--steps``, until the file exists:
a test ends the run once it has seen what it waits for, however fast steps go on its machine. Every
task's wish is all-reduced at the end of each epoch, so all stop after the same epoch (one that stopped
alone would leave the others in a collective).
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
    parser.add_argument("--epoch-steps", type=int, default=10)
    parser.add_argument("--rebuild-each-epoch", action="store_true")
    parser.add_argument("--until-file")
    args = parser.parse_args()
    slow = args.slow == ME or (args.slow_host is not None and socket.gethostname() == args.slow_host)
    epochs = max(1, args.steps // args.epoch_steps)

    strategy = tf.distribute.MultiWorkerMirroredStrategy()

    state = {"first": None, "sleeping": slow}  # across the iterators of a rebuilt pipeline

    def source():
        rng = np.random.default_rng(0)
        while True:
            now = time.time()
            if state["first"] is None:
                state["first"] = now
                print(f"TRAINING {now:.3f}", flush=True)
            if state["sleeping"] and args.recover_after is not None and now - state["first"] >= args.recover_after:
                state["sleeping"] = False
                print(f"RECOVERED {now:.3f}", flush=True)
            pause = args.sleep if state["sleeping"] else args.pace
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

    callbacks = [tf.keras.callbacks.LambdaCallback(on_epoch_end=print_epoch)]
    @tf.function  # one traced all-reduce: run eagerly, the strategy warns of its overhead at every call
    def wished(flag):
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda one: one, args=(flag,)), axis=None)

    def more(epoch: int) -> bool:
        wish = epoch < epochs or (args.until_file is not None and not os.path.exists(args.until_file))
        return bool(wished(tf.constant(1.0 if wish else 0.0)).numpy() > 0)

    if args.rebuild_each_epoch:
        epoch = 0
        while more(epoch):
            model.fit(data, epochs=epoch + 1, initial_epoch=epoch, steps_per_epoch=args.epoch_steps, verbose=0,
                      callbacks=callbacks)
            epoch += 1
    else:
        model.fit(data, epochs=epochs, steps_per_epoch=args.epoch_steps, verbose=0, callbacks=callbacks)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
