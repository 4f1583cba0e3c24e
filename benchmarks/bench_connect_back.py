"""Slurm agents connecting back to tflaunch: attach time without and with strangers at the listener.

    python benchmarks/bench_connect_back.py [--reps N]

Brings up a test cluster with ``scripts/testslurm up --prefix bcb --subnet 10.126.248`` (slurmctld
here, two slurmd nodes in network namespaces) and takes it down at the end, whatever happens.
Needs root, munge and slurm-wlm.

Inside one allocation of both nodes (``salloc -N2``), ``tflaunch --slurm --quiet -- true`` runs
2 x N times, the two sides alternating (order flipped every repetition). Side A: nothing else.
Side B: from the moment tflaunch's listener appears, strangers connect to it while the agents are
on their way: 1,000 connections held open, three silent ones, garbage bytes, a TLS ClientHello and
one client that drips a byte every 4.5 s. Attach time is from the listener's appearance (polled
in /proc through psutil every 5 ms) to its closing, which happens once every agent is in; the
run's wall time and tflaunch's peak descriptor count are shown beside it.
Target: median attach time of B / A <= 1.5, and every run succeeds.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time

import psutil

import _bench
from _bench import PYTHON, ROOT, median, note, spread, table

TARGET = 1.5
PREFIX, SUBNET = "bcb", "10.126.248"
POLL = 0.005
FLOOD = 1000


def client_hello() -> bytes:
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname="tflaunch.example")
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


class Strangers:
    """Everything side B throws at the listener, started on a thread of its own."""

    def __init__(self, address: tuple[str, int]):
        self.address = address
        self.sockets: list[socket.socket] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._attack, daemon=True)
        self.thread.start()

    def _attack(self) -> None:
        hello = client_hello()
        for _ in range(FLOOD):
            self._open()
        for _ in range(3):
            self._open()  # silent
        for payload in (b"\x00\xff\xfe garbage \x1b[31m\n", hello):
            sock = self._open()
            try:
                sock.send(payload)
            except OSError:
                pass
        dripper = self._open()
        while not self.done.wait(4.5):
            try:
                dripper.send(b"x")
            except OSError:
                return

    def _open(self) -> socket.socket:
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(self.address)
        self.sockets.append(sock)
        return sock

    def stop(self) -> None:
        self.done.set()
        self.thread.join(10)
        for sock in self.sockets:
            sock.close()


def listener_of(process: psutil.Process) -> tuple[str, int] | None:
    try:
        for conn in process.net_connections(kind="tcp4"):
            if conn.status == psutil.CONN_LISTEN:
                return conn.laddr.ip, conn.laddr.port
    except psutil.Error:
        pass
    return None


def one_run(logs: str, strangers: bool) -> dict | None:
    """One tflaunch --slurm run: attach time, wall time, peak descriptors (None when it failed)."""
    start = time.perf_counter()
    popen = subprocess.Popen([PYTHON, "-m", "launcher", "--slurm", "--quiet", "--log-dir", logs, "--", "true"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    process = psutil.Process(popen.pid)
    opened = closed = None
    attack = None
    peak = 0
    while popen.poll() is None and closed is None:
        address = listener_of(process)
        now = time.perf_counter()
        if address and opened is None:
            opened = now
            if strangers:
                # The listener sits on the address the nodes dial; 0.0.0.0 would mean any of ours.
                attack = Strangers(("127.0.0.1" if address[0] == "0.0.0.0" else address[0], address[1]))
        elif address is None and opened is not None:
            closed = now
        try:
            peak = max(peak, process.num_fds())
        except psutil.Error:
            pass
        time.sleep(POLL)
    out, err = popen.communicate(timeout=120)
    wall = time.perf_counter() - start
    if attack is not None:
        attack.stop()
    if popen.returncode != 0 or opened is None or closed is None or "Traceback" in err:
        print(f"   run failed (exit {popen.returncode}, listener seen {opened is not None}): "
              f"{err.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    return {"attach": closed - opened, "wall": wall, "fds": peak}


def inner(reps: int) -> None:
    """Inside the allocation: both sides, alternating; one JSON line with every figure."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(4096, hard)), hard))
    sides = {"A: alone": False, f"B: with {FLOOD + 6} strangers": True}
    results: dict[str, list[dict]] = {name: [] for name in sides}
    failed = {name: 0 for name in sides}
    for rep in range(reps):
        order = list(sides) if rep % 2 == 0 else list(reversed(list(sides)))
        for name in order:
            got = one_run(os.environ["BENCH_LOGS"], sides[name])
            if got is None:
                failed[name] += 1
            else:
                results[name].append(got)
    print("RESULTS " + json.dumps({"results": results, "failed": failed}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        inner(args.reps)
        return
    _bench.header("Slurm connect-back: agents' attach time without and with strangers at the listener",
                  [f"test cluster: scripts/testslurm up --prefix {PREFIX} --subnet {SUBNET}, {args.reps} reps"])
    if os.geteuid() != 0 or not shutil.which("salloc"):
        note("skipped: needs root, munge and slurm-wlm (a test Slurm cluster)")
        return
    with _bench.workdir("connect-back") as state, _bench.test_slurm(PREFIX, SUBNET, state / "cluster") as env:
        if env is None:
            return
        run = subprocess.run(["salloc", "-N2", "--", PYTHON, __file__, "--inner", "--reps", str(args.reps)],
                             capture_output=True, text=True, timeout=1800,
                             env={**env, "BENCH_LOGS": str(state / "logs")}, cwd=ROOT)
        sys.stderr.write(run.stderr if "run failed" in run.stderr else "")
        line = next((l for l in run.stdout.splitlines() if l.startswith("RESULTS ")), None)
        if line is None:
            note(f"allocation run failed: {run.stderr.strip()[-500:]}")
            return
        doc = json.loads(line[len("RESULTS "):])
        rows = []
        for name, runs in doc["results"].items():
            attach = spread([r["attach"] for r in runs])
            rows.append([name, *attach, median([r["wall"] for r in runs]), max((r["fds"] for r in runs), default=0),
                         f"{len(runs)}/{len(runs) + doc['failed'][name]}"])
        table(["side", "attach median s", "min s", "max s", "run wall median s", "peak fds", "succeeded"], rows)
        a, b = (median([r["attach"] for r in runs]) for runs in doc["results"].values())
        if any(doc["failed"].values()):
            note(f"failed runs: {doc['failed']}")
        _bench.verdict("attach time with strangers / alone", b / a, TARGET)

if __name__ == "__main__":
    main()
