"""MultiWorkerMirroredStrategy programs that hang (or look as if they might) in one known way.

    python mwms_hang.py MODE [CULPRIT] [--steps N] [--seconds S]

Every task reports each training step as a metric line (``{"kind":"step","step":N}``) except in
``silent-compute``. CULPRIT is a task name (``worker-1``, ``chief-0``); the others train on. Modes:

- ``input-stall``: ``Model.fit`` (tf_keras) on a ``from_generator`` dataset; after N batches the
  culprit's generator, ``slow_source``, sleeps for good. The culprit's own step then waits for its
  input while every other task waits in the next all-reduce.
- ``barrier-wait``: a custom loop; after step N the culprit waits in ``wait_for_barrier_file``
  for a file that nobody writes, while the others enter the next all-reduce.
- ``barrier-wait-logging``: the same, and the culprit logs a retry line every second.
- ``all-wait``: every task waits in ``wait_for_barrier_file`` after step N (no one is odd).
- ``silent-compute``: a custom loop of heavy steps for S seconds without printing anything,
  then one line and exit 0 (a healthy task that is not hung).

Before it stops for good a task prints ``STALLED <time>``.
"""

import argparse
import json
import os
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

ME = os.environ.get("TFLAUNCH_TASK", "worker-0")
BARRIER = "/nonexistent/tflaunch-barrier-that-nobody-writes"


def metric(record):
    print("TFLAUNCH_METRIC " + json.dumps(record, separators=(",", ":")), flush=True)


def stalled():
    print(f"STALLED {time.time():.3f}", flush=True)


def slow_source(culprit, stall_after):
    rng = np.random.default_rng(0)
    produced = 0
    while True:
        if culprit and produced >= stall_after:
            stalled()
            while True:
                time.sleep(3600)  # the input pipeline stalls here
        produced += 1
        yield rng.random((12, 16), dtype=np.float32), rng.integers(0, 4, size=(12,))


class StepMetrics(tf.keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.step = 0

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        metric({"kind": "step", "step": self.step})


def input_stall(strategy, culprit, steps):
    import tf_keras as keras

    dataset = tf.data.Dataset.from_generator(
        lambda: slow_source(culprit, steps),
        output_signature=(tf.TensorSpec((12, 16), tf.float32), tf.TensorSpec((12,), tf.int64)))
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    dataset = dataset.with_options(options)
    with strategy.scope():
        model = keras.Sequential([keras.layers.Input((16,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(4)])
        model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(dataset, epochs=1, steps_per_epoch=100000, verbose=0, callbacks=[StepMetrics()])


def wait_for_barrier_file(path, log):
    while not os.path.exists(path):
        if log:
            print(f"{ME}: {path} is not there yet; retrying in 1 s", flush=True)
        time.sleep(1.0)


def custom_loop(strategy, steps, wait, log):
    @tf.function
    def step():
        per_replica = strategy.run(lambda: tf.constant(1.0))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    for number in range(1, 100000):
        step()
        metric({"kind": "step", "step": number})
        if number == steps and wait:
            stalled()
            wait_for_barrier_file(BARRIER, log)
        time.sleep(0.05)


def silent_compute(strategy, seconds):
    weights = tf.random.stateless_normal((384, 384), seed=(1, 2))

    @tf.function
    def step(done):
        def work():
            x = weights
            for _ in range(8):
                x = tf.tanh(tf.matmul(x, weights))
            return tf.reduce_mean(x) * 0.0 + done

        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(work), axis=None)

    started = time.time()
    steps = 0
    while True:
        steps += 1
        if float(step(tf.constant(1.0 if time.time() - started > seconds else 0.0))) > 0:
            break  # every task sees the same sum, so all stop after the same step
    print(f"{ME}: {steps} silent steps in {time.time() - started:.1f} s", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["input-stall", "barrier-wait", "barrier-wait-logging", "all-wait",
                                         "silent-compute"])
    parser.add_argument("culprit", nargs="?", default="")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    print(f"{ME}: cluster formed", flush=True)
    culprit = ME == args.culprit
    if args.mode == "input-stall":
        input_stall(strategy, culprit, args.steps)
    elif args.mode == "silent-compute":
        silent_compute(strategy, args.seconds)
    else:
        wait = culprit or args.mode == "all-wait"
        custom_loop(strategy, args.steps, wait, log=args.mode == "barrier-wait-logging")


if __name__ == "__main__":
    main()
