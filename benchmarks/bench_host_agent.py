"""One agent per host over ssh: what a run costs per host, on namespaced hosts whose sshd keeps
OpenSSH's stock limits (MaxStartups 10:30:100, MaxSessions 10).

    python benchmarks/bench_host_agent.py [--reps N] [--curve 8,16,32] [--curve-reps N] [--skip-curve | --only-curve]
        [--running-reps N] [--before DIR] [--no-reference]

Needs root. Brings up hosts with ``scripts/testhosts up --stock-limits`` under its own prefix and
takes them down at the end, whatever happens. Four parts, each printed as a table:

1. **Many tasks on one host**: 16 and 32 ``true`` tasks on one stock-sshd host, 10 runs each;
   target: 10 of 10 start and succeed (one connection per task used to fail past ~10).
2. **8 hosts x 8 tasks**: ``tflaunch CLUSTER --no-check -- true`` against 8 plain ``ssh HOST true``
   started at once (the floor here, where every host shares this machine's 2 cores) and one
   connection, interleaved; target: tflaunch <= 1.2x the 8 connections (the medians' ratio; the
   median of each repetition's own ratio beside it). Beside it, the same run with ``python:
   /usr/bin/python3`` in the cluster file: the test hosts' ``python3`` is a pyenv shim. With
   ``--before DIR``, also the same run with the launcher package in DIR, interleaved.
2b. **One ssh connection's own cost**: client CPU and the whole machine's, with OpenSSH's default key
   exchange (sntrup761x25519 in OpenSSH 9) and with curve25519 alone, interleaved (no target).
3. **Start-time curve**: 8 ``sleep`` tasks per host at 8, 16 and 32 hosts: seconds from launch
   until every task has printed its first line, and the cost per host (the slope), from which
   benchmarks/README.md's estimate for 256 hosts comes; and tflaunch's own CPU (user + system,
   from /proc, its ssh clients apart) until then, whose slope has a target: <= 5 ms per host (fitted
   by least squares to every run of every size) on the machine of 2026-11-28. Interleaved with
   every run, the same run with the launcher of :data:`REFERENCE_COMMIT` (``git archive``; not
   with ``--no-reference``), which took :data:`REFERENCE_MS` per host that day: its slope now says
   how fast the machine is, and the goal is held on this tree's slope scaled by it (the raw
   figure is printed beside it). The same launcher took 3.6 ms per host here one evening and 7.9
   on another day; within one run both meet the same machine (their ratio still scatters by 20 to
   40 % from run to run).
   Beside each run, the CPU of creating a file in the run's own folder (each task's log), which
   moves a lot on a shared disk; the run folders are made
   under ``--runs-under`` (default: the working tree's logs/, where tflaunch makes them by default).
4. **Running**: the largest size of part 3 with ``sleep`` tasks that go on: tflaunch's own CPU per
   second over :data:`RUNNING_WINDOW` seconds once every task is up, ``--running-reps`` runs (with
   ``--before``, interleaved with the older launcher); target: the median <= 7.5 ms/s at 32 hosts
   x 8 tasks (6 ms/s measured on 2026-11-28; 8 to 9 when the straggler rule's judgement took a sort
   of every other task per task).

The targets of parts 3 and 4 are goals the project holds: when either is missed the benchmark
prints a ``FAILED`` line naming it and exits 1. Both are CPU time, not wall time, but a machine
shared with other work still moves them (the longer a start takes, the more of tflaunch's running
cost counts into it): part 3 is scaled by its reference launcher for that reason; for part 4 read
the load average printed at the top, and run again on a quiet machine before blaming the code.
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
from _bench import ROOT, TFLAUNCH, median, note, spread, table

PREFIX, SUBNET = "bha", "10.125.7"
STOCK_TARGET = 10
RATIO_TARGET = 1.2
START_CPU_TARGET_MS = 5.0  # tflaunch's own CPU at start, per host
RUNNING_TARGET_MS = 7.5  # tflaunch's own CPU per second while RUNNING_HOSTS hosts x 8 tasks run
# Part 3's yardstick: the launcher of this commit (the same as at 64b4c19 but for a restart's
# part files) took 3.6 and 4.2 ms of CPU per extra host in the two runs of 2026-11-28 evening
# (benchmarks/README.md), when the goal was met; their mean is REFERENCE_MS. The same launcher took
# 7.9 ms here on 2026-12-02: the machine's speed moves the figure more than the code does, so
# the goal is held on the figure scaled to that evening's machine (see curve).
REFERENCE_COMMIT = "e8c8f4a"
REFERENCE_MS = 3.9
RUNNING_HOSTS = 32
RUNNING_WINDOW = 15.0  # seconds over which the running cost is read, once every task is up
SYSTEM_PYTHON = "/usr/bin/python3"


def cluster_yaml(path: Path, hosts: list[dict], per_host: int, ssh_config: str, port_base: int = 20000,
                 python: str | None = None) -> Path:
    lines = [f"ssh:\n  options: [\"-F\", \"{ssh_config}\"]", *([f"python: {python}"] if python else []), "worker:"]
    for i in range(per_host):
        for h in hosts:
            lines.append(f"  - {{host: {h['name']}, address: {h['address']}, port: {port_base + i}}}")
    path.write_text("\n".join(lines) + "\n")
    return path


def run(argv: list[str], cwd: Path, source: str | None = None) -> tuple[float, int, str]:
    """``source``: a folder whose launcher package tflaunch runs instead of this tree's."""
    started = time.monotonic()
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env=_bench.launcher_env(source))
    return time.monotonic() - started, done.returncode, done.stderr


