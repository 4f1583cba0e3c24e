"""Nodes that join a run (``--nnodes --node-rank --rdzv-endpoint``, every node starting tflaunch
itself) beside hosts reached over ssh: what tflaunch itself costs per node, and how soon the run
starts once its last node does.

    python benchmarks/bench_joined_nodes.py [--nodes 8] [--reps 2] [--window 10]

Needs root. Brings up ``--nodes`` hosts with ``scripts/testhosts up --stock-limits`` under its own
prefix and takes them down at the end, whatever happens. Two parts, each printed as a table:

1. **tflaunch's own CPU per node**, at start and while running, the two ways interleaved
   (``--reps`` runs each): one ``sh -c 'echo up; exec sleep'`` task per host, either
   ``tflaunch CLUSTER`` over ssh from this machine, or every node running
   ``tflaunch --nnodes N --node-rank R`` in its own host's namespace, rank 0 owning the run. Like
   is compared with like: on each side, every process tflaunch runs for the run, wherever it runs,
   and nothing else. Over ssh: tflaunch, its ssh clients, and each host's agent (the login shell
   that starts it included: it execs the agent). Joined: rank 0's tflaunch, its own agent, and
   each other node's process (its tflaunch, which becomes the node's agent). Not counted on either
   side: the tasks, and what the platform runs to start a process on a host (sshd and its
   session, shown on a row of its own and in a note beside the verdicts; a platform's container
   runtime). The CPU is user + system from /proc, read when every
   task printed its first line (start) and per second over ``--window`` seconds from 2 s after
   that (running), per host. Beside the totals, each side's parts: tflaunch alone (the owner for
   joined nodes), and per host its ssh client and agent, or a joining node's process. Target: the
   total per joined node no higher than per ssh host, at start and running (the medians' ratio <= 1).
2. **From the last node's start to every node's tasks started**: the owner and every node but
   one started and joined, then the last started: seconds from its start until every task printed
   its first line; beside it, one task's start (``tflaunch --local 1``: from launch to its task's
   first line). Target: within one task start plus 2 s.
"""

from __future__ import annotations

import argparse
import json
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


def cpu_seconds(pid: int, reaped: bool = False) -> float:
    """User + system CPU of ``pid`` alone, from /proc; with ``reaped``, that of the children it
    has reaped too (sshd's monitor: its pre-authentication child, which did the key exchange)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if reaped else 0)
    return ticks / os.sysconf("SC_CLK_TCK")


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


def parent_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def ssh_clients(pid: int) -> list[int]:
    """The ssh clients tflaunch ``pid`` started (its children named ssh)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and parent_of(int(entry.name)) == pid:
            try:
                if (entry / "comm").read_text().strip() == "ssh":
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def comm(pid: int | None) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def sshd_sessions(agents: list[int]) -> list[int]:
    """The sshd processes of each agent's connection (its session and privilege monitor), not the
    listening sshd above them: the far end of each ssh client, which starts the agent on its host."""
    found = []
    for agent in agents:
        pid = parent_of(agent)
        while comm(pid) == "sshd" and comm(parent_of(pid)) == "sshd":
            found.append(pid)
            pid = parent_of(pid)
    return found


def run_processes(logs: Path, procs: list[subprocess.Popen], side: str, count: int) -> dict[str, list[int]]:
    """The processes tflaunch runs for the run, by part: ``tflaunch`` (the launching process, or
    rank 0's), ``carrier`` (ssh clients), ``agent`` (each host's agent: its task's parent; a
    joining node's process is its agent)."""
    def task_pids() -> list[int]:
        try:
            tasks = json.loads((_bench.last_run_dir(logs) / "run.json").read_text())["tasks"]
        except ValueError:  # being replaced
            return []
        return [task["pid"] for task in tasks if task.get("pid")]

    _bench.wait_for(lambda: len(task_pids()) == count, timeout=30)  # run.json follows the tasks' start
    agents = {parent for pid in task_pids() for parent in [parent_of(pid)] if parent}
    agents.update(proc.pid for proc in procs[1:])  # a joining node's process is its agent
    return {"tflaunch": [procs[0].pid], "carrier": ssh_clients(procs[0].pid) if side == "ssh" else [],
            "agent": sorted(agents), "sshd": sshd_sessions(sorted(agents)) if side == "ssh" else []}


def cpu_of(pids: list[int], sshd: frozenset[int] = frozenset()) -> float:
    total = 0.0
    for pid in pids:
        try:
            total += cpu_seconds(pid, reaped=pid in sshd)
        except OSError:
            pass  # gone: not counted
    return total


PARTS = ("tflaunch", "carrier", "agent")


