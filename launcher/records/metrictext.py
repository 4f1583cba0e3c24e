"""Metric records as text for people: the console's epoch and test lines, and what ``tflaunch logs --grep`` matches.

    epoch 1/8  loss 0.512  acc 0.850  val_loss 0.321  val_acc 0.900  7.05 s = first step 6.21 + 0.73 at 1,390 samples/s + validation 0.11
    epoch 2/3  loss 1.160  val_loss 1.074  sparse_categorical_accuracy 0.287  lr 1.00e-04  1.00 s  81 ms/step
    test  loss 0.110  acc 0.963  0.80 s

An epoch line shows loss and accuracy (training, then validation) under short labels, then every
other figure of the record under its own name (a Keras script's ``sparse_categorical_accuracy``,
``lr``), then the time. Where the record says how its epoch divides (the trainer's
``train_seconds`` and ``first_step_seconds``), the time is that sum, each part with the figures
that belong to it, and the parts as shown add up to the whole (:func:`epoch_parts`): the
steady-state rate is the rate of the steps after the first, the step that traces the model.
"""

from __future__ import annotations

import math
from typing import Any

from .states import plural

# (field, label, digits) in the order they are shown.
_EPOCH_VALUES = (("loss", "loss", 3), ("accuracy", "acc", 3), ("val_loss", "val_loss", 3),
                 ("val_accuracy", "val_acc", 3))
_FINAL_VALUES = (("test_loss", "loss", 3), ("test_accuracy", "acc", 3))
_NOT_SHOWN = {"kind", "task", "time", "attempt"}
# Figures of an epoch record shown in their own place, or not at all.
_EPOCH_OWN = {*_NOT_SHOWN, "epoch", "epochs", "epoch_seconds", "train_seconds", "first_step_seconds",
              "samples_per_second", "step_seconds", "keras_seconds", "steps", "global_batch", "replicas", "source",
              *(key for key, _, _ in _EPOCH_VALUES)}


def number(value: Any, digits: int = 3) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return str(value) if isinstance(value, int) else f"{value:.{digits}f}"


def epoch_text(record: dict[str, Any], total: int | None = None) -> str:
    """``epoch 3/8  loss 0.262  acc 0.920  val_loss 0.242  val_acc 0.911  2,575 samples/s  0.84 s``."""
    epoch = record.get("epoch")
    total = record.get("epochs") if isinstance(record.get("epochs"), int) else total
    parts = [f"epoch {epoch}/{total}" if total else f"epoch {epoch}"]
    parts += [f"{label} {text}" for key, label, digits in _EPOCH_VALUES
              if (text := number(record.get(key), digits)) is not None]
    parts += [f"{key} {small(value)}" for key, value in record.items()
              if key not in _EPOCH_OWN and number(value) is not None]
    rate = record.get("samples_per_second")
    seconds = record.get("epoch_seconds")
    split = epoch_parts(record)
    if split is not None:
        parts.append(split_text(split, rate))
        return "  ".join(parts)
    if number(rate) is not None:
        parts.append(f"{rate:,.0f} samples/s")
    if number(seconds) is not None:
        parts.append(f"{seconds:.2f} s")
    step = record.get("step_seconds")
    if number(rate) is None and number(step) is not None:
        parts.append(f"{step * 1000:,.0f} ms/step")
    return "  ".join(parts)


EpochParts = tuple[int, int | None, int, int]  # hundredths of a second: whole, first step, rest of training, validation


def _seconds(value: Any) -> bool:
    return number(value) is not None and value >= 0


def epoch_parts(record: dict[str, Any]) -> EpochParts | None:
    """How an epoch record's time divides, in hundredths of a second as shown: ``(whole, first
    step or None, the training after it, validation)``, each part rounded and the training after
    the first step taking what rounding leaves, so the parts add up to the whole exactly. None
    when the record does not say (no ``train_seconds``, or figures that do not fit in the whole).
    """
    whole, train, first = (record.get(key) for key in ("epoch_seconds", "train_seconds", "first_step_seconds"))
    if not (_seconds(whole) and _seconds(train)) or train > whole * 1.001 + 0.005:
        return None
    if not _seconds(first) or first > train:
        first = None
    total = round(whole * 100)
    validation = max(0, min(total, round((whole - train) * 100)))
    first_part = None if first is None else min(round(first * 100), total - validation)
    return total, first_part, total - validation - (first_part or 0), validation