def at_once(argvs: list[list[str]], cwd: Path) -> tuple[float, int]:
    started = time.monotonic()
    procs = [subprocess.Popen(a, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for a in argvs]
    codes = [p.wait() for p in procs]
    return time.monotonic() - started, max(codes)


def up(count: int) -> dict | None:
    return _bench.hosts_up(PREFIX, SUBNET, count)


def down() -> None:
    _bench.hosts_down(PREFIX)


def tflaunch(cluster: Path, work: Path, *command: str) -> list[str]:
    return [TFLAUNCH, str(cluster), "--quiet", "--no-check", "--log-dir", str(work / "logs"), "--", *command]


def many_on_one_host(doc: dict, work: Path) -> None:
    host = doc["hosts"][:1]
    rows = []
    for tasks in (16, 32):
        cluster = cluster_yaml(work / f"one-{tasks}.yaml", host, tasks, doc["ssh_config"])
        ok, walls, errors = 0, [], []
        for _ in range(10):
            wall, rc, err = run(tflaunch(cluster, work, "true"), work)
            ok += rc == 0
            walls.append(wall)
            if rc:
                errors.append(err.strip().splitlines()[-1] if err.strip() else f"exit {rc}")
        rows.append([f"{tasks} tasks on {host[0]['name']}", f"{ok}/10", f"{median(walls):.2f}",
                     "yes" if ok == STOCK_TARGET else "NO"])
        for error in errors[:2]:
            note(f"{tasks} tasks: {error}")
    print()
    table(["run", "started and succeeded", "median s", "target 10/10"], rows)


def eight_by_eight(doc: dict, work: Path, reps: int, before: str | None = None) -> None:
    hosts, cfg = doc["hosts"][:8], doc["ssh_config"]
    cluster = cluster_yaml(work / "8x8.yaml", hosts, 8, cfg)
    # The test hosts share this machine's /root, whose .bashrc puts pyenv's shims first on the PATH:
    # there 'python3', which runs each host's agent, is a shell script that takes 60 ms of CPU
    # before Python starts. The same run with the interpreter named, beside (no target).
    named = cluster_yaml(work / "8x8-python.yaml", hosts, 8, cfg, python=SYSTEM_PYTHON)
    sides = {
        "tflaunch": lambda: run(tflaunch(cluster, work, "true"), work)[:2],
        "tflaunch, python named": lambda: run(tflaunch(named, work, "true"), work)[:2],
        "8 ssh": lambda: at_once([["ssh", "-F", cfg, h["name"], "true"] for h in hosts], work),
        "1 ssh": lambda: at_once([["ssh", "-F", cfg, hosts[0]["name"], "true"]], work),
        **({"before": lambda: run(tflaunch(cluster, work, "true"), work, before)[:2]} if before else {}),
    }
    results: dict[str, list[float]] = {side: [] for side in sides}
    by_rep: dict[int, dict[str, float]] = {}
    failures = 0
    for rep, side in _bench.interleaved(reps, list(sides)):
        wall, rc = sides[side]()
        if rc == 0:
            results[side].append(wall)
            by_rep.setdefault(rep, {})[side] = wall
        else:
            failures += 1
    floor, one = median(results["8 ssh"]), median(results["1 ssh"])
    labels = {"tflaunch": "tflaunch, 64 tasks on 8 hosts",
              "tflaunch, python named": f"the same, python: {SYSTEM_PYTHON}",
              "8 ssh": "8 plain ssh HOST true at once", "1 ssh": "one ssh HOST true",
              "before": f"tflaunch with the launcher from {before}"}
    rows = [[labels[side], len(results[side]), *spread(results[side]), f"{median(results[side]) / floor:.2f}x"]
            for side in sides]
    print()
    table(["side", "ok runs", "median s", "min s", "max s", "vs 8 ssh at once"], rows)
    if failures:
        note(f"{failures} runs failed")
    _bench.verdict("64 tasks on 8 hosts / 8 ssh connections at once", median(results["tflaunch"]) / floor,
                   RATIO_TARGET)
    _bench.interval_note(results["tflaunch"], results["8 ssh"])
    note(f"and against one connection: {median(results['tflaunch']) / one:.2f}x")
    # Each repetition's tflaunch run against the 8 connections of the same repetition: the machine's
    # speed drifts over minutes here (the 8 connections alone moved from 1.45 to 1.97 s in a morning).
    for side in ("tflaunch", "tflaunch, python named", *(("before",) if before else ())):
        paired = [r[side] / r["8 ssh"] for r in by_rep.values() if side in r and "8 ssh" in r]
        if paired:
            note(f"{side}, run by run (over the 8 connections of its repetition): median {median(paired):.2f}x "
                 f"of {len(paired)} ({min(paired):.2f} to {max(paired):.2f})")


def ssh_cost(doc: dict, reps: int) -> None:
    """What one ssh connection costs this machine by itself, with OpenSSH's default key exchange and
    with curve25519 alone: the client's CPU, and the whole machine's (the sshd is on it too)."""
    host, cfg = doc["hosts"][0]["name"], doc["ssh_config"]
    kinds = {"default key exchange": [], "KexAlgorithms=curve25519-sha256": ["-o", "KexAlgorithms=curve25519-sha256"]}
    found: dict[str, list[tuple[float, float, float]]] = {kind: [] for kind in kinds}
    for _, kind in _bench.interleaved(reps, list(kinds)):
        busy, children, started = _busy_seconds(), _children_cpu(), time.monotonic()
        done = subprocess.run(["ssh", "-F", cfg, *kinds[kind], host, "true"], capture_output=True)
        if done.returncode == 0:
            found[kind].append((time.monotonic() - started, _children_cpu() - children, _busy_seconds() - busy))
    rows = [[kind, len(v), f"{median([x[0] for x in v]) * 1000:.0f}", f"{median([x[1] for x in v]) * 1000:.0f}",
             f"{median([x[2] for x in v]) * 1000:.0f}", f"{median([x[1] for x in v]) * 1024 / 60:.1f}"]
            for kind, v in found.items() if v]
    print()
    table(["one ssh HOST true", "runs", "wall ms", "client CPU ms", "machine CPU ms", "1,024 clients: CPU minutes"], rows)
    note("a run over ssh starts one client per host on this machine: at scale their key exchange, not "
         "tflaunch, is what a launch costs it")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy (not idle, not waiting for a disk)."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def file_cost(run_dir: Path, tag: str, count: int = 64) -> float:
    """CPU seconds this process spends creating one file in a run folder: what the run needs per
    task (its log), in the same folder, so in the same ext4 block group. This machine's ext4 has no
    journal, and then ext4 passes over every inode of the group freed in the last minutes when it
    allocates one (``recently_deleted``): a new file costs 0.01 ms in a quiet group and 0.2 ms or
    more in one where many were just deleted (under /tmp, where the tests and benchmarks come and
    go, at times all day). What is created here stays until the whole benchmark ends, as every
    run's folder does."""
    started = time.thread_time()
    for i in range(count):
        os.close(os.open(run_dir / f".probe-{tag}-{i}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))
    return (time.thread_time() - started) / count


def start_time(doc: dict, hosts: int, work: Path, rep: int, source: str | None = None) \
        -> tuple[float, float, float, float] | None:
    """(seconds from launch until every task of ``hosts`` x 8 has printed its first line,
    tflaunch's own CPU seconds until then, the file cost in the run's own folders after the run
    and while its hosts log in: see :func:`file_cost`).
    ``source``: a folder whose launcher package tflaunch runs instead of this tree's."""
    chosen = doc["hosts"][:hosts]
    cluster = cluster_yaml(work / f"curve-{hosts}.yaml", chosen, 8, doc["ssh_config"])
    logs = work / f"curve-logs-{hosts}-{rep}-{Path(source).name if source else 'this'}"  # the newest run folder is this run's
    argv = [TFLAUNCH, str(cluster), "--quiet", "--no-check", "--log-dir", str(logs), "--",
            "sh", "-c", "echo up; exec sleep 3"]
    started = time.monotonic()
    proc = _bench.popen(argv, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                        env=_bench.launcher_env(source))
    expected = hosts * 8
    seen_at = None
    during: list[float] = []

    def all_up() -> bool:
        run_dir = _bench.last_run_dir(logs)
        if run_dir is None or not (run_dir / "run.json").exists():
            return False
        if not during:
            # The same cost while the hosts log in: the test hosts share this machine's filesystem,
            # and their login shells (pyenv's rehash in root's .bashrc) create and delete files on it.
            during.append(file_cost(run_dir, "during"))
        return (run_dir / "merged.log").exists() and \
            (run_dir / "merged.log").read_text(errors="replace").count("| up") >= expected

    if _bench.wait_for(all_up, timeout=120, interval=0.01):
        seen_at = time.monotonic() - started, cpu_seconds(proc.pid)
    proc.wait()
    run_dir = _bench.last_run_dir(logs)
    if seen_at is None or run_dir is None:
        return None
    return (*seen_at, file_cost(run_dir, "after"), during[0])


def reference_launcher(commit: str, work: Path) -> str | None:
    """A folder holding the launcher package of ``commit`` (``git archive``), compiled; None, with
    a note saying why, where this is no git clone or the commit is not in it."""
    folder = work / f"reference-{commit}"
    folder.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "launcher"], capture_output=True)
    if archive.returncode != 0:
        note(f"no reference launcher: git archive {commit}: "
             f"{archive.stderr.decode(errors='replace').strip() or archive.returncode}")
        return None
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    _bench.compile_sources(folder / "launcher")
    return str(folder)


def curve(doc: dict, sizes: list[int], work: Path, reps: int = 3, before: str | None = None,
          reference: str | None = None) -> None:
    """Part 3, interleaved with ``before`` and with ``reference``, the launcher of REFERENCE_COMMIT
    (a folder, see :func:`reference_launcher`), whose slope says how fast the machine is now."""
    sides = {"this tree": None, **({f"launcher from {before}": before} if before else {}),
             **({f"reference {REFERENCE_COMMIT}": reference} if reference else {})}
    slopes: dict[str, tuple[float, float, int, int]] = {}  # side -> (slope, its error, first size, last size)
    found: dict[tuple[str, int], list[tuple[float, float, float, float]]] = {(s, h): [] for s in sides for h in sizes}
    runs = [f"{side}|{h}" for side in sides for h in sizes]
    for rep, run_name in _bench.interleaved(reps, runs):
        side, hosts = run_name.split("|")
        value = start_time(doc, int(hosts), work, rep, sides[side])
        if value is not None:
            found[side, int(hosts)].append(value)
    for side in sides:
        mine = {h: found[side, h] for h in sizes}
        points = [(h, *(median([v[i] for v in mine[h]]) if mine[h] else None for i in range(4))) for h in sizes]
        rows = [[f"{h} hosts x 8 tasks", f"{h * 8}", f"{v:.2f}" if v else "-", f"{v / h * 1000:.0f}" if v else "-",
                 f"{c:.2f}" if c else "-", f"{f * 1000:.3f}" if f else "-", f"{d * 1000:.3f}" if d else "-"]
                for h, v, c, f, d in points]
        print()
        print(f"  {side}:")
        table(["cluster", "tasks", f"start s (median of {reps})", "ms per host", "tflaunch CPU s",
               "file CPU ms, after", "the same, hosts logging in"], rows)
        good = [(h, v, c) for h, v, c, _, _ in points if v]
        if len(good) < 2:
            if sides[side] is None:  # no slope to hold to the goal: a miss, not a pass
                _bench.verdict(f"tflaunch's CPU at start per extra host (runs at {len(good)} of {len(sizes)} sizes)",
                               float("nan"), START_CPU_TARGET_MS, " ms", guard=True)
            continue
        (h0, v0, c0), (h1, v1, c1) = good[0], good[-1]
        slope = (v1 - v0) / (h1 - h0)
        note(f"cost per extra host: {slope * 1000:.0f} ms (from {h0} to {h1} hosts, all sharing 2 cores here); "
             f"256 hosts at that slope: {v0 + slope * (256 - h0):.1f} s")
        ends_slope = (c1 - c0) / (h1 - h0) * 1000
        points = [(h, v[1]) for h in sizes for v in mine[h]]
        cpu_slope, error = (x * 1000 for x in least_squares_slope(points, with_error=True))
        files = 8 * 1000 * median([v[2] for h in (h0, h1) for v in mine[h]])
        crowded = 8 * 1000 * median([v[3] for h in (h0, h1) for v in mine[h]])
        note(f"tflaunch's CPU per extra host: {cpu_slope:.1f} ms fitted to all {len(points)} runs "
             f"(least squares, standard error {error:.1f} ms; {ends_slope:.1f} ms between the medians at {h0} "
             f"and {h1} hosts)")
        note(f"of it, creating its 8 task logs took about {crowded:.1f} ms on this filesystem "
             f"while the hosts logged in ({files:.1f} ms after the run; measured in each run's own folder); "
             f"the rest: {cpu_slope - crowded:.1f} ms")
        slopes[side] = cpu_slope, error, h0, h1
    if "this tree" not in slopes:
        return
    slope, error, h0, h1 = slopes["this tree"]
    name = f"tflaunch's CPU at start per extra host ({h0} to {h1} hosts x 8 tasks, all runs fitted)"
    reference_slope = slopes.get(f"reference {REFERENCE_COMMIT}")
    if reference_slope is None or not reference_slope[0] > 0:
        # No yardstick: the figure as measured is held to the goal, whatever the machine's speed.
        _bench.verdict(name, slope, START_CPU_TARGET_MS, " ms", guard=True)
        return
    _bench.verdict(f"{name}, on this machine now", slope, START_CPU_TARGET_MS, " ms")
    scale = REFERENCE_MS / reference_slope[0]
    relative = ((error / slope) ** 2 + (reference_slope[1] / reference_slope[0]) ** 2) ** 0.5 if slope > 0 else float("nan")
    note(f"the reference launcher ({REFERENCE_COMMIT}) took {reference_slope[0]:.1f} ms per extra host in these runs, "
         f"{REFERENCE_MS} ms on 2026-11-28 evening: this machine runs the same work {1 / scale:.2f} times as slow as then")
    note(f"this tree on that day's machine: {slope:.1f} x {REFERENCE_MS} / {reference_slope[0]:.1f} = {slope * scale:.1f} ms "
         f"(ratio to the reference {slope / reference_slope[0]:.2f}, standard error about {relative * 100:.0f} %)")
    _bench.verdict(f"{name}, scaled to the machine of 2026-11-28 by the reference launcher", slope * scale,
                   START_CPU_TARGET_MS, " ms", guard=True)


def running_cost(doc: dict, hosts: int, work: Path, rep: int, source: str | None = None) -> float | None:
    """tflaunch's own CPU per second (ms/s) over RUNNING_WINDOW seconds while ``hosts`` x 8 ``sleep``
    tasks run, from 2 s after every task printed its first line; None when they did not all start."""
    cluster = cluster_yaml(work / f"running-{hosts}.yaml", doc["hosts"][:hosts], 8, doc["ssh_config"],
                           port_base=21000)
    logs = work / f"running-logs-{hosts}-{rep}-{'before' if source else 'this'}"
    argv = [TFLAUNCH, str(cluster), "--quiet", "--no-check", "--log-dir", str(logs), "--",
            "sh", "-c", "echo up; exec sleep 600"]
    proc = _bench.popen(argv, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                        env=_bench.launcher_env(source))

    def all_up() -> bool:
        run_dir = _bench.last_run_dir(logs)
        merged = run_dir / "merged.log" if run_dir else None
        return bool(merged and merged.exists()) and merged.read_text(errors="replace").count("| up") >= hosts * 8

    try:
        if not _bench.wait_for(all_up, timeout=180, interval=0.05):
            return None
        time.sleep(2.0)  # the last tasks' first samples and statuses come in
        before, started = cpu_seconds(proc.pid), time.monotonic()
        time.sleep(RUNNING_WINDOW)
        return (cpu_seconds(proc.pid) - before) / (time.monotonic() - started) * 1000
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def running(doc: dict, hosts: int, work: Path, reps: int, before: str | None = None) -> None:
    sides = {"this tree": None, **({f"launcher from {before}": before} if before else {})}
    found: dict[str, list[float]] = {side: [] for side in sides}
    for rep, side in _bench.interleaved(reps, list(sides)):
        value = running_cost(doc, hosts, work, rep, sides[side])
        if value is not None:
            found[side].append(value)
            note(f"rep {rep + 1} {side}: {value:.1f} ms/s")
    print()
    table(["side", f"runs ({hosts} hosts x 8 tasks)", "median ms/s", "min", "max"],
          [[side, len(values), *spread(values)] for side, values in found.items()])
    # The target is for RUNNING_HOSTS hosts: at another size the figure is shown, not held to it.
    _bench.verdict(f"tflaunch's CPU per second while {hosts} hosts x 8 tasks run (median of {len(found['this tree'])})",
                   median(found["this tree"]), RUNNING_TARGET_MS, " ms/s", guard=hosts == RUNNING_HOSTS)


def least_squares_slope(points: list[tuple[float, float]], with_error: bool = False):
    """The slope of the straight line that fits ``points`` (x, y) best: one figure from every run,
    steadier than the difference of two medians when a few runs stray. ``with_error``: (slope, its
    standard error), which says how far apart two such figures may be by the runs' scatter alone."""
    n = len(points)
    mean_x, mean_y = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    spread_x = sum((x - mean_x) ** 2 for x, _ in points)
    if not spread_x:
        return (float("nan"), float("nan")) if with_error else float("nan")
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / spread_x
    if not with_error:
        return slope
    residuals = sum((y - mean_y - slope * (x - mean_x)) ** 2 for x, y in points)
    return slope, (residuals / (n - 2) / spread_x) ** 0.5 if n > 2 else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=7, help="repetitions per side of part 2 (default 7)")
    parser.add_argument("--curve", default="8,16,32", help="host counts of part 3 (default 8,16,32)")
    parser.add_argument("--skip-curve", action="store_true")
    parser.add_argument("--curve-reps", type=int, default=6, help="runs per size of part 3 (default 6: with 3, the fitted "
                        "slope's standard error was 1.8 ms here; with 6 to 8, 0.7 to 1.1)")
    parser.add_argument("--only-curve", action="store_true", help="parts 3 and 4 alone")
    parser.add_argument("--running-reps", type=int, default=3, help="runs of part 4 (default 3; 0: no part 4)")
    parser.add_argument("--runs-under", metavar="DIR", type=Path, default=ROOT / "logs",
                        help="where the benchmark's run folders are made (default: logs/ of this tree)")
    parser.add_argument("--before", metavar="DIR", help="parts 2, 3 and 4 also with the launcher package in DIR "
                        "(`git archive COMMIT launcher | tar -x -C DIR`), interleaved: before and after in one run")
    parser.add_argument("--no-reference", action="store_true",
                        help=f"part 3 without the launcher of {REFERENCE_COMMIT} interleaved as the yardstick of the "
                             f"machine's speed: the goal is then held on the figure as measured")
    args = parser.parse_args()
    sizes = [int(n) for n in args.curve.split(",") if n]
    _bench.header("bench_host_agent: one agent and one ssh connection per host, sshd at stock limits",
                  before=args.before)
    missing = _bench.testhosts_missing()
    if missing:
        print(f"RESULT skipped: {missing}; nothing was measured")
        return
    doc = up(max([8, *sizes]))
    if doc is None:
        return
    try:
        with _bench.workdir("hostagent", args.runs_under) as work:
            if not args.only_curve:
                many_on_one_host(doc, work)
                eight_by_eight(doc, work, args.reps, args.before)
                ssh_cost(doc, args.reps)
            if not args.skip_curve:
                reference = None if args.no_reference else reference_launcher(REFERENCE_COMMIT, work)
                curve(doc, sizes, work, args.curve_reps, args.before, reference)
                if args.running_reps:
                    running(doc, max(sizes), work, args.running_reps, args.before)
    finally:
        down()


if __name__ == "__main__":
    _bench.main_guard(main)
