"""A script that prints only what Keras prints: its epochs reach metrics.jsonl, the console, report,
logs --grep and the start watchdog, as the trainer's metric lines do. The tasks replay Model.fit's
real output (tests/fixtures/keras), so no TensorFlow is needed here; test_keras_script.py runs it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "keras"

pytestmark = pytest.mark.timeout(120)


def replay(name: str, before: str = "") -> str:
    """A task command that writes a fixture's bytes as Keras wrote them (after ``before``)."""
    return (f"import sys; sys.stdout.write({before!r}); sys.stdout.flush(); "
            f"sys.stdout.buffer.write(open({str(FIXTURES / name)!r}, 'rb').read())")


def metrics(done) -> list[dict]:
    return [json.loads(line) for line in (done.run_dir / "metrics.jsonl").read_text().splitlines()]


def test_keras_epoch_lines_are_the_runs_metrics(tflaunch):
    done = tflaunch.run("--local", "2", "--", sys.executable, "-c", replay("tf_keras_verbose1_odd.log"))
    assert done.returncode == 0, done.stderr
    records = metrics(done)
    assert [(r["task"], r["epoch"], r["source"]) for r in records if r["task"] == "worker-0"] == \
        [("worker-0", n, "keras") for n in (1, 2, 3)]
    assert {r["task"] for r in records} == {"worker-0", "worker-1"}
    # The console: one epoch line per epoch, the chief's, in place of Keras's own line.
    shown = [line for line in done.stdout.splitlines() if "| epoch " in line]
    assert shown == [
        "worker-0 | epoch 1/3  loss 1.160  val_loss 1.074  sparse_categorical_accuracy 0.287  "
        "val_sparse_categorical_accuracy 0.312  lr 1.00e-04  3.00 s  114 ms/step",
        "worker-0 | epoch 2/3  loss 1.160  val_loss 1.074  sparse_categorical_accuracy 0.287  "
        "val_sparse_categorical_accuracy 0.312  lr 1.00e-04  1.00 s  81 ms/step",
        "worker-0 | epoch 3/3  loss 1.160  val_loss 1.074  sparse_categorical_accuracy 0.287  "
        "val_sparse_categorical_accuracy 0.312  lr 1.00e-04  1.00 s  100 ms/step"]
    assert "10/10 [====" not in done.stdout  # the epochs' own lines are the epoch lines above
    assert "1/1 [======" in done.stdout  # evaluate's line is no epoch: shown as written
    assert "training: 3 epochs" in done.stderr

    report = tflaunch.run("report")
    assert report.returncode == 0, report.stderr
    assert "worker-0 (chief):" in report.stdout and "SPARSE_CATEGORICAL_ACCURACY" in report.stdout
    assert "    3  1.1599         -    1.0737        -    1.000          -" in report.stdout

    compare = tflaunch.run("compare", "latest", "latest")
    assert compare.returncode == 0, compare.stderr
    assert "90.50" in compare.stdout  # step ms: Keras's time per step after the first epoch, averaged


def test_logs_grep_matches_what_the_console_showed(tflaunch):
    done = tflaunch.run("--local", "2", "--", sys.executable, "-c", replay("tf_keras_verbose1_odd.log"))
    assert done.returncode == 0, done.stderr
    found = tflaunch.run("logs", "--grep", r"epoch 2/3  loss 1\.160")
    assert [line.split(" | ")[1] for line in found.stdout.splitlines()] == [
        "10/10 [==============================] - 1s 81ms/step - loss: 1.1600 - sparse_categorical_accuracy: "
        "0.2875 - val_loss: 1.0737 - val_sparse_categorical_accuracy: 0.3125 - lr: 1.0000e-04"] * 2
    assert tflaunch.run("logs", "--grep", r"^worker-1 \| epoch 3/3 ").stdout.count("\n") == 1
    assert tflaunch.run("logs", "--task", "worker-0", "--grep", r"^worker-0 \| epoch 1/3").stdout.startswith("10/10 [")
    assert tflaunch.run("logs", "--grep", r"^Epoch 3/3$").stdout.count("\n") == 2  # the text without its prefix
    assert tflaunch.run("logs", "--grep", "ETA").stdout == ""  # the bar as a terminal left it


def test_a_task_that_prints_metric_lines_keeps_them(tflaunch):
    line = 'TFLAUNCH_METRIC {"kind":"epoch","epoch":1,"epochs":3,"loss":0.5}\n'
    done = tflaunch.run("--local", "1", "--", sys.executable, "-c", replay("keras3_verbose2_plain.log", line))
    assert done.returncode == 0, done.stderr
    assert [(r["epoch"], r.get("source")) for r in metrics(done)] == [(1, None)]
    assert "10/10 - 1s - 140ms/step - accuracy: 0.2750" in done.stdout  # Keras's lines stay plain lines


def test_keras_epochs_are_progress_for_the_start_watchdog(tflaunch):
    code = replay("keras3_verbose2_nan.log") + "; import time; time.sleep(4)"
    done = tflaunch.run("--local", "1", "--start-timeout", "2", "--", sys.executable, "-c", code)
    assert done.returncode == 0, done.stderr
    assert [r["loss"] for r in metrics(done)] == [None, None, None]
