"""Metric lines the launcher collects from the trainer's stdout.

Format (a contract with the launcher; keep it exactly):

    TFLAUNCH_METRIC <json>

one line each, the prefix `TFLAUNCH_METRIC ` (with its trailing space) followed
by compact single-line JSON (no spaces after separators). Three kinds:

- one per epoch, from every training task:
  {"kind":"epoch","task":"worker-0","epoch":1,"epochs":8,"loss":0.51,"accuracy":0.85,
   "val_loss":0.32,"val_accuracy":0.9,"epoch_seconds":3.1,"train_seconds":2.9,
   "first_step_seconds":2.1,"steps":100,"samples_per_second":7920.0,"global_batch":64,"replicas":2}
  epoch counts from 1, as Keras prints it; epochs is how many the run trains.
  epoch_seconds is the whole epoch, validation included; train_seconds its training
  phase (so validation took epoch_seconds - train_seconds, with the epoch's backup and
  checkpoint when the run writes them); first_step_seconds the
  first of its steps (steps in all), which traces the step function in a run's first
  epoch. samples_per_second is the steady-state training throughput of the whole
  cluster: it is timed from the end of the epoch's first step to the end of its last
  one, so (steps - 1) * global_batch / samples_per_second is train_seconds -
  first_step_seconds. Under ParameterServerStrategy, where steps run asynchronously
  on the workers and Keras allows no per-step callbacks, first_step_seconds is null
  and the rate is timed over the whole training phase (steps * global_batch /
  samples_per_second is train_seconds), and is null for the first epoch of a run
  (its tracing would distort it). Values that are not finite are null.
- one at the end, from every task that evaluates (at least the chief):
  {"kind":"final","task":"worker-0","test_loss":0.2,"test_accuracy":0.95,
   "startup_seconds":14.1,"test_seconds":0.8,"total_seconds":33.2,"epochs":4}
  startup_seconds runs from the process's start to the start of training (TensorFlow's
  import, the data, the strategy, the model), test_seconds is the test evaluation, and
  total_seconds runs from the process's start to this line: the epochs' epoch_seconds,
  start-up and test fit within it.
- one per checkpoint an evaluator task evaluates (trainer.evaluator):
  {"kind":"eval","task":"evaluator-0","epoch":3,"checkpoint":"ckpt-3",
   "val_loss":0.3,"val_accuracy":0.91,"eval_seconds":0.4,"final":false}
  epoch is the training epoch the checkpoint was written after. The record of
  the final checkpoint has "final":true and adds test_loss and test_accuracy.

task is $TFLAUNCH_TASK when set, else "<task type>-<index>" from TF_CONFIG,
else "local". Every line is flushed as soon as it is written.

A script of one's own prints the same epoch line with :func:`print_epoch`, a Keras
``on_epoch_end`` (standard library only, so it can be imported or copied):

    model.fit(..., callbacks=[tf.keras.callbacks.LambdaCallback(on_epoch_end=print_epoch)])
"""

from __future__ import annotations

import json
import math
import sys
import time
from typing import IO, Any

METRIC_PREFIX = "TFLAUNCH_METRIC "

TIMING_FIELDS = ("epoch_seconds", "train_seconds", "first_step_seconds", "steps", "samples_per_second")
EPOCH_FIELDS = ("kind", "task", "epoch", "epochs", "loss", "accuracy", "val_loss", "val_accuracy", *TIMING_FIELDS,
                "global_batch", "replicas")
FINAL_FIELDS = ("kind", "task", "test_loss", "test_accuracy", "startup_seconds", "test_seconds", "total_seconds",
                "epochs")
EVAL_FIELDS = ("kind", "task", "epoch", "checkpoint", "val_loss", "val_accuracy", "eval_seconds", "final")


def format_line(record: dict[str, Any]) -> str:
    """The metric line for record (without the newline)."""
    clean = {key: _jsonable(value) for key, value in record.items()}
    return METRIC_PREFIX + json.dumps(clean, separators=(",", ":"), allow_nan=False)


def parse_line(line: str) -> dict[str, Any] | None:
    """The record of a metric line, or None when line is not one."""
    if not line.startswith(METRIC_PREFIX):
        return None
    return json.loads(line[len(METRIC_PREFIX):])


def print_epoch(epoch: int, logs: dict[str, Any] | None = None, stream: IO[str] | None = None) -> None:
    """Print one epoch's metric line from Keras's ``on_epoch_end(epoch, logs)``: every figure in
    ``logs`` under its own name, epoch counted from 1 as Keras prints it. tflaunch adds the task."""
    line = format_line({"kind": "epoch", "epoch": epoch + 1, **(logs or {})})
    out = stream or sys.stdout
    out.write(line + "\n")
    out.flush()


