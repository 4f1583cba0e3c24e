"""The figures a run shows add up: each epoch line's parts to its time, its rate to its steps, the
closing summary's training time to the epoch lines, and the task's time to its parts.

The lines are the trainer's own (trainer.metrics, with a clock of known times), read as tflaunch
reads them: the producer of the format and its consumer held to each other.
"""

from __future__ import annotations

import io
import re

import pytest

from launcher.records.metrics import parse_line, trained_seconds
from launcher.records.metrictext import epoch_parts, epoch_text, time_text
from launcher.run.lifecycle.summary import training_lines
from trainer import metrics as trainer_metrics

pytestmark = pytest.mark.unit

BATCH = 64
EPOCH_LINE = re.compile(r"(?P<whole>[\d.]+) s = (?:first step (?P<first>[\d.]+) \+ (?P<steady>[\d.]+)"
                        r"|training (?P<train>[\d.]+))(?: at (?P<rate>[\d,]+) samples/s)?"
                        r"(?: \+ validation (?P<validation>[\d.]+))?$")


def trainer_lines(epochs: list[tuple[list[float] | float, float]], ps: bool = False,
                  startup: float = 14.1, test: float = 0.8, rest: float = 0.3) -> list[dict]:
    """The records of the trainer's lines for epochs of ``(when each step ended, or when training
    ended under ParameterServerStrategy; validation seconds)``, times from the epoch's start, with a
    final record, as metrics.jsonl holds them."""
    stream = io.StringIO()
    reporter = trainer_metrics.Reporter("worker-0", stream)
    seconds = 0.0
    for number, (steps, validation) in enumerate(epochs, 1):
        ends = steps if isinstance(steps, list) else [steps]
        times = iter([0.0, *ends, ends[-1] + validation])
        clock = trainer_metrics.EpochClock(BATCH, clock=lambda: next(times))
        clock.begin()
        if ps:
            clock.train_done(steps=20)
        else:
            for _ in ends:
                clock.step_done()
        rate = None if ps and number == 1 else clock.samples_per_second()
        reporter.epoch(epoch=number, logs={"loss": 1.0 / number}, timing=clock.figures(rate),
                       global_batch=BATCH, replicas=2, epochs=len(epochs))
        seconds += ends[-1] + validation
    reporter.final(test_loss=0.1, test_accuracy=0.96, startup_seconds=startup, test_seconds=test,
                   total_seconds=startup + seconds + test + rest, epochs=len(epochs))
    return [dict(parse_line(line.encode()), attempt=1) for line in stream.getvalue().splitlines()]


# An MWMS epoch 1 whose first step traces for 6.21 s, then 15 steps at 0.05 s, validation 0.11 s.
FIRST_EPOCH = ([6.21 + 0.05 * step for step in range(16)], 0.11)
LATER_EPOCH = ([0.012 + 0.047 * step for step in range(16)], 0.09)


def shown(line: str) -> dict[str, float]:
    found = EPOCH_LINE.search(line)
    assert found, line
    return {key: float(value.replace(",", "")) for key, value in found.groupdict().items() if value is not None}


def test_an_epoch_line_adds_up_and_its_rate_is_its_steps_over_its_steady_time():
    records = trainer_lines([FIRST_EPOCH, LATER_EPOCH])
    first = epoch_text(records[0])
    assert first.endswith("7.07 s = first step 6.21 + 0.75 at 1,280 samples/s + validation 0.11"), first
    for record in records[:2]:
        parts = shown(epoch_text(record))
        assert parts["first"] + parts["steady"] + parts["validation"] == pytest.approx(parts["whole"], abs=1e-9)
        # the rate is the steps after the first over the time after the first, as shown (to rounding)
        steps = record["steps"] - 1
        assert steps * BATCH / parts["rate"] == pytest.approx(parts["steady"], abs=0.01)


def test_a_parameter_server_epoch_line_adds_up_without_per_step_times():
    records = trainer_lines([(5.2, 0.55), (0.9, 0.16)], ps=True)
    one, two = (epoch_text(r) for r in records[:2])
    assert one.endswith("5.75 s = training 5.20 + validation 0.55"), one  # no rate for the first: tracing
    parts = shown(two)
    assert parts["train"] + parts["validation"] == pytest.approx(parts["whole"])
    assert records[1]["steps"] * BATCH / parts["rate"] == pytest.approx(parts["train"], abs=0.01)


def test_the_summary_training_time_is_the_epoch_lines_and_the_task_time_adds_up():
    records = trainer_lines([FIRST_EPOCH, LATER_EPOCH, LATER_EPOCH])
    lines = training_lines(records, 1)
    epochs = sum(shown(epoch_text(r))["whole"] for r in records if r["kind"] == "epoch")
    head = re.match(r"training: 3 epochs in ([\d.]+) s, median", lines[0])
    assert head and float(head.group(1)) == pytest.approx(epochs, abs=0.05), lines
    assert lines[1] == "test: acc 0.960  loss 0.100"
    spent = re.fullmatch(r"worker-0's time: start-up ([\d.]+) s \+ epochs ([\d.]+) s \+ test ([\d.]+) s "
                         r"\+ the rest ([\d.]+) s = ([\d.]+) s", lines[2])
    assert spent, lines
    startup, epoch_part, test, rest, whole = map(float, spent.groups())
    assert (startup, test, rest) == (14.1, 0.8, 0.3)
    assert epoch_part == float(head.group(1))  # the same training time in both lines
    assert startup + epoch_part + test + rest == pytest.approx(whole)
    assert whole == pytest.approx(records[-1]["total_seconds"], abs=0.05)


def test_a_figure_that_does_not_fit_is_not_shown_as_a_sum():
    assert epoch_parts({"epoch_seconds": 1.0, "train_seconds": 2.0}) is None
    assert epoch_parts({"epoch_seconds": 1.0}) is None
    assert time_text({"startup_seconds": 1.0, "test_seconds": 1.0, "total_seconds": 3.0}, 5.0) is None
    # rounding never shows a sum that is off: the rest takes it, and start-up the last tenth
    assert time_text({"startup_seconds": 1.04, "test_seconds": 0.04, "total_seconds": 2.08}, 1.04) == (
        "start-up 1.0 s + epochs 1.0 s + test 0.0 s + the rest 0.1 s = 2.1 s")


def test_training_time_leaves_out_the_start_up_a_final_record_counts():
    records = trainer_lines([FIRST_EPOCH, LATER_EPOCH])
    assert trained_seconds(records) == pytest.approx(sum(r["epoch_seconds"] for r in records[:2]))
    assert records[-1]["total_seconds"] > trained_seconds(records) + 14
