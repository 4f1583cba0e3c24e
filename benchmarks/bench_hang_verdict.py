"""How fast a hang is declared and its culprit named, and how fast ``tflaunch stacks`` answers.

    python benchmarks/bench_hang_verdict.py [--timeouts 5,10,20] [--tasks 64] [--reps 3]

1. **Stall to verdict**: ``tflaunch --local 3 --hang-timeout S`` on Python tasks that report a step
   metric every 0.1 s while they compute, then stop together: worker-1 in ``stuck_here`` and the
   others in ``wait_for_peers``. The time from the last step any task reported (metrics.jsonl) to
   tflaunch's "hang timeout: ..." line in merged.log, against S, and whether the verdict named
   worker-1. Target: declared no sooner than S, and at most S + 3 s after the stall (the agents
   sample CPU every second; the stacks take a py-spy run).
2. **tflaunch stacks at 64 tasks**: ``tflaunch --local 64`` of Python tasks asleep in different
   places (worker-7 in ``stuck_here``, the others in ``wait_for_peers``); the wall time of the
   ``tflaunch stacks`` command (start-up included) against dumping the same 64 tasks one after
   another with ``py-spy dump``, as a launcher without concurrent sampling would. Target: <= 5 s,
   and the verdict names worker-7.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import _bench
from _bench import TFLAUNCH, median, note, spread, table

TARGET_STACKS_SECONDS = 5.0
TARGET_LATE_SECONDS = 3.0

TASK = '''
import json, os, sys, time

ME = os.environ.get("TFLAUNCH_TASK", "worker-0")


def stuck_here():
    while True:
        time.sleep(1)


def wait_for_peers():
    while True:
        time.sleep(1)


def work(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


mode, culprit, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
for step in range(1, steps + 1):
    work(0.05)
    print("TFLAUNCH_METRIC " + json.dumps({"kind": "step", "step": step}), flush=True)
    time.sleep(0.05)
print("STALLED %.3f" % time.time(), flush=True)
(stuck_here if ME == culprit else wait_for_peers)()
'''


def merged_time(line: str) -> float:
    """The time of a merged.log line ("YYYY-MM-DD HH:MM:SS.mmm [k] task | text")."""
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S.%f").timestamp()


def stall_to_verdict(work: Path, task: Path, timeout: float, rep: int) -> dict:
    logs = work / f"hang-{timeout:g}-{rep}"
    done = subprocess.run([TFLAUNCH, "--local", "3", "--quiet", "--hang-timeout", f"{timeout:g}", "--log-dir",
                           str(logs), "--", sys.executable, str(task), "stall", "worker-1", "30"],
                          cwd=work, capture_output=True, text=True, timeout=timeout + 120)
    run_dir = next(logs.iterdir())
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    declared = next(line for line in (run_dir / "merged.log").read_text().splitlines() if "| hang timeout:" in line)
    record = json.loads((run_dir / "run.json").read_text())
    return {"rc": done.returncode, "delay": merged_time(declared) - max(s["time"] for s in steps),
            "named": record["attempts"][0]["blamed_tasks"] == ["worker-1"]}


def pids_of(run_dir: Path) -> list[int]:
    record = json.loads((run_dir / "run.json").read_text())
    return [t["pid"] for t in record["tasks"] if t.get("pid")]


def stacks_at_scale(work: Path, task: Path, count: int, reps: int) -> None:
    logs = work / "scale"
    proc = _bench.popen([TFLAUNCH, "--local", str(count), "--quiet", "--log-dir", str(logs), "--", sys.executable,
                         str(task), "stall", "worker-7", "0"], cwd=work, stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL)

    def ready() -> bool:
        runs = list(logs.iterdir()) if logs.exists() else []
        if not runs or not (runs[0] / "control.sock").exists():
            return False
        merged = runs[0] / "merged.log"
        stalled = merged.read_text().count("STALLED") if merged.exists() else 0
        return stalled >= count and len(pids_of(runs[0])) == count

    if not _bench.wait_for(ready, timeout=120, interval=0.2):
        note(f"the {count} tasks did not all start within 120 s")
        return
    run_dir = next(logs.iterdir())
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    walls: dict[str, list[float]] = {"tflaunch stacks": [], "py-spy one by one": []}
    named, sampled = [], []
    for rep, side in _bench.interleaved(reps, list(walls)):
        started = time.monotonic()
        if side == "tflaunch stacks":
            shown = subprocess.run([TFLAUNCH, "stacks", str(run_dir), "--json"], capture_output=True, text=True,
                                   cwd=work, timeout=120)
            answer = json.loads(shown.stdout) if shown.returncode == 0 else {}
            named.append([c["task"] for c in answer.get("verdict", {}).get("culprits", [])] == ["worker-7"])
            sampled.append(answer.get("seconds", float("nan")))
        else:
            for pid in pids_of(run_dir):
                subprocess.run([spy, "dump", "--pid", str(pid), "--subprocesses"], capture_output=True, timeout=60)
        walls[side].append(time.monotonic() - started)
        note(f"rep {rep + 1} {side}: {walls[side][-1]:.2f} s")
    proc.send_signal(2)
    proc.wait(timeout=120)
    print()
    table(["side", "median s", "min s", "max s"], [[side, *spread(values)] for side, values in walls.items()])
    note(f"verdict named worker-7 in {sum(named)} of {len(named)} answers; sampling itself took "
         f"{median(sampled):.2f} s (median, as tflaunch measured it)")
    _bench.verdict(f"tflaunch stacks, {count} local tasks", median(walls["tflaunch stacks"]), TARGET_STACKS_SECONDS,
                   " s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeouts", default="5,10,20", help="hang timeouts to try, in seconds")
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    timeouts = [float(t) for t in args.timeouts.split(",")]
    _bench.header(f"bench_hang_verdict: stall to verdict at --hang-timeout {args.timeouts}; "
                  f"tflaunch stacks at {args.tasks} tasks")
    with _bench.workdir("hangverdict") as work:
        task = work / "hang_task.py"
        task.write_text(TASK)
        rows, late = [], []
        for timeout in timeouts:
            runs = [stall_to_verdict(work, task, timeout, rep) for rep in range(args.reps)]
            for n, run in enumerate(runs):
                note(f"--hang-timeout {timeout:g}, rep {n + 1}: verdict {run['delay']:.2f} s after the stall, "
                     f"exit {run['rc']}, worker-1 named: {run['named']}")
            delays = [r["delay"] for r in runs]
            late += [d - timeout for d in delays]
            rows.append([f"--hang-timeout {timeout:g}", *spread(delays), median(delays) - timeout,
                         f"{sum(r['named'] for r in runs)}/{len(runs)}", f"{min(delays) >= timeout}"])
        print()
        table(["run", "median s", "min s", "max s", "median - S", "named", "never early"], rows)
        _bench.verdict("verdict after the hang timeout, worst case", max(late), TARGET_LATE_SECONDS, " s")
        print()
        stacks_at_scale(work, task, args.tasks, args.reps)


if __name__ == "__main__":
    _bench.main_guard(main)
