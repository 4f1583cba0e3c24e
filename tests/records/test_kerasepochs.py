"""Keras's own epoch lines read as epoch records, over what tf_keras and Keras 3 really print.

The fixtures (tests/fixtures/keras, made by capture.py there) are the raw bytes of Model.fit at
verbose 1 and 2: bars redrawn with carriage returns and backspaces, ETA lines mid-epoch, the
evaluate line after the last epoch, odd metric names, a learning rate in scientific notation, nan.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from launcher.records.kerasepochs import KerasState, header, read_line, result
from launcher.records.lines import LineSplitter, unglued
from launcher.records.metrics import metric_lines

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "keras"
KINDS = [f"{keras}_verbose{v}_{variant}.log" for keras in ("tf_keras", "keras3") for v in (1, 2)
         for variant in ("plain", "odd", "nan")]


def folded(name: str) -> list[str]:
    """The fixture's lines as a terminal (and the output pump) shows them."""
    splitter = LineSplitter()
    raw = (FIXTURES / name).read_bytes()
    return [line.decode() for line in splitter.feed(raw) + splitter.flush()]


def records(lines: list[str], state: KerasState = KerasState()) -> list[dict]:
    found = []
    for line in lines:
        state, record = read_line(state, line)
        if record is not None:
            found.append(record)
    return found


@pytest.mark.parametrize("name", KINDS)
def test_every_fixture_gives_its_three_epochs_and_nothing_else(name):
    found = records(folded(name))
    assert [(r["kind"], r["epoch"], r["epochs"], r["steps"], r["source"]) for r in found] == \
        [("epoch", n, 3, 10, "keras") for n in (1, 2, 3)]
    metric = "sparse_categorical_accuracy" if "odd" in name else "accuracy"
    for record in found:
        assert metric in record and "loss" in record
        assert ("val_loss" in record) is ("nan" not in name)
        assert record["epoch_seconds"] >= 0 and 0 < record["step_seconds"] < 5


def test_tf_keras_verbose1_figures_exactly():
    first = records(folded("tf_keras_verbose1_plain.log"))[0]
    assert first == {"kind": "epoch", "epoch": 1, "epochs": 3, "loss": 1.0914, "accuracy": 0.475,
                     "val_loss": 1.3157, "val_accuracy": 0.1875, "steps": 10, "epoch_seconds": 4.0,
                     "step_seconds": 0.13, "source": "keras"}


def test_tf_keras_verbose2_takes_the_epoch_time_in_milliseconds_and_the_learning_rate():
    second = records(folded("tf_keras_verbose2_odd.log"))[1]
    assert second["epoch_seconds"] == 0.881 and second["step_seconds"] == 0.088
    assert second["lr"] == 1e-4 and second["val_sparse_categorical_accuracy"] == 0.375
    assert list(second)[3:8] == ["loss", "sparse_categorical_accuracy", "val_loss",
                                 "val_sparse_categorical_accuracy", "lr"]  # Keras's order


def test_keras3_lines_have_their_colour_codes_ignored():
    last = records(folded("keras3_verbose1_odd.log"))[2]
    assert last["learning_rate"] == 5e-05 and last["loss"] == 1.0632 and last["epoch_seconds"] == 1.0
    v2 = records(folded("keras3_verbose2_plain.log"))[0]
    assert (v2["accuracy"], v2["loss"], v2["epoch_seconds"], v2["step_seconds"]) == (0.275, 1.1493, 6.0, 0.561)


@pytest.mark.parametrize("name", [k for k in KINDS if "nan" in k])
def test_nan_becomes_null(name):
    assert [r["loss"] for r in records(folded(name))] == [None, None, None]


def bar_redraws(name: str) -> list[str]:
    """Every state of the bar before the last one of its line: what Keras drew mid-epoch."""
    text = (FIXTURES / name).read_bytes().decode()
    shown = [part.replace("\x08", "") for line in text.split("\n") for part in line.split("\r")[:-1]]
    return [part for part in shown if part.strip()]


