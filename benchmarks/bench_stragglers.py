"""What the straggler rule costs: tflaunch and its agents with it on and off, at 64 tasks, side by side.

    python benchmarks/bench_stragglers.py [--hosts 8] [--tasks-per-host 8] [--threads 115] [--reps 3]
                                          [--seconds 120]

No real hosts: with ``TFLAUNCH_SIMULATE_HOSTS=1`` every ssh host of the cluster file is the real
host agent started on this machine over pipes, exactly as ssh would carry it. Each task is a
Python program shaped like a TensorFlow worker as the rule sees it: ``--threads`` threads (a
MultiWorkerMirroredStrategy worker had 115 here), nearly all waiting on a condition, one sleeping
in a loop, and a main thread working 1 ms in every 100 (so that 64 of them leave this 2-core
machine free for tflaunch and its agents). Each side (``--on-straggler warn``, the default, and
``off``) runs ``--reps`` times, interleaved; each run is measured over ``--seconds`` once every
task has been up 15 s (past the first censuses of the tasks' threads, which read every thread),
then stopped with SIGINT. The default 120 s holds a full census (every 120 s, of every thread).

Measured from /proc: the CPU (user + system) of tflaunch and of every agent, over the window, per
second of wall time. The rule's cost is the difference between the sides' medians, as a share of
one core, against the target: at most 1 % of one core at 64 tasks. Unlike the other benchmarks,
this one fails loudly: it exits 1 when the cost is past the target, or when a side has no run.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
from pathlib import Path

import _bench
from _bench import PYTHON, ROOT, note, table

TARGET = 1.0  # % of one core, tflaunch and its agents together, at 64 tasks
TICKS = os.sysconf("SC_CLK_TCK")
SETTLE = 15.0

TASK = """
import sys, threading, time
threads = int(sys.argv[1])
idle = threading.Event()
for _ in range(threads - 2):
    threading.Thread(target=idle.wait, daemon=True).start()
def heartbeat():
    while True:
        time.sleep(1.0)
threading.Thread(target=heartbeat, daemon=True).start()
print("up", flush=True)
while True:
    end = time.perf_counter() + 0.001
    while time.perf_counter() < end:
        pass
    time.sleep(0.099)
"""


def cluster_file(path: Path, hosts: int, per_host: int) -> Path:
    lines = ["ssh: {keepalive_timeout: 30}", "worker:"]
    for i in range(per_host):
        lines += [f"  - {{host: sim{h:03d}, port: {21000 + i}}}" for h in range(hosts)]
    path.write_text("\n".join(lines) + "\n")
    return path


def cpu_of(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


def launcher_side(root: int, marker: str) -> list[int]:
    """tflaunch and its agents: ``root`` and its descendants that are not tasks (``marker`` in their command line)."""
    import psutil

    found = [root]
    try:
        for proc in psutil.Process(root).children(recursive=True):
            try:
                if not any(marker in part for part in proc.cmdline()):
                    found.append(proc.pid)
            except psutil.Error:
                continue
    except psutil.Error:
        pass
    return found


def one_run(work: Path, side: str, args: argparse.Namespace) -> float | None:
    """tflaunch's and its agents' CPU per second over the window, or None when the run did not come up."""
    script = work / "shaped_task.py"
    script.write_text(TASK)
    cluster = cluster_file(work / "cluster.yaml", args.hosts, args.tasks_per_host)
    env = {**os.environ, "TFLAUNCH_SIMULATE_HOSTS": "1", "PYTHONPATH": str(ROOT)}
    logs = work / f"logs-{side}"
    proc = _bench.popen([PYTHON, "-m", "launcher", str(cluster), "--no-check", "--on-straggler", side,
                         "--log-dir", str(logs), "--quiet", "--", PYTHON, str(script), str(args.threads)],
                        env=env, cwd=work, stdout=subprocess_devnull(), stderr=subprocess_devnull())
    tasks = args.hosts * args.tasks_per_host

    def all_up() -> bool:
        run = _bench.last_run_dir(logs)
        merged = run / "merged.log" if run else None
        return bool(merged and merged.exists() and merged.read_text(errors="replace").count("| up") >= tasks)

    if not _bench.wait_for(all_up, timeout=180, interval=0.5):
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        return None
    time.sleep(SETTLE)
    pids = launcher_side(proc.pid, str(script))
    before = {pid: cpu_of(pid) for pid in pids}
    start = time.monotonic()
    time.sleep(args.seconds)
    spent = sum(max(0.0, cpu_of(pid) - before[pid]) for pid in pids)
    wall = time.monotonic() - start
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=120)
    return spent / wall


def subprocess_devnull():
    import subprocess

    return subprocess.DEVNULL


def main() -> bool:
    """Run both sides; True when the rule's cost is within its target."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--tasks-per-host", type=int, default=8)
    parser.add_argument("--threads", type=int, default=115)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=120.0)
    args = parser.parse_args()
    tasks = args.hosts * args.tasks_per_host
    _bench.header(f"the straggler rule's cost: {tasks} tasks of {args.threads} threads on {args.hosts} simulated hosts",
                  [f"{args.reps} runs a side, interleaved; {args.seconds:g} s measured per run"])
    results: dict[str, list[float]] = {"warn": [], "off": []}
    with _bench.workdir("stragglers") as work:
        for rep, side in _bench.interleaved(args.reps, ["warn", "off"]):
            used = one_run(work, side, args)
            if used is None:
                note(f"run {rep + 1} ({side}) did not come up; left out")
                continue
            results[side].append(used)
            note(f"run {rep + 1} {side:>4}: tflaunch and agents {used * 1000:.1f} ms of CPU per second")
    if not results["warn"] or not results["off"]:
        note("no comparison: a side has no run")
        return False
    on, off = statistics.median(results["warn"]), statistics.median(results["off"])
    table(["side", "runs", "median ms CPU/s", "min", "max"],
          [[f"--on-straggler {side}", len(values), f"{statistics.median(values) * 1000:.1f}",
            f"{min(values) * 1000:.1f}", f"{max(values) * 1000:.1f}"] for side, values in results.items()])
    note(f"ratio warn / off: {on / off:.3f}")
    _bench.interval_note(results["warn"], results["off"])
    cost = (on - off) * 100
    _bench.verdict(f"straggler rule at {tasks} tasks, % of one core", cost, TARGET, " %")
    return cost <= TARGET


def guarded() -> None:
    """:func:`main`, cleaned up after whatever happens; exit 1 unless it ended within its target."""
    within = []
    try:
        _bench.main_guard(lambda: within.append(main()))
    except SystemExit:
        pass
    if within != [True]:
        print("FAILED: the straggler rule's cost is past its target, or was not measured", file=sys.stderr, flush=True)
        sys.exit(1)
    sys.exit(0)


if __name__ == "__main__":
    guarded()
