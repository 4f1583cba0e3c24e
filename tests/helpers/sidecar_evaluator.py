"""A user program with a sidecar evaluator, written the way TensorFlow's distributed training guide shows.

One file, two roles chosen from TF_CONFIG:
- chief and worker tasks train a small Keras model on scikit-learn's digits under
  MultiWorkerMirroredStrategy with Model.fit, saving weights after every epoch with
  ModelCheckpoint(filepath=<checkpoint dir>/ckpt-{epoch}, save_weights_only=True);
- the evaluator task runs tf.keras.utils.SidecarEvaluator over the same folder with
  max_evaluations=EPOCHS, so it returns after evaluating the final checkpoint.

Each evaluation is slowed to about --eval-seconds (default 3) by a callback, so that the
evaluator is still busy with the final checkpoint when training ends. The evaluator prints
one `TFLAUNCH_METRIC {"kind":"eval",...}` line per evaluated checkpoint and then
`sidecar evaluator: done after ckpt-N`; it exits 0.

Usage, with a cluster file naming `evaluator: [localhost:auto]` (tflaunch then sets
TFLAUNCH_CHECKPOINT_DIR for every task):
    tflaunch cluster.yaml -- python tests/helpers/sidecar_evaluator.py [--epochs 3] [--eval-seconds 3]
Without tflaunch, pass --checkpoint-dir DIR to every task.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

# As the guide's multi-worker Keras examples need: tf.keras is tf_keras (Keras 3 cannot run
# Model.fit under MultiWorkerMirroredStrategy). Must be set before TensorFlow is imported.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

STEPS_PER_EPOCH = 20


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sidecar_evaluator")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--eval-seconds", type=float, default=3.0, help="how long each evaluation takes")
    parser.add_argument("--checkpoint-dir", default=os.environ.get("TFLAUNCH_CHECKPOINT_DIR"))
    args = parser.parse_args()
    if not args.checkpoint_dir:
        parser.exit(2, "sidecar_evaluator: error: --checkpoint-dir (or $TFLAUNCH_CHECKPOINT_DIR) is required\n")
    return args


def digits():
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (bunch.data / 16.0).astype("float32")
    return x[:1500], bunch.target[:1500], x[1500:], bunch.target[1500:]


def build_model(tf):
    model = tf.keras.Sequential([
        tf.keras.layers.Input(shape=(64,)),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10, activation="softmax"),
    ])
    model.compile(optimizer=tf.keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


def train(tf, args) -> None:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    x_train, y_train, _, _ = digits()
    with strategy.scope():
        model = build_model(tf)
    dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(1500, seed=1).repeat()
    dataset = dataset.batch(32 * strategy.num_replicas_in_sync)
    checkpoint = tf.keras.callbacks.ModelCheckpoint(
        filepath=os.path.join(args.checkpoint_dir, "ckpt-{epoch}"), save_weights_only=True)
    model.fit(dataset, epochs=args.epochs, steps_per_epoch=STEPS_PER_EPOCH, callbacks=[checkpoint], verbose=2)
    print("training done", flush=True)


def evaluate(tf, args, task: str) -> None:
    _, _, x_eval, y_eval = digits()
    model = build_model(tf)
    data = tf.data.Dataset.from_tensor_slices((x_eval, y_eval)).batch(16)
    batches = int(data.cardinality().numpy())

    class Report(tf.keras.callbacks.Callback):
        """Paces the evaluation (a stand-in for a big eval set) and prints its result."""

        def on_test_begin(self, logs=None):
            self.started = time.monotonic()

        def on_test_batch_end(self, batch, logs=None):
            # Spread the evaluation over --eval-seconds: batch k ends no earlier than k/n of it.
            due = self.started + args.eval_seconds * (batch + 1) / batches
            time.sleep(max(0.0, due - time.monotonic()))

        def on_test_end(self, logs=None):
            # The restored optimizer step count says which epoch's checkpoint this was.
            epoch = int(model.optimizer.iterations.numpy()) // STEPS_PER_EPOCH
            record = {"kind": "eval", "task": task, "epoch": epoch, "checkpoint": f"ckpt-{epoch}",
                      "val_loss": float(logs["loss"]), "val_accuracy": float(logs["accuracy"]),
                      "eval_seconds": round(time.monotonic() - self.started, 3)}
            print("TFLAUNCH_METRIC " + json.dumps(record, separators=(",", ":")), flush=True)

    tf.keras.utils.SidecarEvaluator(model=model, data=data, checkpoint_dir=args.checkpoint_dir,
                                    max_evaluations=args.epochs, callbacks=[Report()]).start()
    print(f"sidecar evaluator: done after ckpt-{args.epochs}", flush=True)


def main() -> int:
    args = parse_args()
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    task = config.get("task", {})
    import tensorflow as tf

    if task.get("type") == "evaluator":
        evaluate(tf, args, os.environ.get("TFLAUNCH_TASK", "evaluator-0"))
    else:
        train(tf, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
