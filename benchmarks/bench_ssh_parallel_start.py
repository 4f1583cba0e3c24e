"""Parallel start over ssh: 8 tasks on 4 namespaced hosts through tflaunch vs one ssh connection.

    python benchmarks/bench_ssh_parallel_start.py [--reps N] [--tasks T] [--hosts H]

Brings up H hosts with ``scripts/testhosts up --no-global --prefix bq --subnet 10.125.0`` (each a
network namespace with its own address and sshd; MaxStartups is raised by testhosts) and tears
them down at the end, whatever happens. Needs root.

Side A: ``tflaunch CLUSTER.yaml --quiet --no-check -- true`` with T tasks dealt round-robin to the
hosts (ssh options ["-F", <testhosts ssh_config>]): wall time until every task has run and
tflaunch has exited.
Side B: one connection, ``ssh -F <ssh_config> node1 true``.
Target: median(A) / median(B) <= 1.5.

For information, interleaved with those: T plain ``ssh nodeK true`` started together (the floor
for T connections on this machine), tflaunch with a single task, and tflaunch with ssh's
connection sharing (ControlMaster=auto, ControlPersist) once the masters are warm.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

import _bench
from _bench import ROOT, TFLAUNCH, median, note, spread, table

TARGET = 1.5
PREFIX, SUBNET = "bq", "10.125.0"
TESTHOSTS = ROOT / "scripts" / "testhosts"
PORT_BASE = 2222


def cluster_yaml(path: Path, hosts: list[dict], tasks: int, ssh_options: list[str]) -> Path:
    lines = ["ssh:", f"  options: {json.dumps(ssh_options)}", "  connect_timeout: 10", "worker:"]
    for i in range(tasks):
        h = hosts[i % len(hosts)]
        lines += [f"  - host: {h['name']}", f"    address: {h['address']}", f"    port: {PORT_BASE + i // len(hosts)}"]
    path.write_text("\n".join(lines) + "\n")
    return path


def timed(argv: list[str], cwd: Path) -> tuple[float, int]:
    with open(cwd / "console.log", "ab") as console:
        start = time.perf_counter()
        rc = _bench.popen(argv, cwd=cwd, stdout=console, stderr=console).wait()
        return time.perf_counter() - start, rc


def timed_parallel(argvs: list[list[str]], cwd: Path) -> tuple[float, int]:
    with open(cwd / "console.log", "ab") as console:
        start = time.perf_counter()
        procs = [_bench.popen(a, cwd=cwd, stdout=console, stderr=console) for a in argvs]
        codes = [p.wait() for p in procs]
        return time.perf_counter() - start, max(codes, key=abs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5, help="repetitions per side (default 5)")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--hosts", type=int, default=4)
    args = parser.parse_args()
    _bench.header(f"bench_ssh_parallel_start: {args.tasks} tasks on {args.hosts} namespaced hosts "
                  "vs one ssh connection",
                  [f"{args.reps} interleaved repetitions per side; every task runs `true`"])
    missing = _bench.testhosts_missing()
    if missing:
        print(f"RESULT skipped: {missing}; nothing was measured")
        return
    up = subprocess.run([str(TESTHOSTS), "up", "--no-global", "--prefix", PREFIX, "--subnet", SUBNET,
                         "--hosts", str(args.hosts)], capture_output=True, text=True)
    if up.returncode != 0:
        print(f"RESULT skipped: testhosts up failed: {up.stderr.strip()}")
        return
    try:
        with _bench.workdir("ssh") as work:
            measure(json.loads(up.stdout), args, work)
    finally:
        down = subprocess.run([str(TESTHOSTS), "down", "--prefix", PREFIX], capture_output=True, text=True)
        note(f"testhosts down: {'ok' if down.returncode == 0 else down.stderr.strip()}")


def measure(doc: dict, args, work: Path) -> None:
    cfg = doc["ssh_config"]
    hosts = doc["hosts"]
    note(f"hosts: {', '.join(h['name'] + ' ' + h['address'] for h in hosts)}; ssh config {cfg}")
    control = ["-o", "ControlMaster=auto", "-o", f"ControlPath={work}/cm-%C", "-o", "ControlPersist=120"]
    many = cluster_yaml(work / "many.yaml", hosts, args.tasks, ["-F", cfg])
    one = cluster_yaml(work / "one.yaml", hosts, 1, ["-F", cfg])
    shared = cluster_yaml(work / "shared.yaml", hosts, args.tasks, ["-F", cfg, *control])

    def tflaunch(cluster: Path) -> list[str]:
        return [TFLAUNCH, str(cluster), "--quiet", "--no-check", "--log-dir", str(work / "logs"), "--", "true"]

    sides = {
        "one ssh": lambda: timed(["ssh", "-F", cfg, hosts[0]["name"], "true"], work),
        "tflaunch": lambda: timed(tflaunch(many), work),
        f"{args.tasks} ssh": lambda: timed_parallel(
            [["ssh", "-F", cfg, hosts[i % len(hosts)]["name"], "true"] for i in range(args.tasks)], work),
        "tflaunch 1": lambda: timed(tflaunch(one), work),
        "tflaunch shared": lambda: timed(tflaunch(shared), work),
    }
    # Warm the shared connections once (not timed): one master per host, kept by ControlPersist.
    warm, rc = timed(tflaunch(shared), work)
    note(f"ControlMaster warm-up run: {warm:.2f} s, exit {rc}; "
         f"{len(list(work.glob('cm-*')))} master sockets for {len(hosts)} hosts")
    results: dict[str, list[tuple[float, int]]] = {k: [] for k in sides}
    try:
        for rep, side in _bench.interleaved(args.reps, list(sides)):
            wall, rc = sides[side]()
            results[side].append((wall, rc))
            note(f"rep {rep + 1} {side:16s} {wall:.3f} s, exit {rc}")
    finally:
        for h in hosts:  # close the shared masters
            subprocess.run(["ssh", "-F", cfg, *control, "-O", "exit", h["name"]], capture_output=True)

    labels = {
        "one ssh": "one connection: ssh node1 true",
        "tflaunch": f"tflaunch, {args.tasks} tasks on {len(hosts)} hosts",
        f"{args.tasks} ssh": f"{args.tasks} plain ssh ... true at once",
        "tflaunch 1": "tflaunch, 1 task on node1",
        "tflaunch shared": f"tflaunch, {args.tasks} tasks, ControlMaster warm",
    }
    base = median([w for w, rc in results["one ssh"] if rc == 0])
    rows = []
    for side, runs in results.items():
        walls = [w for w, rc in runs if rc == 0]
        rows.append([labels[side], f"{len(walls)}/{len(runs)}", *spread(walls),
                     f"{median(walls) / base:.2f}x" if walls else "-"])
    print()
    table(["side", "ok runs", "median s", "min s", "max s", "vs one ssh"], rows)
    a = median([w for w, rc in results["tflaunch"] if rc == 0])
    _bench.verdict(f"ratio tflaunch ({args.tasks} tasks) / one ssh connection", a / base, TARGET)


if __name__ == "__main__":
    _bench.main_guard(main)
