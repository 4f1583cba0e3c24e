"""Keras's own epoch lines as epoch records: for scripts that print no metric lines of their own.

``Model.fit`` prints ``Epoch 3/40`` when an epoch starts and, when it ends, one line with the
epoch's figures. The four forms it takes (tf_keras and Keras 3, ``verbose=1`` and ``verbose=2``),
as a terminal shows them (:mod:`launcher.records.lines` has applied the bar's redraws)::

    10/10 [==============================] - 3s 78ms/step - loss: 1.0914 - accuracy: 0.4750 - val_loss: 1.3157
    10/10 ━━━━━━━━━━━━━━━━━━━━ 4s 93ms/step - accuracy: 0.2875 - loss: nan
    10/10 - 2s - loss: 1.1031 - accuracy: 0.3625 - lr: 1.0000e-04 - 951ms/epoch - 95ms/step
    10/10 - 6s - 561ms/step - accuracy: 0.2750 - loss: 1.1493 - val_accuracy: 0.1250

(Keras 3's bar is coloured; colour codes are ignored.) Such a line is an epoch's result when it
follows an ``Epoch N/M`` line whose result has not come yet, counts every step (``10/10``) and
has no ``ETA:``: a bar caught mid-epoch (a task that died, a bar never ended) is no result, and
neither is ``Model.evaluate``'s line after the last epoch. Its record has the shape of the
built-in trainer's (:mod:`launcher.records.metrics`)::

    {"kind": "epoch", "epoch": 3, "epochs": 40, "loss": 0.4321, "accuracy": 0.8765, ..., "steps": 57,
     "epoch_seconds": 2.0, "step_seconds": 0.03, "source": "keras"}

with every figure Keras printed under its own name, in its order (``nan`` and ``inf`` become
null, as in the trainer's records). ``epoch_seconds`` is Keras's own time where it gives
milliseconds (``951ms/epoch``, ``verbose=2`` of tf_keras); where it gives whole seconds (``3s``)
and the lines' arrival times are known (the output pump passes them), it is the time from the
``Epoch N/M`` line's arrival to the result's, to the millisecond, with Keras's rounded figure
kept as ``keras_seconds``: two runs whose epochs both print ``1s`` are told apart. An arrival time
that disagrees with Keras's own by more than its rounding (a pump that fell behind, a header and
result read in one block) is not used. ``step_seconds`` is Keras's time per step.

One source per task: a task (in one attempt) that prints a ``TFLAUNCH_METRIC`` line has chosen
its figures, and none of its Keras lines is read from then on. A callback that prints metric
lines runs before Keras's own progress bar (Keras adds the bar after the script's callbacks), so
its first epoch line comes before Keras's and no epoch is read twice.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any

SOURCE = "keras"  # the record's "source": read from Keras's own output

_SGR = re.compile(r"\x1b\[[0-9;]*m")
_HEADER = re.compile(r"Epoch (\d+)/(\d+)")
_COUNT = re.compile(r"\s*(\d+)/(\d+) ")
_TIME = r"(\d+(?:\.\d+)?)(s|ms|us|µs)"
_SECONDS = re.compile(_TIME)
_PER = re.compile(_TIME + r"/(step|epoch)")
_FIGURE = re.compile(r"([A-Za-z_][\w.]*): (\S+)")
_BAR = re.compile(r"\[[=>.]*\]|━+")
_UNIT = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6}
# The bytes every epoch line holds: a block without them is passed over at the cost of a search.
HEADER_MARK, RESULT_MARK = b"Epoch ", b"/step"


@dataclass(frozen=True)
class KerasState:
    """What one task's output said so far (in one attempt): the epoch whose result is due, and
    whether the task prints metric lines of its own (then nothing of Keras's is read)."""

    epoch: int | None = None
    epochs: int | None = None
    explicit: bool = False
    began: float | None = None  # when the due epoch's ``Epoch N/M`` line arrived, when known


def header(text: str) -> tuple[int, int] | None:
    """``(3, 40)`` for ``Epoch 3/40``; None for any other line."""
    match = _HEADER.fullmatch(_SGR.sub("", text).strip())
    return (int(match.group(1)), int(match.group(2))) if match else None


def figure(text: str) -> float | None:
    """A figure as Keras prints it (``0.4321``, ``1.0000e-04``, ``nan``); None when not finite.
    Raises ValueError for text that is no number."""
    value = float(text)
    return value if math.isfinite(value) else None


ROUNDING = 1.0  # Keras's whole seconds are within this of the epoch's time (it rounds, or truncates)


def result(text: str) -> dict[str, Any] | None:
    """The figures of a line that ends an epoch (see the module's docstring), without epoch and
    kind; None for any other line, a bar mid-epoch included."""
    found = _result(text)
    return None if found is None else found[0]


def _result(text: str) -> tuple[dict[str, Any], bool] | None:
    """:func:`result`, and whether its epoch_seconds is Keras's whole seconds."""
    text = _SGR.sub("", text).strip()
    count = _COUNT.match(text + " ")
    if count is None or count.group(1) != count.group(2) or "ETA:" in text:
        return None
    figures: dict[str, Any] = {}
    timing: dict[str, float] = {}
    elapsed = None
    for part in re.split(r"(?:^| )- ", text[count.end():].strip()):
        part = part.strip()
        if not part:
            continue
        named = _FIGURE.fullmatch(part)
        if named:
            try:
                figures[named.group(1)] = figure(named.group(2))
            except ValueError:
                return None  # Keras prints figures only
            continue
        for word in part.split():
            if _BAR.fullmatch(word):
                continue
            per = _PER.fullmatch(word)
            seconds = _SECONDS.fullmatch(word)
            if per:
                timing[per.group(3)] = float(per.group(1)) * _UNIT[per.group(2)]
            elif seconds and elapsed is None:
                elapsed = float(seconds.group(1)) * _UNIT[seconds.group(2)]
            else:
                return None  # not a line Keras writes at the end of an epoch
    if "step" not in timing or not figures:
        return None
    seconds = timing.get("epoch", elapsed)
    rounded = "epoch" not in timing and seconds is not None and float(seconds).is_integer()
    return ({**figures, "steps": int(count.group(1)), "epoch_seconds": None if seconds is None else round(seconds, 6),
             "step_seconds": round(timing["step"], 6)}, rounded)


def read_line(state: KerasState, text: str, now: float | None = None) -> tuple[KerasState, dict[str, Any] | None]:
    """The state after one line of a task's output, and the epoch record the line completes, if
    any; ``now``: when the line arrived (epoch times to the millisecond where Keras rounds)."""
    if state.explicit:
        return state, None
    found = header(text)
    if found:
        return replace(state, epoch=found[0], epochs=found[1], began=now), None
    if state.epoch is None:
        return state, None
    read = _result(text)
    if read is None:
        return state, None
    figures, rounded = read
    record = {"kind": "epoch", "epoch": state.epoch, "epochs": state.epochs, **figures, "source": SOURCE}
    if rounded and now is not None and state.began is not None:
        arrived = now - state.began
        if 0 < arrived and abs(arrived - figures["epoch_seconds"]) <= ROUNDING:
            record["epoch_seconds"], record["keras_seconds"] = round(arrived, 3), figures["epoch_seconds"]
    return replace(state, epoch=None, began=None), record


def may_hold(block: bytes, state: KerasState) -> bool:
    """Whether a block can change ``state`` or complete an epoch: a cheap search before any line is read."""
    if state.explicit:
        return False
    return HEADER_MARK in block or (state.epoch is not None and RESULT_MARK in block)