@pytest.mark.parametrize("name", [k for k in KINDS if "verbose1" in k])
def test_a_bar_drawn_mid_epoch_is_no_result(name):
    redraws = bar_redraws(name)
    assert len(redraws) > 20
    if name.startswith("tf_keras"):
        assert all("ETA:" in part for part in redraws)
        assert [part for part in redraws if result(part)] == []
    else:
        # Keras 3 shows no "ETA:": its bar mid-epoch is told by its count. (Its redraw at the last
        # step, before validation, looks like the result and is never a line of its own.)
        early = [part for part in redraws if not re.search(r"\b(\d+)/\1\b", re.sub(r"\x1b\[[0-9;]*m", "", part))]
        assert len(early) > 20 and [part for part in early if result(part)] == []
    # A task that dies mid-epoch leaves its bar as its last line: no epoch comes of it.
    state, _ = read_line(KerasState(), "Epoch 2/3")
    assert read_line(state, " 4/10 [===========>..................] - ETA: 0s - loss: 1.1724")[1] is None


def test_the_evaluate_line_after_the_last_epoch_is_no_epoch():
    lines = folded("tf_keras_verbose2_plain.log")
    assert lines[-2].startswith("1/1 - ") and result(lines[-2]) is not None  # shaped like a result...
    assert len(records(lines)) == 3  # ...but no Epoch line announced it


def test_headers_and_other_lines():
    assert header("Epoch 3/40") == (3, 40) and header("\x1b[1mEpoch 3/40\x1b[0m ") == (3, 40)
    assert header("Epoch 3/40 done") is None and header("epoch 3/40") is None
    for line in ("57/57 [====] - 2s 30ms/step - loss: high", "57/57 steps done", "3/4 of the data - loss: 1.0",
                 "57/57 - 2s - 30ms/step", "10/10 [====] - 1s 3ms/step - loss: 0.5 and more"):
        assert result(line) is None, line
    assert result("10/10 - 3ms/step - loss: 0.5000")["epoch_seconds"] is None  # no time for the epoch given


def test_verbose1_line_from_the_brief():
    state = read_line(KerasState(), "Epoch 3/40")[0]
    record = read_line(state, "57/57 [==============================] - 2s 30ms/step - loss: 0.4321 - accuracy: 0.8765"
                              " - val_loss: 0.5 - val_accuracy: 0.85")[1]
    assert record == {"kind": "epoch", "epoch": 3, "epochs": 40, "loss": 0.4321, "accuracy": 0.8765, "val_loss": 0.5,
                      "val_accuracy": 0.85, "steps": 57, "epoch_seconds": 2.0, "step_seconds": 0.03, "source": "keras"}


def test_metric_lines_reads_across_blocks_and_gives_each_line_its_place():
    state, found = metric_lines(b"loading\nEpoch 1/2\n")
    assert found == [] and state.epoch == 1
    state, found = metric_lines(b"hello\n10/10 - 1s - loss: 0.5000 - 12ms/epoch - 1ms/step\nEpoch 2/2\n", state)
    assert [(index, record["epoch"], record["loss"]) for index, record in found] == [(1, 1, 0.5)]
    assert state.epoch == 2


def test_a_task_that_prints_metric_lines_keeps_them_as_its_only_source():
    block = (b"Epoch 1/2\n"
             b'TFLAUNCH_METRIC {"kind":"epoch","epoch":1,"loss":0.25}\n'
             b"10/10 - 1s - loss: 0.2500 - 12ms/epoch - 1ms/step\n"
             b"Epoch 2/2\n"
             b"10/10 - 1s - loss: 0.2000 - 12ms/epoch - 1ms/step\n")
    state, found = metric_lines(block)
    assert found == [(1, {"kind": "epoch", "epoch": 1, "loss": 0.25})] and state.explicit
    # and in every block after it
    assert metric_lines(b"Epoch 3/3\n10/10 - 1s - loss: 0.1 - 1ms/step\n", state)[1] == []
    # a malformed metric line is still the task's choice, and stays a plain line
    state, found = metric_lines(b"TFLAUNCH_METRIC {oops\nEpoch 1/1\n1/1 - 1s - loss: 0.1 - 1ms/step\n")
    assert found == [(0, None)] and state.explicit


def test_plain_output_costs_one_search():
    state = KerasState()
    assert metric_lines(b"line\n" * 1000, state) == (state, [])


