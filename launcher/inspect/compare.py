"""``tflaunch compare``: the throughput figures of several runs side by side, each against the first."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..records.states import RunStatus
from .report import is_number, num, table
from .runs import NoMetricsError, Run, epoch_records, final_record
from ..records.states import Role

EPOCH_NOTE = ("epoch time and samples/s: means over the epochs after the first (the warm-up), or of the first "
              "when it is the only one; step time = global batch / samples/s, or Keras's time per step")
SPEEDUP_NOTE = "(speedup: epoch time of the first run / epoch time of this run)"


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
    return Comparison(run.run_id, run.record.source, run.status.value, workers, batch, len(records),
                      [r["epoch"] for r in steady], _mean(seconds), step, rate,
                      final_record(run, metrics).get("test_accuracy"), None)


def compare_lines(rows: list[Comparison]) -> list[str]:
    body = [[r.run_id, r.source, r.workers, r.global_batch, num(r.epoch_seconds, 3),
             num(r.step_seconds * 1000 if r.step_seconds else None, 2), num(r.samples_per_second, 1),
             r.test_accuracy, f"{r.speedup:.2f}x" if r.speedup else "-"] for r in rows]
    lines = [EPOCH_NOTE, ""]
    lines += table(["RUN", "CLUSTER", "WORKERS", "GLOBAL BATCH", "EPOCH S", "STEP MS", "SAMPLES/S", "TEST ACC",
                    "SPEEDUP"], body, "llrrrrrrr")
    lines += ["", SPEEDUP_NOTE]
    lines += [f"note: run {r.run_id} is {r.status}: its figures are partial" for r in rows if r.status == RunStatus.RUNNING]
    return lines


def compare_json(rows: list[Comparison]) -> dict[str, Any]:
    return {"baseline": rows[0].run_id, "epoch_time": EPOCH_NOTE, "speedup": SPEEDUP_NOTE.strip("()"),
            "runs": [asdict(r) for r in rows]}
