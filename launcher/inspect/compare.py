"""``tflaunch compare``: the throughput and final figures of several runs side by side, each against
the first, with the command-line arguments in which they differ, and a word when they ran different
programs (their figures then compare different models)."""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field
from typing import Any

from ..records.states import RunStatus
from .report import is_number, num, table
from .runs import NoMetricsError, Run, epoch_records, final_record
from ..records.states import Role

EPOCH_NOTE = ("epoch time and samples/s: means over the epochs after the first (the warm-up), or of the first "
              "when it is the only one; step time = global batch / samples/s, or Keras's time per step")
SPEEDUP_NOTE = "(speedup: epoch time of the first run / epoch time of this run)"
FINAL_NOTE = "(final loss and accuracy: the last epoch's training figures)"


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


@dataclass
class Comparison:
    run_id: str
    source: str
    status: str
    workers: int
    global_batch: int | None
    epochs: int
    steady_epochs: list[int]  # the epochs the means are taken over
    epoch_seconds: float | None
    step_seconds: float | None
    samples_per_second: float | None
    test_accuracy: float | None
    speedup: float | None
    final_loss: float | None = None  # the last epoch's
    final_accuracy: float | None = None
    argv: list[str] = field(default_factory=list)  # the command its training tasks ran


def compare_runs(runs: list[Run]) -> list[Comparison]:
    """The seeds' comparison table: throughput figures of each run, speedup against the first."""
    rows = [_compare_one(run) for run in runs]
    base = rows[0].epoch_seconds
    for row in rows:
        if base and row.epoch_seconds:
            row.speedup = base / row.epoch_seconds
    return rows


def _compare_one(run: Run) -> Comparison:
    metrics = run.metrics()
    chief = run.chief(metrics)
    records = epoch_records(metrics, chief) if chief else []
    if not records:
        detail = "is still running and has reported no epoch yet" if run.live else "has no epoch metrics"
        raise NoMetricsError(f"run {run.run_id} {detail}; compare needs at least one epoch per run")
    # The first epoch carries tracing and warm-up, so it is left out unless it is all there is.
    steady = records[1:] or records
    seconds = [r["epoch_seconds"] for r in steady if isinstance(r.get("epoch_seconds"), (int, float))]
    rates = [r["samples_per_second"] for r in steady if isinstance(r.get("samples_per_second"), (int, float))]
    batch = records[-1].get("global_batch")
    rate = _mean(rates)
    # step time = epoch time / steps, with steps = samples/s x epoch time / global batch, which is
    # global batch / samples/s: the steady-state time of one training step, validation left out.
    # Keras's own epoch lines give no batch, but that step time itself (step_seconds).
    steps = [r["step_seconds"] for r in steady if is_number(r.get("step_seconds"))]
    step = batch / rate if batch and rate else _mean(steps)
    workers = sum(1 for t in run.tasks if t.role in (Role.CHIEF, Role.WORKER))
    last = records[-1]
    accuracy = next((last[key] for key in ("accuracy", "sparse_categorical_accuracy", "categorical_accuracy")
                     if is_number(last.get(key))), None)
    argv = next((list(t.argv) for t in run.tasks if t.name == chief), [])
    return Comparison(run.run_id, run.record.source, run.status.value, workers, batch, len(records),
                      [r["epoch"] for r in steady], _mean(seconds), step, rate,
                      final_record(run, metrics).get("test_accuracy"), None,
                      last.get("loss") if is_number(last.get("loss")) else None, accuracy, argv)


def _options(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """A command as its program (the interpreter and its script or ``-m`` module, or the program
    alone) and its arguments: options by name (``--lr 0.1`` and ``--lr=0.1`` alike:
    ``{"--lr": "0.1"}``; a flag alone: ``""``), other words in order under ``"(other arguments)"``."""
    words = list(argv)
    cut = 1
    if len(words) > 2 and words[1] in ("-m", "-c"):
        cut = 3
    elif len(words) > 1 and not words[0].endswith(".py") and words[1].endswith(".py"):
        cut = 2
    program, rest = words[:cut], words[cut:]
    options: dict[str, str] = {}
    others: list[str] = []
    index = 0
    while index < len(rest):
        word = rest[index]
        if word.startswith("-") and len(word) > 1:
            name, equals, value = word.partition("=")
            if not equals and index + 1 < len(rest) and not rest[index + 1].startswith("-"):
                index += 1
                value = rest[index]
            options[name] = value
        else:
            others.append(word)
        index += 1
    if others:
        options[OTHERS] = shlex.join(others)
    return program, options


OTHERS = "(other arguments)"


def differences(rows: list[Comparison]) -> list[str]:
    """Lines on how the runs' commands differ: a note when their programs differ (other scripts,
    other models), else the options whose values are not the same in every run."""
    if len(rows) < 2 or not all(row.argv for row in rows):
        return []
    parsed = [_options(row.argv) for row in rows]
    programs = [shlex.join(program) for program, _ in parsed]
    if len(set(programs)) > 1:
        return ["note: these runs ran different programs, so their figures may compare different models: "
                + "; ".join(f"{row.run_id}: {program}" for row, program in zip(rows, programs))]
    names = list(dict.fromkeys(name for _, options in parsed for name in options))
    differing = [name for name in names if len({options.get(name) for _, options in parsed}) > 1]
    if not differing:
        return ["arguments: the same in every run"]
    return ["arguments that differ: " + "; ".join(
        f"{row.run_id}: " + " ".join(_shown(name, options.get(name)) for name in differing)
        for row, (_, options) in zip(rows, parsed))]


def _shown(name: str, value: str | None) -> str:
    if value is None:
        return f"({name} not given)"
    if name == OTHERS:
        return value
    return name if value == "" else f"{name} {shlex.quote(value)}"


def compare_lines(rows: list[Comparison]) -> list[str]:
    body = [[r.run_id, r.source, r.workers, r.global_batch, num(r.epoch_seconds, 3),
             num(r.step_seconds * 1000 if r.step_seconds else None, 2), num(r.samples_per_second, 1),
             num(r.final_loss, 4), num(r.final_accuracy, 4), r.test_accuracy,
             f"{r.speedup:.2f}x" if r.speedup else "-"] for r in rows]
    lines = [EPOCH_NOTE, ""]
    lines += table(["RUN", "CLUSTER", "WORKERS", "GLOBAL BATCH", "EPOCH S", "STEP MS", "SAMPLES/S", "FINAL LOSS",
                    "FINAL ACC", "TEST ACC", "SPEEDUP"], body, "llrrrrrrrrr")
    lines += ["", SPEEDUP_NOTE, FINAL_NOTE]
    lines += differences(rows)
    lines += [f"note: run {r.run_id} is {r.status}: its figures are partial" for r in rows if r.status == RunStatus.RUNNING]
    return lines


def compare_json(rows: list[Comparison]) -> dict[str, Any]:
    return {"baseline": rows[0].run_id, "epoch_time": EPOCH_NOTE, "speedup": SPEEDUP_NOTE.strip("()"),
            "differences": differences(rows), "runs": [asdict(r) for r in rows]}