def split_text(split: EpochParts, rate: Any = None) -> str:
    """``7.05 s = first step 6.21 + 0.73 at 1,390 samples/s + validation 0.11`` (the parts of :func:`epoch_parts`)."""
    total, first, steady, validation = split
    at = f" at {rate:,.0f} samples/s" if number(rate) is not None else ""
    parts = [f"first step {first / 100:.2f}"] if first is not None else []
    parts.append(f"{steady / 100:.2f}{at}" if first is not None else f"training {steady / 100:.2f}{at}")
    if validation:
        parts.append(f"validation {validation / 100:.2f}")
    return f"{total / 100:.2f} s = " + " + ".join(parts)


def small(value: int | float) -> str:
    """A figure of any size: three decimals, or three digits where those would show none (a learning rate)."""
    if isinstance(value, float) and value and abs(value) < 0.01:
        return f"{value:.2e}"
    return number(value) or str(value)


def final_text(record: dict[str, Any]) -> str:
    """``test  loss 0.110  acc 0.963  0.80 s``: the test's figures and its own time, or, from a
    record that does not say it, the task's time in all (``8 epochs in 14.78 s since the task started``)."""
    parts = ["test"]
    parts += [f"{label} {text}" for key, label, digits in _FINAL_VALUES
              if (text := number(record.get(key), digits)) is not None]
    if _seconds(record.get("test_seconds")):
        parts.append(f"{record['test_seconds']:.2f} s")
    elif _seconds(record.get("total_seconds")):
        epochs = f"{plural(record['epochs'], 'epoch')} in " if isinstance(record.get("epochs"), int) else ""
        parts.append(f"{epochs}{record['total_seconds']:.2f} s since the task started")
    return "  ".join(parts)


def other_text(record: dict[str, Any]) -> str:
    """Any other record: its kind, then its scalar fields in the order they came."""
    parts = [str(record.get("kind") or "metric")]
    for key, value in record.items():
        if key in _NOT_SHOWN or isinstance(value, (dict, list)):
            continue
        text = number(value, 4) if isinstance(value, float) else value
        parts.append(f"{key} {text}")
    return "  ".join(str(p) for p in parts)


def record_text(record: dict[str, Any], total: int | None = None) -> str:
    kind = record.get("kind")
    if kind == "epoch" and record.get("epoch") is not None:
        return epoch_text(record, total)
    if kind == "final":
        return final_text(record)
    return other_text(record)


def time_text(final: dict[str, Any], epoch_seconds: float) -> str | None:
    """Where a task's time went, from its ``final`` record and its epochs' ``epoch_seconds`` summed:
    ``start-up 14.1 s + epochs 17.5 s + test 0.8 s + the rest 0.3 s = 32.7 s``, its ``total_seconds``.
    The parts as shown add up to the whole (the rest takes what rounding leaves). None when the
    record does not say its start-up, test and total times, or when the epochs do not fit in
    them (an attempt that resumed from another's backup)."""
    startup, test, total = (final.get(key) for key in ("startup_seconds", "test_seconds", "total_seconds"))
    if not (_seconds(startup) and _seconds(test) and _seconds(total)) or epoch_seconds < 0:
        return None
    whole, start, epochs, tested = (round(value * 10) for value in (total, startup, epoch_seconds, test))
    rest = whole - start - epochs - tested
    if rest < -2:  # more than rounding: these epochs did not all run in this task's time
        return None
    if rest < 0:
        start, rest = start + rest, 0
    return " + ".join(f"{label} {tenths / 10:.1f} s" for label, tenths in
                      (("start-up", start), ("epochs", epochs), ("test", tested), ("the rest", rest))) \
        + f" = {whole / 10:.1f} s"
