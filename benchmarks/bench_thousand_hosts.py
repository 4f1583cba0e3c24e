"""A thousand hosts from one tflaunch, simulated: what tflaunch itself costs per host, at start
and while a run goes on, at several sizes side by side.

    python benchmarks/bench_thousand_hosts.py [--sizes 64,256,1024] [--tasks-per-host 2] [--seconds 60]

No real hosts: with ``TFLAUNCH_SIMULATE_HOSTS=1`` every ssh host of the cluster file is the real
host agent started on this machine over pipes (``launcher/transports/simulated.py``), exactly as
ssh would carry it; everything on tflaunch's side is the real code. Each size is one run of
``sh -c 'echo up; exec sleep ...'`` per task (``--tasks-per-host`` per host), kept ``--seconds``
once every task is up, then stopped with SIGINT. Measured on tflaunch's own process only (from
/proc, its agents and tasks apart):

- **start**: tflaunch's CPU (user + system) from launch until every task printed its first line;
- **running**: its CPU per second over the window, and each of its threads' share;
- **memory and descriptors**: its RSS and open descriptors once every task is up;
- **stop**: SIGINT to exit, the exit code (130), and whether any agent or task outlived it.

Then the cost per host (the slope from the smallest to the largest size) and the fixed part,
against the targets: start <= 5 ms of CPU per host; running <= 0.1 ms per host per second plus
<= 10 ms per second in all. The figures are extrapolated to 4,096 hosts.

The agents and tasks share this machine's cores with tflaunch (a thousand agents start in about
half a minute here); tflaunch's figures are its own CPU time, which that sharing slows but does
not inflate much. Threads are named from one ``py-spy dump`` (skipped without py-spy).
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import subprocess
import time
from pathlib import Path

import _bench
from _bench import PYTHON, ROOT, note, table

START_TARGET_MS = 5.0  # tflaunch's CPU at start, per host
RUN_TARGET_MS = 0.1  # tflaunch's CPU while running, per host per second
FIXED_TARGET_MS = 10.0  # and in all, per second
EXTRAPOLATE_TO = 4096
TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def cluster_file(path: Path, hosts: int, per_host: int, keepalive: float) -> Path:
    lines = [f"ssh: {{keepalive_timeout: {keepalive:g}}}", "worker:"]
    for i in range(per_host):
        lines += [f"  - {{host: sim{h:04d}, port: {20000 + i}}}" for h in range(hosts)]
    path.write_text("\n".join(lines) + "\n")
    return path


def cpu_of(path: str) -> float:
    """utime + stime in seconds of a process or thread (/proc/PID/stat or /proc/PID/task/TID/stat)."""
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def threads_cpu(pid: int) -> dict[int, float]:
    found = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            found[int(tid)] = cpu_of(f"/proc/{pid}/task/{tid}/stat")
        except OSError:
            continue
    return found


def thread_names(pid: int) -> dict[int, str]:
    """Native thread id -> Python thread name, from one py-spy dump ({} without py-spy)."""
    tool = Path(PYTHON).with_name("py-spy")
    if not tool.exists():
        return {}
    done = subprocess.run([str(tool), "dump", "--pid", str(pid), "--nonblocking"], capture_output=True, text=True)
    names = {}
    for line in done.stdout.splitlines():  # Thread 12345 (idle): "tflaunch-agents"
        if line.startswith("Thread ") and '"' in line:
            tid = line.split()[1]
            if tid.isdigit():
                names[int(tid)] = line.split('"')[1]
    return names


def children(pid: int) -> list[int]:
    found = []
    for tid in os.listdir(f"/proc/{pid}/task") if os.path.isdir(f"/proc/{pid}/task") else []:
        try:
            found += [int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        except OSError:
            continue
    return found


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        for child in children(todo.pop()):
            found.append(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def rss_mb(pid: int) -> float:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE / 2 ** 20


def pss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


class UpCounter:
    """Counts the tasks' first lines in merged.log as it grows, reading only what is new."""

    def __init__(self, log_dir: Path):
        self.log_dir, self.offset, self.count, self.path = log_dir, 0, 0, None

    def __call__(self) -> int:
        if self.path is None:
            run = _bench.last_run_dir(self.log_dir) if self.log_dir.exists() else None
            if run is None or not (run / "merged.log").exists():
                return 0
            self.path = run / "merged.log"
        with open(self.path, "rb") as handle:
            handle.seek(self.offset)
            data = handle.read()
        cut = data.rfind(b"\n") + 1
        self.count += data[:cut].count(b" | up\n")
        self.offset += cut
        return self.count


