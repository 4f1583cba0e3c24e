"""Nodes that join a run (``--nnodes --node-rank --rdzv-endpoint``, every node starting tflaunch
itself) beside hosts reached over ssh: what tflaunch itself costs per node, and how soon the run
starts once its last node does.

    python benchmarks/bench_joined_nodes.py [--nodes 8] [--reps 2] [--window 10]

Needs root. Brings up ``--nodes`` hosts with ``scripts/testhosts up --stock-limits`` under its own
prefix and takes them down at the end, whatever happens. Two parts, each printed as a table:

1. **tflaunch's own CPU per node**, at start and while running, the two ways interleaved
   (``--reps`` runs each): one ``sh -c 'echo up; exec sleep'`` task per host, either
   ``tflaunch CLUSTER`` over ssh from this machine, or every node running
   ``tflaunch --nnodes N --node-rank R`` in its own host's namespace, rank 0 owning the run. The
   CPU is user + system from /proc of the tflaunch process alone (its ssh clients and agents
   apart): at start, from launch until every task printed its first line; running, per second
   over ``--window`` seconds from 2 s after that. For joined nodes, the owner's CPU per node, and
   beside it a joining node's own tflaunch (the median of the nodes), which only starts its
   agent and echoes its tasks' lines, and the two added up. Target: the owner's CPU per node no
   higher than tflaunch's per ssh host, at start and running (the medians' ratio <= 1).
2. **From the last node's start to every node's tasks started**: the owner and every node but
   one started and joined, then the last started: seconds from its start until every task printed
   its first line; beside it, one task's start (``tflaunch --local 1``: from launch to its task's
   first line). Target: within one task start plus 2 s.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import time
from pathlib import Path

import _bench
from _bench import PYTHON, TFLAUNCH, median, note, spread, table

PREFIX, SUBNET = "bjn", "10.125.9"
UP = "echo up; exec sleep 600"
SETTLE = 2.0  # after every task is up: the last samples and statuses come in
JOINED_BEFORE_LAST = 6.0  # seconds the other nodes get to start and join before the last one starts
SLACK_TARGET = 2.0  # the last node's start to every task up: one task start plus this


def up(count: int) -> dict | None:
    return _bench.hosts_up(PREFIX, SUBNET, count)


def down() -> None:
    _bench.hosts_down(PREFIX)


def cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid`` alone (not its children), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def all_up(logs: Path, count: int) -> bool:
    run_dir = _bench.last_run_dir(logs)
    merged = run_dir / "merged.log" if run_dir else None
    return bool(merged and merged.exists()) and merged.read_text(errors="replace").count("| up") >= count


def stop(procs: list[subprocess.Popen]) -> None:
    """SIGINT to the first (the run's owner, or the only one), then every one reaped."""
    procs[0].send_signal(signal.SIGINT)
    for proc in procs:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


class Sides:
    """The two ways of starting the same run on ``doc``'s hosts."""

    def __init__(self, doc: dict, work: Path):
        self.doc, self.work = doc, work
        self.hosts = doc["hosts"]
        self.token = secrets.token_hex(16)
        self.env = {**os.environ, "TFLAUNCH_RDZV_TOKEN": self.token}
        self.cluster = work / "ssh.yaml"
        lines = [f"ssh:\n  options: [\"-F\", \"{doc['ssh_config']}\"]", "worker:",
                 *(f"  - {{host: {h['name']}, address: {h['address']}, port: 22000}}" for h in self.hosts)]
        self.cluster.write_text("\n".join(lines) + "\n")
        self.runs = 0

    def logs(self) -> Path:
        self.runs += 1
        return self.work / f"logs-{self.runs}"

    def ssh(self, logs: Path) -> list[subprocess.Popen]:
        argv = [TFLAUNCH, str(self.cluster), "--quiet", "--no-check", "--log-dir", str(logs), "--", "sh", "-c", UP]
        return [_bench.popen(argv, cwd=self.work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]

    def node(self, rank: int, logs: Path, port: int) -> subprocess.Popen:
        host = self.hosts[rank]
        argv = ["ip", "netns", "exec", host["netns"], TFLAUNCH, "--nnodes", str(len(self.hosts)),
                "--node-rank", str(rank), "--rdzv-endpoint", f"{self.hosts[0]['address']}:{port}",
                "--rdzv-timeout", "120", "--quiet", "--no-check", "--log-dir", str(logs), "--", "sh", "-c", UP]
        return _bench.popen(argv, cwd=self.work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=self.env)

    def joined(self, logs: Path, ranks: range | None = None, port: int | None = None) -> list[subprocess.Popen]:
        port = port or _bench.free_ports(1)[0]
        return [self.node(rank, logs, port) for rank in (ranks or range(len(self.hosts)))]


def costs(sides: Sides, side: str, window: float) -> tuple[float, float, float | None, float | None] | None:
    """(the owner's CPU s at start, its CPU ms/s running, a joining node's CPU s at start, its ms/s
    running), per node for the owner (``ip netns exec`` execs tflaunch: its pid is tflaunch's); None when the tasks did not all start."""
    logs = sides.logs()
    procs = sides.ssh(logs) if side == "ssh" else sides.joined(logs)
    count = len(sides.hosts)
    try:
        if not _bench.wait_for(lambda: all_up(logs, count), timeout=180, interval=0.02):
            return None
        start = [cpu_seconds(p.pid) for p in procs]
        time.sleep(SETTLE)
        before, started = [cpu_seconds(p.pid) for p in procs], time.monotonic()
        time.sleep(window)
        elapsed = time.monotonic() - started
        running = [(cpu_seconds(p.pid) - b) / elapsed * 1000 for p, b in zip(procs, before)]
    finally:
        stop(procs)
    others = (median(start[1:]), median(running[1:])) if len(procs) > 1 else (None, None)
    return start[0] / count, running[0] / count, *others


def cpu_part(sides: Sides, reps: int, window: float) -> None:
    found: dict[str, list[tuple]] = {"ssh": [], "joined": []}
    for rep, side in _bench.interleaved(reps, list(found)):
        value = costs(sides, side, window)
        if value is None:
            note(f"rep {rep + 1} {side}: the tasks did not all start")
            continue
        found[side].append(value)
        note(f"rep {rep + 1} {side}: {value[0] * 1000:.1f} ms per node at start, {value[1]:.2f} ms/s per node running")
    count = len(sides.hosts)

    def column(side: str, i: int, scale: float = 1.0) -> list[float]:
        return [v[i] * scale for v in found[side] if v[i] is not None]

    rows = [[f"ssh: tflaunch per host ({count} hosts)", len(found["ssh"]), *spread(column("ssh", 0, 1000)),
             median(column("ssh", 1))],
            [f"joined: the owner per node ({count} nodes)", len(found["joined"]), *spread(column("joined", 0, 1000)),
             median(column("joined", 1))],
            ["joined: a joining node's own tflaunch", len(found["joined"]), *spread(column("joined", 2, 1000)),
             median(column("joined", 3))]]
    print()
    table(["side", "runs", "start CPU ms (median)", "min", "max", "running ms/s (median)"], rows)
    _bench.verdict("tflaunch's CPU at start, per joined node / per ssh host",
                   median(column("joined", 0)) / median(column("ssh", 0)), 1.0)
    _bench.verdict("tflaunch's CPU running, per joined node / per ssh host",
                   median(column("joined", 1)) / median(column("ssh", 1)), 1.0)
    # Each joined node also runs a tflaunch of its own (on that node, not on rank 0's machine): counted in.
    note("with each joining node's own tflaunch added to the owner's share, over tflaunch per ssh host: "
         f"{(median(column('joined', 0)) + median(column('joined', 2))) / median(column('ssh', 0)):.2f}x at start, "
         f"{(median(column('joined', 1)) + median(column('joined', 3))) / median(column('ssh', 1)):.2f}x running")


def one_task_start(work: Path) -> float | None:
    logs = work / f"local-{time.monotonic_ns()}"
    started = time.monotonic()
    procs = [_bench.popen([TFLAUNCH, "--local", "1", "--quiet", "--no-check", "--log-dir", str(logs), "--",
                           "sh", "-c", UP], cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        if not _bench.wait_for(lambda: all_up(logs, 1), timeout=60, interval=0.01):
            return None
        return time.monotonic() - started
    finally:
        stop(procs)


def last_node(sides: Sides) -> float | None:
    """Seconds from the last node's start to every node's task up, the others joined before it."""
    logs, port, count = sides.logs(), _bench.free_ports(1)[0], len(sides.hosts)
    procs = sides.joined(logs, range(count - 1), port)
    try:
        time.sleep(JOINED_BEFORE_LAST)
        started = time.monotonic()
        procs.append(sides.node(count - 1, logs, port))
        if not _bench.wait_for(lambda: all_up(logs, count), timeout=120, interval=0.01):
            return None
        return time.monotonic() - started
    finally:
        stop(procs)


def start_part(sides: Sides, reps: int) -> None:
    found: dict[str, list[float]] = {"last node": [], "one task": []}
    for _, side in _bench.interleaved(reps, list(found)):
        value = last_node(sides) if side == "last node" else one_task_start(sides.work)
        if value is not None:
            found[side].append(value)
    count = len(sides.hosts)
    print()
    table(["from", "runs", "median s", "min s", "max s"],
          [[f"the last of {count} nodes' start to every task up", len(found["last node"]),
            *spread(found["last node"])],
           ["one task's start (tflaunch --local 1 to its first line)", len(found["one task"]),
            *spread(found["one task"])]])
    _bench.verdict(f"the last node's start to every task up, beyond one task start ({count} nodes)",
                   median(found["last node"]) - median(found["one task"]), SLACK_TARGET, " s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=8, help="hosts, and nodes (default 8)")
    parser.add_argument("--reps", type=int, default=2, help="runs per side of each part (default 2)")
    parser.add_argument("--window", type=float, default=10.0, help="seconds the running cost is read over (default 10)")
    args = parser.parse_args()
    _bench.header("bench_joined_nodes: every node starts tflaunch itself, beside hosts over ssh",
                  [f"{args.nodes} nodes, {args.reps} runs per side, running cost over {args.window:g} s; "
                   f"python {PYTHON}"])
    missing = _bench.testhosts_missing()
    if missing:
        print(f"RESULT skipped: {missing}; nothing was measured")
        return
    doc = up(args.nodes)
    if doc is None:
        return
    try:
        with _bench.workdir("joinednodes") as work:
            sides = Sides(doc, work)
            cpu_part(sides, args.reps, args.window)
            start_part(sides, args.reps)
    finally:
        down()


if __name__ == "__main__":
    _bench.main_guard(main)
