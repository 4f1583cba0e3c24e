"""Watching a restarted run while it runs: its console, merged.log and metrics, round by round.

A round is an attempt of the cluster, or a start of a task restarted alone: tests/helpers/attempts.py
ticks in each until the test lets it end, and :func:`watch_rounds` checks, before letting it end,
that its lines reached the console and merged.log as they were written.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from datetime import datetime
from pathlib import Path

from conftest import HELPERS
from polling import wait_for

ATTEMPTS = str(HELPERS / "attempts.py")
TICK = re.compile(rb"^(\S+ \S+) \[(\d+)\] (\S+) \| \S+ round (\d+) tick \d+ at ([\d.]+)$", re.M)
# What "as it is written" allows here, on a shared 2-core machine: the pump reads a relayed log
# within a sweep (20 ms); before the fix, a restarted attempt's lines waited for its end.
LATE_AT_MOST = 3.0


class Console:
    """Lines a process writes to its stdout and stderr, each with the time it arrived."""

    def __init__(self, proc: subprocess.Popen):
        self.lines: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        for stream in (proc.stdout, proc.stderr):
            threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream) -> None:
        for line in stream:
            with self._lock:
                self.lines.append((time.time(), line.rstrip("\n")))

    def text(self) -> str:
        with self._lock:
            return "\n".join(line for _, line in self.lines)

    def ticks(self, round_: int) -> list[tuple[float, str, float]]:
        """(arrival, task, printed) of the round's tick lines the console showed."""
        found = []
        with self._lock:
            for arrived, line in self.lines:
                match = re.search(r"(\S+) \| \S+ round (\d+) tick \d+ at ([\d.]+)$", line)
                if match and int(match[2]) == round_:
                    found.append((arrived, match[1], float(match[3])))
        return found


def merged_ticks(run_dir: Path, round_: int, attempt: int) -> list[tuple[float, str, float]]:
    """(stamp, task, printed) of the round's tick lines in merged.log, written as lines of ``attempt``."""
    path = run_dir / "merged.log"
    data = path.read_bytes() if path.exists() else b""
    return [(datetime.strptime(m[1].decode(), "%Y-%m-%d %H:%M:%S.%f").timestamp(), m[3].decode(), float(m[5]))
            for m in TICK.finditer(data) if int(m[4]) == round_ and int(m[2]) == attempt]


def watch_rounds(console: Console, run_dir_of, gates: Path, tasks_of, last: int, attempt_of=lambda r: r,
                 status=None) -> Path:
    """Holds rounds 1 to ``last`` open in turn (``tasks_of(round)`` print in it, as lines of attempt
    ``attempt_of(round)``); checks that each is live before letting it end."""
    run_dir = None
    for round_ in range(1, last + 1):
        tasks, attempt = tasks_of(round_), attempt_of(round_)

        def seen_live():
            shown = console.ticks(round_)
            if {task for _, task, _ in shown} != tasks:
                return None
            nonlocal run_dir
            run_dir = run_dir or run_dir_of()
            written = merged_ticks(run_dir, round_, attempt) if run_dir else []
            return (shown, written) if {task for _, task, _ in written} == tasks else None

        shown, written = wait_for(seen_live, timeout=20, interval=0.1,
                                  message=lambda: f"round {round_}'s lines on the console and in merged.log "
                                                  f"while it runs; console:\n{console.text()[-3000:]}")
        # Lines reach the console and merged.log as they are written, not all at once later.
        assert max(arrived - printed for arrived, _, printed in shown) < LATE_AT_MOST, shown
        assert max(abs(stamp - printed) for stamp, _, printed in written) < LATE_AT_MOST, written
        epochs = [m for m in metrics_of(run_dir) if m.get("kind") == "epoch" and m["epoch"] == round_]
        assert {m["task"] for m in epochs} == tasks, epochs  # the metric board as it is written
        assert {m["attempt"] for m in epochs} == {attempt}, epochs
        # More of them while it runs: the round is followed, not read once.
        count = len(console.ticks(round_))
        wait_for(lambda: len(console.ticks(round_)) > count + 2, timeout=10, interval=0.1,
                 message=f"more of round {round_}'s lines")
        if status is not None:
            status(run_dir, attempt)
        (gates / f"end-{round_}").touch()
    return run_dir


def metrics_of(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def live_record(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())