def costs(sides: Sides, side: str, window: float) -> dict[str, tuple[float, float]] | None:
    """{part: (CPU s at start, CPU ms/s running)} per host, for each part and ``all``
    (``ip netns exec`` execs tflaunch: its pid is tflaunch's); None when the tasks did not all start."""
    logs = sides.logs()
    procs = sides.ssh(logs) if side == "ssh" else sides.joined(logs)
    count = len(sides.hosts)
    try:
        if not _bench.wait_for(lambda: all_up(logs, count), timeout=180, interval=0.02):
            return None
        parts = run_processes(logs, procs, side, count)
        parts["all"] = sorted({pid for part in PARTS for pid in parts[part]})
        parts["with sshd"] = sorted({*parts["all"], *parts["sshd"]})
        sshd = frozenset(parts["sshd"])
        start = {part: cpu_of(pids, sshd) for part, pids in parts.items()}
        time.sleep(SETTLE)
        before, started = {part: cpu_of(pids, sshd) for part, pids in parts.items()}, time.monotonic()
        time.sleep(window)
        elapsed = time.monotonic() - started
        running = {part: (cpu_of(pids, sshd) - before[part]) / elapsed * 1000 for part, pids in parts.items()}
    finally:
        stop(procs)
    return {part: (start[part] / count, running[part] / count) for part in parts}


def cpu_part(sides: Sides, reps: int, window: float) -> None:
    found: dict[str, list[dict]] = {"ssh": [], "joined": []}
    for rep, side in _bench.interleaved(reps, list(found)):
        value = costs(sides, side, window)
        if value is None:
            note(f"rep {rep + 1} {side}: the tasks did not all start")
            continue
        found[side].append(value)
        note(f"rep {rep + 1} {side}: all of tflaunch's processes {value['all'][0] * 1000:.1f} ms per host at start, "
             f"{value['all'][1]:.2f} ms/s per host running")
    count = len(sides.hosts)

    def column(side: str, part: str, i: int, scale: float = 1.0) -> list[float]:
        return [v[part][i] * scale for v in found[side]]

    def ratio(joined: float, ssh: float) -> str:
        return f"{joined / ssh:.2f}x" if ssh else "n/a (no tick counted over ssh)"

    def row(label: str, side: str, part: str) -> list[object]:
        return [label, len(found[side]), *spread(column(side, part, 0, 1000)), median(column(side, part, 1))]

    rows = [row(f"ssh, all: tflaunch + ssh clients + agents, per host ({count} hosts)", "ssh", "all"),
            row(f"joined, all: rank 0's tflaunch and agent + each node's process, per node ({count})", "joined", "all"),
            row("  ssh: tflaunch alone, per host", "ssh", "tflaunch"),
            row("  joined: rank 0's tflaunch alone, per node", "joined", "tflaunch"),
            row("  ssh: the ssh clients, per host", "ssh", "carrier"),
            row("  ssh: the agents (login shell included), per host", "ssh", "agent"),
            row("  joined: rank 0's agent and each node's process (its tflaunch, then its agent), per node",
                "joined", "agent"),
            row("  ssh: sshd's end of each connection (not tflaunch's: the platform's, as a node's start)",
                "ssh", "sshd"),
            row(f"ssh, all and sshd's end of each connection, per host ({count})", "ssh", "with sshd")]
    print()
    table(["counted", "runs", "start CPU ms (median)", "min", "max", "running ms/s (median)"], rows)
    _bench.verdict("CPU at start of all of tflaunch's processes, per joined node / per ssh host",
                   median(column("joined", "all", 0)) / median(column("ssh", "all", 0)), 1.0)
    if median(column("ssh", "all", 1)):
        _bench.verdict("CPU running of all of tflaunch's processes, per joined node / per ssh host",
                       median(column("joined", "all", 1)) / median(column("ssh", "all", 1)), 1.0)
    else:
        note("running: no clock tick counted over ssh; take a longer --window")
    note("with sshd's end of each ssh connection counted too (it starts the agent on its host, as a node's own "
         "tflaunch does), per joined node / per ssh host: "
         f"{ratio(median(column('joined', 'all', 0)), median(column('ssh', 'with sshd', 0)))} at start, "
         f"{ratio(median(column('joined', 'all', 1)), median(column('ssh', 'with sshd', 1)))} running")
    note("tflaunch's own process alone, per joined node (rank 0's) / per ssh host: "
         f"{ratio(median(column('joined', 'tflaunch', 0)), median(column('ssh', 'tflaunch', 0)))} at start, "
         f"{ratio(median(column('joined', 'tflaunch', 1)), median(column('ssh', 'tflaunch', 1)))} running")


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