@pytest.mark.parametrize("name", [n for n in KINDS if "tf_keras_verbose2" not in n])
def test_where_keras_rounds_to_whole_seconds_the_lines_arrival_times_the_epoch(name):
    # Two runs whose epochs print the same whole seconds: their times come from when the lines arrived.
    times = {}
    for run, later in enumerate([0.3, 0.7]):
        state, clock, found = KerasState(), 100.0, []
        for line in folded(name):
            figures = result(line)
            if figures is not None and state.epoch is not None:
                clock += figures["epoch_seconds"] + later  # Keras's rounded figure, and what it left out
            state, record = read_line(state, line, clock)
            if record is not None:
                found.append(record)
            clock += 0.01
        assert [r["epoch_seconds"] for r in found] == [pytest.approx(r["keras_seconds"] + later, abs=0.05) for r in found]
        times[run] = [r["epoch_seconds"] for r in found]
    assert all(a < b for a, b in zip(times[0], times[1]))


def test_keras_own_milliseconds_and_an_arrival_that_disagrees_are_kept_as_keras_said():
    state = read_line(KerasState(), "Epoch 1/2", 10.0)[0]
    line = "10/10 - 2s - loss: 1.1031 - accuracy: 0.3625 - 951ms/epoch - 95ms/step"
    assert read_line(state, line, 10.5)[1]["epoch_seconds"] == 0.951  # Keras's milliseconds
    state = read_line(KerasState(), "Epoch 1/2", 10.0)[0]
    line = "10/10 [==============================] - 2s 30ms/step - loss: 0.4321"
    record = read_line(state, line, 10.0)[1]  # read in one block with its header: no time between them
    assert record["epoch_seconds"] == 2.0 and "keras_seconds" not in record
    assert read_line(state, line, 15.0)[1]["epoch_seconds"] == 2.0  # 5 s: the pump fell behind
    assert read_line(state, line, 12.3)[1] == {**record, "epoch_seconds": 2.3, "keras_seconds": 2.0}


@pytest.mark.parametrize("name", ["keras3_verbose1_plain.log", "tf_keras_verbose1_plain.log"])
def test_a_line_written_while_a_bar_is_drawn_starts_a_line_of_its_own(name):
    # A warning on stderr (the same pipe) arrives between two updates of the bar: it is not glued to it.
    # (Each update is one write: backspaces over the last, a carriage return, the bar.)
    raw = (FIXTURES / name).read_bytes()
    first_update = raw.index(b"\n", raw.index(b"Epoch 2/3")) + 1
    second_update = raw.index(b"\x08", first_update + 2)
    warning = b"W0000 00:00:1795357848.580920   20415 some_file.cc:90] a warning mid-epoch\n"
    splitter = LineSplitter()
    lines = [line.decode() for chunk in (raw[:second_update], warning, raw[second_update:])
             for line in splitter.feed(chunk)] + [line.decode() for line in splitter.flush()]
    assert warning.decode().rstrip("\n") in lines
    assert [r["epoch"] for r in records(lines)] == [1, 2, 3]  # the epochs are read as before


@pytest.mark.parametrize("name", ["keras3_verbose1_plain.log", "tf_keras_verbose1_plain.log",
                                  "keras3_verbose1_nan.log", "tf_keras_verbose1_odd.log"])
def test_the_programs_own_print_while_a_bar_is_drawn_starts_a_line_of_its_own(name):
    # A callback's print between two updates of the bar: a terminal shows it glued to the bar's state.
    raw = (FIXTURES / name).read_bytes()
    first_update = raw.index(b"\n", raw.index(b"Epoch 2/3")) + 1
    second_update = raw.index(b"\x08", first_update + 2)
    printed = b"saving a checkpoint at step 3\n"
    splitter = LineSplitter()
    lines = [line.decode() for chunk in (raw[:second_update], printed, raw[second_update:])
             for line in splitter.feed(chunk)] + [line.decode() for line in splitter.flush()]
    assert "saving a checkpoint at step 3" in lines, [line for line in lines if "saving" in line]
    assert [r["epoch"] for r in records(lines)] == [1, 2, 3]


@pytest.mark.parametrize("line", [
    " 3/10 [====>.........................] - ETA: 3s - loss: 1.0913 - accuracy: 0.4750 and more",
    "10/10 [==============================] - 1s 77ms/step - loss: 1.0913 - lr: 1.0000e-04",
    " 3/10 [====>.........................] - ETA: 1:02 - loss: nan",
    "\x1b[1m 3/10\x1b[0m \x1b[32m━━━━━━\x1b[0m\x1b[37m━━━━━━━━━━━━━━\x1b[0m \x1b[1m1s\x1b[0m 87ms/step - loss: 1.19"])
def test_a_bar_state_alone_is_one_line(line):
    assert unglued(line) == line
