"""Time from tflaunch's SIGKILL to the last of its local tasks gone.

    python benchmarks/bench_orphans.py [--reps N] [--tasks T]

``tflaunch --local T --quiet --threads off -- python tests/helpers/escape.py MARKER ...`` with
three workloads, each task also leaving processes outside its group:
  plain        each task sleeps (and has left one setsid'ed and one double-forked sleeper)
  ignore-term  the same, but the task ignores SIGTERM, so only SIGKILL after the agent's grace ends it
Once every task has printed READY, this script SIGKILLs tflaunch and polls /proc every 5 ms for
the processes carrying MARKER (the tasks and their escapees). Measured: SIGKILL -> the last one
gone. Baseline: the same tasks started by a shell in the background and left alone; they are
still there when the measurement window (5 s) ends, which is what happened to local tasks before
they ran under the agent. Target: <= 2 s for every workload.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
import uuid
from pathlib import Path

import _bench
from _bench import PYTHON, ROOT, TFLAUNCH, note, spread, table

TARGET = 2.0
WINDOW = 5.0
ESCAPE = str(ROOT / "tests" / "helpers" / "escape.py")
IGNORE_TERM = "import signal, sys, runpy; signal.signal(signal.SIGTERM, signal.SIG_IGN); sys.argv = sys.argv[1:]; " \
              "runpy.run_path(sys.argv[0], run_name='__main__')"


def marked(marker: str) -> list[int]:
    """Pids of living processes with ``marker`` as an argument (zombies hold nothing)."""
    found = []
    needle = marker.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if needle not in Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0"):
                continue
            if Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] != b"Z":
                found.append(int(entry))
        except (OSError, IndexError):
            continue
    return found


def command(workload: str, marker: str) -> list[str]:
    task = [ESCAPE, marker, "escape", "ready", "forever"]
    return [PYTHON, "-c", IGNORE_TERM, *task] if workload == "ignore-term" else [PYTHON, *task]


def ready_count(log_dir: Path) -> int:
    run_dir = _bench.last_run_dir(log_dir) if log_dir.exists() else None
    merged = run_dir / "merged.log" if run_dir else None
    return merged.read_bytes().count(b"READY") if merged and merged.exists() else 0


def gone_after(marker: str, since: float) -> float | None:
    """Seconds from ``since`` until no marked process is left; None if some outlive the window."""
    while time.monotonic() - since < WINDOW:
        if not marked(marker):
            return time.monotonic() - since
        time.sleep(0.005)
    return None


def run_tflaunch(work: Path, tasks: int, workload: str) -> dict:
    marker = f"bench-{uuid.uuid4().hex[:12]}"
    log_dir = work / f"logs-{marker}"  # a folder per run: READY lines of an earlier run must not count
    argv = [TFLAUNCH, "--local", str(tasks), "--quiet", "--threads", "off", "--log-dir", str(log_dir), "--",
            *command(workload, marker)]
    with open(work / "tflaunch.console", "wb") as console:
        proc = _bench.popen(argv, cwd=work, stdout=console, stderr=console)
    deadline = time.monotonic() + 60
    while ready_count(log_dir) < tasks and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    alive = len([pid for pid in marked(marker) if pid != proc.pid])  # tflaunch's own argv names the marker
    proc.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    proc.wait()
    seconds = gone_after(marker, killed)
    for pid in marked(marker):  # only if the measurement failed: leave nothing behind
        os.kill(pid, signal.SIGKILL)
    return {"seconds": seconds, "processes": alive}


def run_shell(work: Path, tasks: int, workload: str) -> dict:
    marker = f"bench-{uuid.uuid4().hex[:12]}"
    procs = [_bench.popen(command(workload, marker), cwd=work, stdout=open(os.devnull, "wb")) for _ in range(tasks)]
    deadline = time.monotonic() + 30
    while len(marked(marker)) < 3 * tasks and time.monotonic() < deadline:
        time.sleep(0.02)
    alive = len(marked(marker))
    seconds = gone_after(marker, time.monotonic())  # nobody stops them: the window runs out
    for pid in marked(marker):
        os.kill(pid, signal.SIGKILL)
    for proc in procs:
        proc.wait()
    return {"seconds": seconds, "processes": alive}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5, help="repetitions per workload (default 5)")
    parser.add_argument("--tasks", type=int, default=4)
    args = parser.parse_args()
    _bench.header(f"bench_orphans: tflaunch --local {args.tasks} SIGKILLed; time until its tasks and their "
                  "escapees are gone", [f"{args.reps} repetitions per workload; window {WINDOW:g} s"])
    rows, worst = [], 0.0
    with _bench.workdir("orphans") as work:
        for workload in ("plain", "ignore-term"):
            results = []
            for rep in range(args.reps):
                r = run_tflaunch(work, args.tasks, workload)
                shown = "still alive after the window" if r["seconds"] is None else f"{r['seconds']:.3f} s"
                note(f"{workload} rep {rep + 1}: {r['processes']} processes, gone {shown}")
                results.append(r)
            base = run_shell(work, args.tasks, workload)
            note(f"{workload} baseline: {base['processes']} processes, "
                 f"{'still alive after the window' if base['seconds'] is None else 'gone'}")
            gone = [r["seconds"] for r in results if r["seconds"] is not None]
            survived = len(results) - len(gone)
            rows.append([workload, results[0]["processes"], *(spread(gone) if gone else ["-", "-", "-"]), survived,
                         "alive" if base["seconds"] is None else "gone"])
            worst = max([worst, *gone]) if not survived else float("inf")
    print()
    table(["workload", "processes", "median s", "min s", "max s", "runs with survivors", "baseline after 5 s"], rows)
    _bench.verdict("SIGKILL -> last local task gone (worst run)", worst, TARGET, " s")


if __name__ == "__main__":
    _bench.main_guard(main)
