"""A restarted run stays live: attempts 2 and 3, and a task restarted alone, reach the console,
merged.log, the metrics and ``tflaunch status`` while they run (tests/watching.py), locally and in a
Slurm allocation; tests/transports/test_ssh.py does the same over ssh. The start and hang watchdogs
see a restarted attempt's progress as it is made.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import ROOT
from polling import wait_for
from watching import ATTEMPTS, Console, live_record, watch_rounds

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_local_attempts_two_and_three_are_live(tflaunch, tmp_path):
    gates = tmp_path / "gates"
    gates.mkdir()
    proc = tflaunch.start("--local", "3", "--max-restarts", "2", "--restart-delay", "0", "--start-timeout", "3",
                          "--", "python", ATTEMPTS, str(gates), "3")
    console = Console(proc)

    def status_shows(run_dir: Path, attempt: int) -> None:
        if attempt == 2:  # the start watchdog sees the attempt's progress: it lets it run past 3 s
            time.sleep(5)
            assert "start timeout" not in console.text()
        done = subprocess.run(tflaunch.argv("status", "--json", "--log-dir", str(tflaunch.log_dir), str(run_dir)),
                              capture_output=True, text=True, env=tflaunch.env(), timeout=60)
        state = json.loads(done.stdout)
        assert state["status"] == "running" and state["attempt"] == attempt, state

    run_dir = watch_rounds(console, tflaunch.latest_run, gates, lambda _: {"worker-0", "worker-1", "worker-2"}, 3,
                           status=status_shows)
    assert proc.wait(timeout=60) == 0, console.text()[-3000:]
    assert [a["outcome"] for a in live_record(run_dir)["attempts"]] == ["failed", "failed", "succeeded"]


EPOCHS_AFTER_A_RESTART = """
import os, sys, time
if os.environ["TFLAUNCH_ATTEMPT"] == "1":
    print("attempt 1", flush=True)
    time.sleep(0.5)
    sys.exit(1 if os.environ["TFLAUNCH_TASK"] == "worker-1" else time.sleep(60))
for epoch in range(1, 21):  # 6 s of epochs, each a metric line and almost no CPU
    print('TFLAUNCH_METRIC {"kind": "epoch", "epoch": %d, "epochs": 20, "loss": 0.5}' % epoch, flush=True)
    time.sleep(0.3)
"""


def test_the_hang_watchdog_sees_a_restarted_attempts_progress(tflaunch):
    # Both tasks print in attempt 1, so their logs are open when the cluster restarts. Attempt 2
    # trains for 6 s, an epoch line every 0.3 s, under a 3 s hang timeout: its lines must reach the
    # watchdog as they are written, or it is taken for a hang.
    done = tflaunch.run("--local", "2", "--max-restarts", "1", "--restart-delay", "0", "--hang-timeout", "3",
                        "--", "python", "-c", EPOCHS_AFTER_A_RESTART)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "hang timeout" not in done.stderr, done.stderr[-3000:]
    assert [a["outcome"] for a in done.record["attempts"]] == ["failed", "succeeded"]


def test_a_task_restarted_in_place_stays_live(tflaunch, tmp_path):
    gates = tmp_path / "gates"
    gates.mkdir()
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("restart_policy: {worker: task}\ntask_restarts: 2\n"
                       "worker:\n  - host: localhost\n    port: auto\n  - host: localhost\n    port: auto\n")
    proc = tflaunch.start(str(cluster), "--", "python", ATTEMPTS, str(gates), "3", "worker-1", "--in-place")
    console = Console(proc)
    # worker-0 starts once; worker-1 starts three times within attempt 1.
    run_dir = watch_rounds(console, tflaunch.latest_run, gates,
                           lambda r: {"worker-0", "worker-1"} if r == 1 else {"worker-1"}, 3, attempt_of=lambda r: 1)
    assert proc.wait(timeout=60) == 0, console.text()[-3000:]
    record = live_record(run_dir)
    assert [a["outcome"] for a in record["attempts"]] == ["succeeded"]
    assert {t["name"]: t["restarts"] for t in record["tasks"]} == {"worker-0": 0, "worker-1": 2}


@pytest.mark.slurm
def test_attempts_in_a_slurm_allocation_are_live(slurm, tmp_path):
    gates = tmp_path / "gates"
    gates.mkdir()
    logs = tmp_path / "logs"
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\nexec {sys.executable} -m launcher --slurm --max-restarts 2 --restart-delay 0 "
                      f"--log-dir {logs} -- python {ATTEMPTS} {gates} 3\n")
    out = tmp_path / "job.out"
    submitted = slurm.run("sbatch", "--parsable", f"--output={out}", f"--chdir={tmp_path}", "--nodes=2",
                          f"--export=ALL,PYTHONPATH={ROOT}", str(script))
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]

    class JobOutput(Console):  # the job's console is its output file, read as it grows
        def __init__(self):
            self.lines, self._lock = [], threading.Lock()
            self._stop = threading.Event()
            threading.Thread(target=self._follow, daemon=True).start()

        def _follow(self):
            offset, partial = 0, ""
            while not self._stop.is_set():
                if out.exists():
                    with open(out, errors="replace") as f:
                        f.seek(offset)
                        text = f.read()
                        offset = f.tell()
                    *complete, partial = (partial + text).split("\n")
                    with self._lock:
                        self.lines += [(time.time(), line) for line in complete]
                time.sleep(0.05)

    console = JobOutput()

    def run_dir_of():
        found = sorted(p for p in logs.glob("*") if (p / "run.json").exists()) if logs.exists() else []
        return found[-1] if found else None

    try:
        run_dir = watch_rounds(console, run_dir_of, gates, lambda _: {"worker-0", "worker-1"}, 3)
        wait_for(lambda: live_record(run_dir)["status"] == "succeeded", timeout=60,
                 message=lambda: f"the run to succeed: {live_record(run_dir)}")
    finally:
        console._stop.set()
        slurm.run("scancel", job)
    assert [a["outcome"] for a in live_record(run_dir)["attempts"]] == ["failed", "failed", "succeeded"]