def _jsonable(value: Any) -> Any:
    # Keras logs hold numpy scalars; JSON has no NaN, so a diverged loss becomes null.
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float):
        return round(value, 6) if math.isfinite(value) else None
    return value


class EpochClock:
    """Times one epoch: its total seconds and the training rate.

    With per-step timing (step_done after every step) the rate covers steps 2..n,
    leaving out the first step's tracing and warm-up. Without it (train_done with
    the step count, as under ParameterServerStrategy, where Keras allows no
    batch-level callbacks) the rate covers the whole training phase of the epoch.
    """

    def __init__(self, global_batch: int, clock=time.perf_counter):
        self.global_batch = global_batch
        self._clock = clock
        self.start = self.first_step_end = self.last_step_end = self.train_end = None
        self.steps = 0

    def begin(self) -> None:
        self.start = self._clock()
        self.first_step_end = self.last_step_end = self.train_end = None
        self.steps = 0

    def step_done(self) -> None:
        now = self._clock()
        self.steps += 1
        if self.steps == 1:
            self.first_step_end = now
        self.last_step_end = now

    def train_done(self, steps: int | None = None) -> None:
        """The training phase (before validation) ended; steps when they were not timed one by one."""
        self.train_end = self._clock()
        if steps is not None and self.first_step_end is None:
            self.steps = steps

    def seconds(self) -> float:
        return self._clock() - self.start

    def train_seconds(self) -> float | None:
        """The epoch's training phase: from its start to its last step (or to train_done)."""
        end = self.last_step_end if self.last_step_end is not None else self.train_end
        return None if end is None else end - self.start

    def first_step_seconds(self) -> float | None:
        """The epoch's first step, when steps were timed one by one."""
        return None if self.first_step_end is None else self.first_step_end - self.start

    def figures(self, rate: float | None) -> dict[str, Any]:
        """The epoch record's timing fields, with ``rate`` as its samples_per_second; read once at
        the epoch's end, so the parts fit within epoch_seconds."""
        return {"epoch_seconds": self.seconds(), "train_seconds": self.train_seconds(),
                "first_step_seconds": self.first_step_seconds(), "steps": self.steps or None,
                "samples_per_second": rate}

    def samples_per_second(self) -> float | None:
        if self.first_step_end is not None:
            if self.steps >= 2 and self.last_step_end > self.first_step_end:
                return (self.steps - 1) * self.global_batch / (self.last_step_end - self.first_step_end)
            if self.first_step_end > self.start:
                return self.global_batch / (self.first_step_end - self.start)
            return None
        if self.train_end is not None and self.steps and self.train_end > self.start:
            return self.steps * self.global_batch / (self.train_end - self.start)
        return None


class Reporter:
    """Writes metric lines and plain `trainer:` messages for one task, flushing each line."""

    def __init__(self, task: str, stream: IO[str] | None = None):
        self.task = task
        self._stream = stream

    @property
    def stream(self) -> IO[str]:
        return self._stream or sys.stdout

    def _write(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()

    def say(self, message: str) -> None:
        self._write(f"trainer: {message}")

    def epoch(self, *, epoch: int, logs: dict[str, Any], timing: dict[str, Any], global_batch: int, replicas: int,
              epochs: int | None = None) -> None:
        """One epoch's line; ``timing`` is :meth:`EpochClock.figures`."""
        self._write(format_line({
            "kind": "epoch",
            "task": self.task,
            "epoch": epoch,
            "epochs": epochs,
            "loss": logs.get("loss"),
            "accuracy": logs.get("accuracy"),
            "val_loss": logs.get("val_loss"),
            "val_accuracy": logs.get("val_accuracy"),
            **{key: timing.get(key) for key in TIMING_FIELDS},
            "global_batch": global_batch,
            "replicas": replicas,
        }))

    def final(self, *, test_loss: float, test_accuracy: float, startup_seconds: float, test_seconds: float,
              total_seconds: float, epochs: int) -> None:
        self._write(format_line({
            "kind": "final",
            "task": self.task,
            "test_loss": test_loss,
            "test_accuracy": test_accuracy,
            "startup_seconds": startup_seconds,
            "test_seconds": test_seconds,
            "total_seconds": total_seconds,
            "epochs": epochs,
        }))

    def evaluation(self, *, epoch: int | None, checkpoint: str, val_loss: float, val_accuracy: float,
                   eval_seconds: float, final: bool, test_loss: float | None = None,
                   test_accuracy: float | None = None) -> None:
        record = {
            "kind": "eval",
            "task": self.task,
            "epoch": epoch,
            "checkpoint": checkpoint,
            "val_loss": val_loss,
            "val_accuracy": val_accuracy,
            "eval_seconds": eval_seconds,
            "final": final,
        }
        if final:
            record.update(test_loss=test_loss, test_accuracy=test_accuracy)
        self._write(format_line(record))