def one_size(work: Path, hosts: int, per_host: int, seconds: float, keepalive: float) -> dict:
    tasks = hosts * per_host
    cluster = cluster_file(work / f"hosts-{hosts}.yaml", hosts, per_host, keepalive)
    logs = work / f"logs-{hosts}"
    argv = [PYTHON, "-m", "launcher", str(cluster), "--quiet", "--no-check", "--log-dir", str(logs), "--",
            "sh", "-c", "echo up; exec sleep 100000"]
    env = {**os.environ, "TFLAUNCH_SIMULATE_HOSTS": "1"}
    started = time.monotonic()
    with open(work / f"console-{hosts}.txt", "wb") as console:
        proc = _bench.popen(argv, cwd=ROOT, env=env, stdout=console, stderr=console)
    up = UpCounter(logs)
    row: dict = {"hosts": hosts, "tasks": tasks}
    if not _bench.wait_for(lambda: up() >= tasks or proc.poll() is not None, timeout=600, interval=0.05) \
            or proc.poll() is not None:
        row["error"] = f"only {up()} of {tasks} tasks came up (tflaunch exit {proc.poll()}); see console-{hosts}.txt"
        _bench.cleanup()
        return row
    row["start_s"] = time.monotonic() - started
    row["start_cpu"] = cpu_of(f"/proc/{proc.pid}/stat")
    time.sleep(12.0)  # the start's trailing work (the record at its slowest pace, the first samples) is no running cost
    fds = len(os.listdir(f"/proc/{proc.pid}/fd"))
    rss = rss_mb(proc.pid)
    family = descendants(proc.pid)
    agents = children(proc.pid)
    names = thread_names(proc.pid)
    before, t0 = threads_cpu(proc.pid), time.monotonic()
    cpu0 = cpu_of(f"/proc/{proc.pid}/stat")
    agents_cpu0 = sum(cpu_of(f"/proc/{a}/stat") for a in agents if alive(a))
    time.sleep(seconds)
    elapsed = time.monotonic() - t0
    cpu1 = cpu_of(f"/proc/{proc.pid}/stat")
    agents_cpu1 = sum(cpu_of(f"/proc/{a}/stat") for a in agents if alive(a))
    after = threads_cpu(proc.pid)
    row.update(fds=fds, rss_mb=rss, agents=len(agents), agents_pss_mb=pss_mb(agents),
               run_ms_per_s=1000 * (cpu1 - cpu0) / elapsed,
               agents_ms_per_s=1000 * (agents_cpu1 - agents_cpu0) / elapsed,
               threads={names.get(tid, f"thread {tid}"): 1000 * (after[tid] - before.get(tid, 0.0)) / elapsed
                        for tid in after})
    stop = time.monotonic()
    proc.send_signal(signal.SIGINT)
    rc, _, _ = _bench.wait4(proc)
    row["stop_s"] = time.monotonic() - stop
    row["exit"] = rc
    _bench.wait_for(lambda: not any(alive(p) for p in family), timeout=10)
    row["left"] = sum(alive(p) for p in family)
    return row


