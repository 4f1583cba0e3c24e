"""Metric records as text for people: the console's epoch and test lines, and what ``tflaunch logs --grep`` matches.

    epoch 3/8  loss 0.262  acc 0.920  val_loss 0.242  val_acc 0.911  2,575 samples/s  0.84 s
    epoch 2/3  loss 1.160  val_loss 1.074  sparse_categorical_accuracy 0.287  lr 1.00e-04  1.00 s  81 ms/step
    test  loss 0.110  acc 0.963  8 epochs  14.78 s

An epoch line shows loss and accuracy (training, then validation) under short labels, then every
other figure of the record under its own name (a Keras script's ``sparse_categorical_accuracy``,
``lr``), then the throughput and the time.
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
_EPOCH_OWN = {*_NOT_SHOWN, "epoch", "epochs", "epoch_seconds", "samples_per_second", "step_seconds", "steps",
              "global_batch", "replicas", "source", *(key for key, _, _ in _EPOCH_VALUES)}


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
    if number(rate) is not None:
        parts.append(f"{rate:,.0f} samples/s")
    seconds = record.get("epoch_seconds")
    if number(seconds) is not None:
        parts.append(f"{seconds:.2f} s")
    step = record.get("step_seconds")
    if number(rate) is None and number(step) is not None:
        parts.append(f"{step * 1000:,.0f} ms/step")
    return "  ".join(parts)


def small(value: int | float) -> str:
    """A figure of any size: three decimals, or three digits where those would show none (a learning rate)."""
    if isinstance(value, float) and value and abs(value) < 0.01:
        return f"{value:.2e}"
    return number(value) or str(value)


def final_text(record: dict[str, Any]) -> str:
    """``test  loss 0.110  acc 0.963  8 epochs  14.78 s``."""
    parts = ["test"]
    parts += [f"{label} {text}" for key, label, digits in _FINAL_VALUES
              if (text := number(record.get(key), digits)) is not None]
    if isinstance(record.get("epochs"), int):
        parts.append(plural(record["epochs"], "epoch"))
    if number(record.get("total_seconds")) is not None:
        parts.append(f"{record['total_seconds']:.2f} s")
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
