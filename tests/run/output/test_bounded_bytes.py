"""Whatever a task prints, tflaunch writes and holds a bounded number of bytes: metrics.jsonl and the
console on a file keep their start and end and say how much they left out, a metric line over its
limit is no metric, and tflaunch's peak memory stays far below what the task printed."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import TASK

pytestmark = pytest.mark.slow

LIMIT = 256 << 10  # --log-max-size of these runs: metrics.jsonl's limit, and the console file's
MARKER = re.compile(rb"\[\.\.\. tflaunch: ([0-9,]+) bytes \([^)]*\) left out here \.\.\.\]\n")


def _left_out(data: bytes) -> int:
    found = MARKER.findall(data)
    assert len(found) == 1, found
    return int(found[0].replace(b",", b""))


def test_metrics_jsonl_keeps_its_first_and_latest_records_within_its_limit(tflaunch):
    # 3,000 records of about 1 KB: 3 MB of metrics against a limit of 256 KiB.
    done = tflaunch.run("--local", "1", "--log-max-size", str(LIMIT), "--", sys.executable, TASK,
                        "metric-flood:3000:1000")
    assert done.returncode == 0, done.stderr
    data = (done.run_dir / "metrics.jsonl").read_bytes()
    assert len(data) <= LIMIT + 200
    assert not list(done.run_dir.glob("metrics.jsonl.part-*"))  # stitched when the run ended
    records = [json.loads(line) for line in data.splitlines() if line.startswith(b"{")]
    epochs = [record["epoch"] for record in records]
    assert epochs[0] == 1 and epochs[-1] == 3000  # its start and its end
    assert epochs == sorted(epochs) and len(epochs) < 3000
    assert _left_out(data) > 2_000_000
    # The readers skip the marker, and say what it left out.
    report = tflaunch.run("report", done.run_dir.name)
    assert report.returncode == 0, report.stderr
    assert "epoch" in report.stdout and "metrics.jsonl outgrew its size limit" in report.stdout
    assert "3000" in report.stdout.replace(",", "")


def test_a_metric_line_over_the_limit_is_no_metric_and_tflaunch_says_so_once(tflaunch):
    done = tflaunch.run("--local", "1", "--", sys.executable, TASK, "metric-flood:3:100000",
                        "print:TFLAUNCH_METRIC {\"kind\": \"epoch\", \"epoch\": 9, \"loss\": 0.5}")
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in (done.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [record["epoch"] for record in records] == [9]
    assert done.stderr.count("over the limit of 64.0 KiB") == 1, done.stderr
    assert re.search(r"worker-0 printed a metric line of (99|100),\d{3} bytes", done.stderr), done.stderr
    assert b"over the limit of 64.0 KiB" in done.merged
    assert len(done.task_output("worker-0")) > 300_000  # the log keeps them


def _run_to_file(tflaunch, path: Path, *args: str) -> tuple[int, int]:
    """(exit code, peak RSS in KiB) of a tflaunch whose console is the file ``path``, as under sbatch."""
    with open(path, "wb") as out:
        proc = subprocess.Popen(tflaunch.argv(*tflaunch._with_log_dir(args)), cwd=tflaunch.cwd, env=tflaunch.env(),
                                stdout=out, stderr=out)
        tflaunch._started.append(proc)
        peak = 0
        while proc.poll() is None:
            try:  # VmHWM only grows: the last reading before it exits is its peak
                status = Path(f"/proc/{proc.pid}/status").read_text()
                peak = max(peak, int(re.search(r"VmHWM:\s+(\d+)", status)[1]))
            except (OSError, TypeError):
                pass
            time.sleep(0.02)
    return proc.returncode, peak


def test_the_console_on_a_file_keeps_its_start_and_end_within_its_limit(tflaunch, tmp_path):
    console = tmp_path / "slurm-1.out"
    code, _ = _run_to_file(tflaunch, console, "--local", "1", "--log-max-size", str(LIMIT), "--",
                           sys.executable, TASK, "flood:60000")  # about 3 MB of console lines
    assert code == 0
    data = console.read_bytes()
    # A quarter of the limit as it came, then the tail (at most three quarters): plus tflaunch's messages.
    assert len(data) <= LIMIT + 8192
    assert data.count(b"worker-0 | worker-0 line 0 \n") == 1  # the start
    assert b"worker-0 | worker-0 line 59999 " + b"x" * (59999 % 50) + b"\n" in data  # the end
    assert b"this file reached its size limit: the task lines from here on are left out of it" in data
    shown = len(re.findall(rb"worker-0 \| worker-0 line \d+", data))
    assert 1000 < shown < 60000
    assert _left_out(data) > 2_000_000
    assert b"succeeded" in data  # the messages after it are all there


@pytest.mark.timeout(120)
def test_tflaunch_memory_stays_flat_under_a_flood_of_large_metric_lines(tflaunch, tmp_path):
    # 3,000 records of 20 KB: 60 MB of metric lines. A quiet tflaunch peaks near 25 MB; its fixed
    # buffers (the console's queue of 16 MiB, twice that for metric lines; the pump's sweep of
    # 16 MiB and merged.log's batch of 4 MiB) bound it near 80 MB; 200 MB leaves room for a
    # noisy machine, and is far below what holding the flood (or reading all of it back) takes.
    code, peak = _run_to_file(tflaunch, tmp_path / "console.out", "--local", "1", "--", sys.executable, TASK,
                              "metric-flood:3000:20000")
    assert code == 0
    assert 0 < peak < 200 << 10, f"peak RSS {peak / 1024:.0f} MB"