def slope(rows: list[dict], key: str) -> tuple[float, float]:
    """(per host, at zero hosts) of ``key`` from the smallest to the largest size."""
    first, last = rows[0], rows[-1]
    per_host = (last[key] - first[key]) / (last["hosts"] - first["hosts"])
    return per_host, first[key] - per_host * first["hosts"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="64,256,1024", help="host counts, smallest first (default 64,256,1024)")
    parser.add_argument("--tasks-per-host", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=60.0, help="running window per size (default 60)")
    parser.add_argument("--keepalive", type=float, default=15.0, help="ssh keepalive_timeout (default 15)")
    parser.add_argument("--reps", type=int, default=1, help="runs per size (default 1)")
    args = parser.parse_args()
    sizes = sorted(int(n) for n in args.sizes.split(",") if n)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    _bench.header("bench_thousand_hosts: tflaunch's own cost per host, simulated hosts (TFLAUNCH_SIMULATE_HOSTS=1)",
                  [f"sizes {sizes} hosts x {args.tasks_per_host} tasks, {args.seconds:g} s running window, "
                   f"keepalive {args.keepalive:g} s, open files {soft}/{hard}"])
    rows: list[dict] = []
    with _bench.workdir("thousand") as work:
        for rep, size in _bench.interleaved(args.reps, [str(s) for s in sizes]):
            row = one_size(work, int(size), args.tasks_per_host, args.seconds, args.keepalive)
            row["rep"] = rep
            rows.append(row)
            if "error" in row:
                note(f"{size} hosts: {row['error']}")
                continue
            top = sorted(row["threads"].items(), key=lambda item: -item[1])[:4]
            note(f"{size} hosts: start {row['start_s']:.1f} s, CPU {row['start_cpu']:.2f} s; running "
                 f"{row['run_ms_per_s']:.1f} ms/s ({', '.join(f'{n} {v:.1f}' for n, v in top)}); "
                 f"exit {row['exit']} after {row['stop_s']:.2f} s, {row['left']} processes left")
    good = [r for r in rows if "error" not in r]
    by_size = []
    for size in sizes:
        mine = [r for r in good if r["hosts"] == size]
        if mine:
            merged = {"hosts": size, "tasks": mine[0]["tasks"]}
            for key in ("start_s", "start_cpu", "run_ms_per_s", "rss_mb", "fds", "stop_s", "agents_ms_per_s",
                        "agents_pss_mb"):
                merged[key] = _bench.median([r[key] for r in mine])
            merged["threads"] = {name: _bench.median([r["threads"].get(name, 0.0) for r in mine])
                                 for name in mine[0]["threads"]}
            merged["clean"] = all(r["exit"] == 130 and r["left"] == 0 for r in mine)
            by_size.append(merged)
    print()
    table(["hosts", "tasks", "start s", "start CPU s", "running ms/s", "RSS MB", "fds", "stop s", "clean stop",
           "agents ms/s", "agents PSS MB"],
          [[r["hosts"], r["tasks"], f"{r['start_s']:.1f}", f"{r['start_cpu']:.2f}", f"{r['run_ms_per_s']:.1f}",
            f"{r['rss_mb']:.0f}", r["fds"], f"{r['stop_s']:.2f}", "yes" if r["clean"] else "NO",
            f"{r['agents_ms_per_s']:.0f}", f"{r['agents_pss_mb']:.0f}"] for r in by_size])
    if by_size:
        names = sorted({n for r in by_size for n in r["threads"]}, key=lambda n: -by_size[-1]["threads"].get(n, 0))
        shown = [n for n in names if by_size[-1]["threads"].get(n, 0) >= 0.05][:6]
        print()
        table(["running ms/s by thread", *[str(r["hosts"]) for r in by_size]],
              [[n, *[f"{r['threads'].get(n, 0.0):.2f}" for r in by_size]] for n in shown])
    if len(by_size) < 2:
        print("RESULT too few sizes measured for a slope")
        return
    start, start_fixed = slope(by_size, "start_cpu")
    run, run_fixed = slope(by_size, "run_ms_per_s")
    rss, rss_fixed = slope(by_size, "rss_mb")
    fds, fds_fixed = slope(by_size, "fds")
    print()
    note(f"per host (from {by_size[0]['hosts']} to {by_size[-1]['hosts']} hosts): start {start * 1000:.2f} ms of CPU, "
         f"running {run:.4f} ms/s, RSS {rss * 1024:.1f} KB, {fds:.2f} descriptors")
    note(f"fixed: start {start_fixed:.2f} s, running {run_fixed:.1f} ms/s, RSS {rss_fixed:.0f} MB, {fds_fixed:.0f} "
         "descriptors")
    n = EXTRAPOLATE_TO
    week = (run_fixed + run * n) / 1000
    note(f"at {n:,} hosts: start {start_fixed + start * n:.1f} s of CPU, running {run_fixed + run * n:.0f} ms/s "
         f"({week:.1%} of one core), RSS {rss_fixed + rss * n:.0f} MB, {fds_fixed + fds * n:.0f} descriptors")
    _bench.verdict("start CPU per host", start * 1000, START_TARGET_MS, " ms")
    _bench.verdict("running CPU per host per second", run, RUN_TARGET_MS, " ms")
    _bench.verdict("running CPU, fixed part", max(run_fixed, 0.0), FIXED_TARGET_MS, " ms/s")
    print(f"RESULT every stop clean (exit 130, nothing left): {all(r['clean'] for r in by_size)}")


if __name__ == "__main__":
    _bench.main_guard(main)
