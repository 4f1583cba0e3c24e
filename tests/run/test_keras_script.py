"""Real tf_keras scripts that print no metric lines, trained by tflaunch: their own epoch lines are the run's metrics.

The tests of an unchanged tutorial script (tests/helpers/keras_tutorial.py, Model.fit with its default
progress bars on two workers) share one run of it.
"""

from __future__ import annotations

import json
import re

import pytest

from conftest import HELPERS, Finished, Tflaunch

pytestmark = [pytest.mark.slow, pytest.mark.tensorflow, pytest.mark.timeout(300)]

TUTORIAL = "keras_tutorial"  # the xdist_group of the tests that read its run


def metrics_of(done) -> list[dict]:
    return [json.loads(line) for line in (done.run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def tutorial(tmp_path_factory) -> tuple[Finished, Tflaunch]:
    """One ``tflaunch --local 2`` of the tutorial script, and a Tflaunch whose log folder holds it."""
    path = tmp_path_factory.mktemp(TUTORIAL)
    launcher = Tflaunch(path / "logs", path)
    return launcher.run("--local", "2", "--", "python", str(HELPERS / "keras_tutorial.py"), timeout=240), launcher


@pytest.mark.xdist_group(TUTORIAL)
def test_keras_tutorial_script_trains_unchanged(tutorial):
    done, _ = tutorial
    assert done.returncode == 0, done.stderr[-3000:]
    assert "TF_USE_LEGACY_KERAS=1 set for every task" in done.stderr
    losses = [
        json.loads(next(l for l in done.task_output(n).splitlines() if l.startswith("TUTORIAL_LOSSES "))[16:])
        for n in ("worker-0", "worker-1")
    ]
    assert len(losses[0]) == 3 and losses[0] == losses[1]


@pytest.mark.xdist_group(TUTORIAL)
def test_a_keras_script_gets_metrics_console_epochs_and_a_report(tutorial):
    done, launcher = tutorial
    assert done.returncode == 0, done.stderr[-3000:]
    assert "TFLAUNCH_METRIC" not in done.task_output("worker-0")
    records = metrics_of(done)
    for task in ("worker-0", "worker-1"):
        mine = [r for r in records if r["task"] == task]
        assert [(r["kind"], r["epoch"], r["epochs"], r["steps"], r["source"]) for r in mine] == \
            [("epoch", n, 3, 10, "keras") for n in (1, 2, 3)]
        assert all(isinstance(r["loss"], float) and 0 <= r["accuracy"] <= 1 for r in mine)
    # All-reduced under MultiWorkerMirroredStrategy: the chief's line once, no disagreement.
    epoch_lines = [line for line in done.stdout.splitlines() if re.match(r"worker-\S+ \| epoch \d", line)]
    assert [line.split("  ")[0] for line in epoch_lines] == [f"worker-0 | epoch {n}/3" for n in (1, 2, 3)]
    assert "differs" not in done.stdout
    loss = [r["loss"] for r in records if r["task"] == "worker-0"]
    assert f"loss {loss[2]:.3f}" in epoch_lines[2]

    report = launcher.run("report")
    assert report.returncode == 0, report.stderr
    rows = [line.split() for line in report.stdout.splitlines() if re.match(r"\s+\d+\s+\d", line)]
    assert [(int(row[0]), float(row[1])) for row in rows] == [(n, loss[n - 1]) for n in (1, 2, 3)]
    assert "worker-0 (chief):" in report.stdout and "ACCURACY" in report.stdout


SGR = re.compile(rb"\x1b\[[0-9;]*m")
# The last drawing of an epoch's progress bar, tf_keras's (Keras 3's: tests/run/console/test_console_run.py).
BAR = rb"10/10 \[=+\] - \d+s \d+(?:ms|us|s)/step - loss: [\d.]+ - accuracy: [\d.]+"


@pytest.mark.xdist_group(TUTORIAL)
def test_keras_progress_bars_leave_no_backspaces_in_merged_log(tutorial):
    done, _ = tutorial
    assert done.returncode == 0, done.stderr
    raw = (done.run_dir / "worker-0.log").read_bytes()
    assert raw.count(b"\x08") > 80 and b"\r" in raw  # the task really drew a bar in place
    merged = (done.run_dir / "merged.log").read_bytes()
    assert b"\x08" not in merged and b"\r" not in merged
    texts = [SGR.sub(b"", line.split(b" | ", 1)[1]) for line in merged.splitlines() if b"] worker-0 | " in line]
    assert b"" not in texts  # no empty line left where a bar was redrawn
    for epoch in (1, 2, 3):
        at = texts.index(b"Epoch %d/3" % epoch)
        assert re.fullmatch(BAR, texts[at + 1]), texts[at + 1]
    assert "\x08" not in done.stdout and "\r" not in done.stdout
    # Keras's own "Epoch 1/3" line, the same on both workers: shown once for the two.
    assert "worker-[0,1] | Epoch 1/3" in SGR.sub(b"", done.stdout.encode()).decode().splitlines(), done.stdout
    console = [SGR.sub(b"", line.encode()) for line in done.stdout.splitlines() if line.startswith("worker-0 | ")]
    # The line that ends each epoch is shown as the epoch line it is read as (a script with no metric lines).
    epochs = [line for line in console
              if re.fullmatch(rb"worker-0 \| epoch [123]/3  loss [\d.]+  acc [\d.]+  [\d.]+ s  [\d,]+ ms/step", line)]
    assert len(epochs) == 3, console


def test_the_documented_callback_is_the_only_source(tflaunch):
    done = tflaunch.run("--local", "1", "--", "python", str(HELPERS / "keras_fit.py"), "2", "callback", timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    records = metrics_of(done)
    assert [(r["epoch"], r.get("source")) for r in records] == [(1, None), (2, None), (3, None)]
    assert all("sparse_categorical_accuracy" in r and r["task"] == "worker-0" for r in records)
    assert re.search(r"^worker-0 \| 5/5 - \d+s - .*loss: ", done.stdout, re.MULTILINE)  # Keras's line, plain
