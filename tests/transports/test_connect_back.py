"""The listener Slurm agents connect back to, against strangers: garbage, a TLS ClientHello, silent and
dripping clients, and a flood of 1,000 connections.

The first tests drive the listener class itself over real sockets on loopback (fast, no Slurm); the
rest start real runs on the test Slurm and attack tflaunch's own listener (found with ``ss``) while
the agents are still on their way (a setup line delays them).
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from conftest import ROOT
from polling import wait_for

from launcher.agent.channel import connect_back
from launcher.agent.protocol import hello_line, new_nonce
from launcher.transports.connectback import ConnectBack, source_address

TOKEN = "0123456789abcdef0123456789abcdef"
GARBAGE = b"\x00\xff\xfe\x1b[31mSTRANGER-GARBAGE\x1b[0m \xc3\x28\n"


def client_hello() -> bytes:
    """The first bytes a real TLS client sends (what scanners send to any open port)."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname="tflaunch.example")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    hello = outgoing.read()
    assert hello[:3] in (b"\x16\x03\x01", b"\x16\x03\x03") and len(hello) > 100
    return hello


def closed_by_peer(sock: socket.socket, timeout: float) -> bool:
    """True once the other side closed ``sock`` (EOF or reset), False if it stays open ``timeout`` s."""
    sock.settimeout(timeout)
    try:
        while True:
            if not sock.recv(4096):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def refuses(address: tuple[str, int]) -> bool:
    try:
        socket.create_connection(address, timeout=5).close()
    except ConnectionRefusedError:
        return True
    except ConnectionResetError:
        # The connection landed in the backlog of a listener that closed just then: ask again,
        # and the next one is refused.
        return False
    return False


def agent(address: tuple[str, int], name: str, then: bytes = b"") -> socket.socket:
    """A connection that went through an agent's side of the handshake (the agent's own code, tries
    again included), then sent ``then``."""
    sock = socket.socket(fileno=connect_back(address[0], address[1], TOKEN.encode(), name.encode(), 30.0))
    sock.sendall(then)
    return sock


class Dripper(threading.Thread):
    """A client that sends one byte (never a newline) every ``every`` seconds until it is closed."""

    def __init__(self, address: tuple[str, int], every: float):
        super().__init__(daemon=True)
        self.sock = socket.create_connection(address, timeout=30)
        self.every = every
        self.sent = 0
        self.closed_at: float | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.sock.sendall(b"x")
                self.sent += 1
            except OSError:
                self.closed_at = time.monotonic()
                return
            if closed_by_peer(self.sock, self.every):
                self.closed_at = time.monotonic()
                return


class Delivered:
    """What the listener handed over: (name, descriptor) pairs, in order."""

    def __init__(self):
        self.items: list[tuple[str, int]] = []
        self.arrived = threading.Condition()

    def __call__(self, name: str, fd: int) -> None:
        with self.arrived:
            self.items.append((name, fd))
            self.arrived.notify_all()

    def wait(self, count: int, timeout: float) -> list[tuple[str, int]]:
        with self.arrived:
            self.arrived.wait_for(lambda: len(self.items) >= count, timeout)
            return list(self.items)

    def close(self) -> None:
        for _, fd in self.items:
            os.close(fd)


@pytest.fixture
def listener():
    made: list[tuple[ConnectBack, Delivered]] = []

    def make(names=("n1", "n2"), **options) -> tuple[ConnectBack, Delivered]:
        delivered = Delivered()
        options.setdefault("within", 120.0)
        back = ConnectBack(names, TOKEN, delivered, "127.0.0.1", **options)
        back.start()
        made.append((back, delivered))
        return back, delivered

    yield make
    for back, delivered in made:
        back.close()
        delivered.close()


# -- the listener itself, over real sockets ----------------------------------------------------------

def readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 10)[0])


def test_agents_get_in_among_strangers_and_keep_what_follows_their_line(listener):
    # A 60 s handshake deadline: a listener that waited on its strangers one after the other would
    # take minutes here, not seconds.
    back, delivered = listener(deadline=60.0)
    address = ("127.0.0.1", back.port)
    strangers = [socket.create_connection(address) for _ in range(3)]  # silent
    garbage = socket.create_connection(address)
    garbage.sendall(GARBAGE)
    tls = socket.create_connection(address)
    tls.sendall(client_hello())
    wrong = socket.create_connection(address)
    wrong.sendall(hello_line(b"n1", new_nonce()))  # the right name, then a proof made without the token
    assert len(wrong.recv(512)) == 2 * 16 + 1 + 64 + 1  # the listener's nonce and proof, nothing more
    wrong.sendall(b"f" * 64 + b"\n")
    old = socket.create_connection(address)
    old.sendall(f"{TOKEN} n1\n".encode())  # the token in clear, as agents once sent it
    dripper = Dripper(address, every=0.2)
    dripper.start()
    start = time.monotonic()
    first = agent(address, "n1", b"FIRST-FRAME")
    wait_for(lambda: delivered.items, timeout=20.0, message="n1 to be delivered")
    again = socket.create_connection(address)
    again.sendall(hello_line(b"n1", new_nonce()))  # n1 once more: it is already in, so no answer
    second = agent(address, "n2", b"SECOND-FRAME")
    got = delivered.wait(2, timeout=20.0)
    took = time.monotonic() - start
    assert [name for name, _ in got] == ["n1", "n2"] and took < 20.0, (got, took)
    fds = dict(got)
    # Nothing after the line was taken: the agent's first frames are the new owner's to read.
    # The descriptors are non-blocking: what follows a line may arrive a moment after it.
    assert readable(fds["n1"]) and readable(fds["n2"])
    assert os.read(fds["n1"], 64) == b"FIRST-FRAME"
    assert os.read(fds["n2"], 64) == b"SECOND-FRAME"
    os.write(fds["n1"], b"reply")
    assert first.recv(16) == b"reply"
    assert again.recv(512) == b""  # closed without a word
    for sock in (garbage, tls, wrong, old, *strangers):
        assert closed_by_peer(sock, 10.0)
    dripper.join(10.0)
    assert dripper.closed_at is not None
    # Every expected caller is in: the listener's thread closes the port right after its last
    # delivery, which may land a moment after the test has read the delivered descriptors.
    wait_for(lambda: refuses(address), timeout=10.0, message="the port to close once every caller is in")


def test_a_handshake_has_one_deadline_for_the_whole_line(listener):
    back, delivered = listener(deadline=1.0)
    address = ("127.0.0.1", back.port)
    silent = socket.create_connection(address)
    dripper = Dripper(address, every=0.3)  # a byte well within any per-read timeout, forever
    start = time.monotonic()
    dripper.start()
    assert closed_by_peer(silent, 30.0)
    dripper.join(30.0)
    assert dripper.closed_at is not None and dripper.closed_at - start >= 0.9, dripper.closed_at
    assert dripper.sent >= 2
    # The listener itself stays open for the agents that have not come yet.
    agent(address, "n2")
    assert [name for name, _ in delivered.wait(1, timeout=20.0)] == ["n2"]


def test_close_and_a_dead_step_end_listening(listener):
    back, _ = listener()
    address = ("127.0.0.1", back.port)
    pending = socket.create_connection(address)
    back.close()
    assert refuses(address)  # closed when close() returns
    assert closed_by_peer(pending, 10.0)
    back.close()  # again: nothing happens

    alive = threading.Event()
    alive.set()
    other, _ = listener(alive=alive.is_set)
    address = ("127.0.0.1", other.port)
    socket.create_connection(address).close()
    alive.clear()  # srun died: no agent is coming any more
    deadline = time.monotonic() + 20.0
    while not refuses(address):
        assert time.monotonic() < deadline, "still listening 20 s after its step died"
        time.sleep(0.1)


HOLDER = """
import os, resource, sys
sys.path.insert(0, sys.argv[1])
if len(sys.argv) > 3:
    resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[3]), resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
from launcher.transports.connectback import ConnectBack
import select
def deliver(name, fd):
    select.select([fd], [], [], 10)  # the frame follows the proof, a moment later maybe
    print("delivered", name, os.read(fd, 64).decode(), flush=True)
back = ConnectBack(["n1", "n2"], sys.argv[2], deliver, "127.0.0.1", within=120.0)
back.start()
print(back.port, flush=True)
back._thread.join()
print("closed", flush=True)
"""


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.mark.parametrize("fd_limit", [None, 32], ids=["default", "32 descriptors"])
def test_a_flood_of_a_thousand_connections_costs_a_bounded_number_of_descriptors(fd_limit):
    # With 32 descriptors the listener runs out long before its 64 pending handshakes: running out
    # must cost the strangers their connections, not the agents theirs.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1500:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
    limit = [str(fd_limit)] if fd_limit else []
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(ROOT), TOKEN, *limit], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    flood: list[socket.socket] = []
    try:
        address = ("127.0.0.1", int(holder.stdout.readline()))
        before = open_fds(holder.pid)
        peak = before
        for _ in range(1000):
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(address)  # in progress or done: either way the listener sees it
            flood.append(sock)
            peak = max(peak, open_fds(holder.pid)) if len(flood) % 50 == 0 else peak
        time.sleep(1.0)
        peak = max(peak, open_fds(holder.pid))
        # 64 pending handshakes at most (the default for two callers), whatever the flood.
        assert peak - before <= 64 + 2 and peak <= (fd_limit or peak), (before, peak)
        for name in ("n1", "n2"):
            agent(address, name, f"frame-of-{name}".encode()).close()
            assert holder.stdout.readline().split() == ["delivered", name, f"frame-of-{name}"]
        assert holder.stdout.readline().strip() == "closed"
        assert holder.wait(timeout=30) == 0
        assert holder.stderr.read() == ""  # no traceback, and nothing of the strangers' bytes
    finally:
        for sock in flood:
            sock.close()
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def test_the_listening_address_is_the_one_the_routes_leave_from():
    assert source_address(["127.0.0.1"]) == "127.0.0.1"
    assert source_address(["localhost", "127.0.0.1"]) == "127.0.0.1"
    assert source_address(["no-such-node.invalid"]) is None
    assert source_address([]) is None


# -- tflaunch's own listener on the test Slurm ---------------------------------------------------------

AGENT_DELAY = 12  # seconds the setup line holds every agent back: the strangers' window


class SlurmRun:
    """``tflaunch --slurm`` as the batch shell of a real two-node job whose agents start late."""

    def __init__(self, testslurm, tmp_path: Path, command: str, delay: int = AGENT_DELAY):
        self.testslurm = testslurm
        self.folder = tmp_path
        cluster = tmp_path / "cluster.yaml"
        cluster.write_text(f"slurm:\n  nodes: 2\nsetup: sleep {delay}\n")
        self.pidfile = tmp_path / "tflaunch.pid"
        self.out = tmp_path / "job.out"
        script = tmp_path / "job.sh"
        script.write_text("#!/bin/bash\n"
                          f"echo $$ > {self.pidfile}\n"  # exec keeps the pid: this is tflaunch's
                          f"exec {sys.executable} -m launcher --slurm {cluster} --log-dir {tmp_path}/logs "
                          f"-- {command}\n")
        self.sbatch = subprocess.Popen(
            ["sbatch", "--wait", "--nodes=2", "--time=5", f"--output={self.out}", f"--chdir={tmp_path}",
             f"--export=ALL,PYTHONPATH={ROOT}", str(script)],
            env=testslurm.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
        self.pid = int(wait_for(lambda: self.pidfile.exists() and self.pidfile.read_text().strip(), timeout=120,
                                message=lambda: f"tflaunch's pid {self.state()}"))
        self.netns = None

    def listening(self) -> list[str]:
        """The local addresses tflaunch listens on (``ss -ltnpH`` in the batch node's namespace)."""
        found = []
        for node in self.testslurm.doc["nodes"]:
            if self.netns not in (None, node["netns"]):
                continue
            shown = subprocess.run(["nsenter", f"--net=/run/netns/{node['netns']}", "ss", "-ltnpH"],
                                   capture_output=True, text=True).stdout
            mine = [line.split()[3] for line in shown.splitlines() if f"pid={self.pid}," in line]
            if mine:
                self.netns = node["netns"]
            found += mine
        return found

    def dialled(self, listening: str) -> tuple[str, int]:
        """Where a node reaches the listener: the batch node's address, at the listening port."""
        return next(n["address"] for n in self.testslurm.doc["nodes"] if n["netns"] == self.netns), \
            host_port(listening)[1]

    def finish(self, timeout: float = 200.0) -> tuple[int, str]:
        try:
            self.sbatch.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.testslurm.cancel_all()
            self.sbatch.wait(timeout=60)
            raise AssertionError(f"the job did not end within {timeout:g} s:\n{self.output()[-3000:]}") from None
        return self.sbatch.returncode, self.output()

    def state(self) -> str:
        """What the job and tflaunch are doing, for a wait that ran out."""
        return (f"(jobs {self.testslurm.jobs()}, sbatch {self.sbatch.poll()}, listening "
                f"{self.listening() if hasattr(self, 'pid') else '?'}, output:\n{self.output()[-2000:]})")

    def output(self) -> str:
        return self.out.read_text(errors="replace") if self.out.exists() else ""

    def run_dir(self) -> Path:
        return next((self.folder / "logs").iterdir())


def host_port(text: str) -> tuple[str, int]:
    host, port = text.rsplit(":", 1)
    return host.strip("[]"), int(port)


@pytest.mark.slow
@pytest.mark.slurm
def test_strangers_at_the_listener_cannot_keep_the_agents_out(slurm, tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1500:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
    run = SlurmRun(slurm, tmp_path, "sh -c 'echo up on $SLURMD_NODENAME; sleep 4'")
    sockets: list[socket.socket] = []
    dripper = None
    try:
        listening = wait_for(run.listening, timeout=60, message=lambda: f"tflaunch's listener {run.state()}")
        assert len(listening) == 1, listening
        address = run.dialled(listening[0])
        # Slurm knows the nodes' addresses, so tflaunch listens on the one its routes to them leave
        # from (the batch node's own), not on every address.
        assert host_port(listening[0]) == address, listening
        before = open_fds(run.pid)
        for _ in range(1000):  # a flood first; the bad handshakes below then last their whole deadline
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(address)
            sockets.append(sock)
        time.sleep(1.0)
        flooded = open_fds(run.pid)
        for _ in range(3):
            sockets.append(socket.create_connection(address, timeout=30))  # silent
        garbage = socket.create_connection(address, timeout=30)
        garbage.sendall(GARBAGE)
        tls = socket.create_connection(address, timeout=30)
        tls.sendall(client_hello())
        dripper = Dripper(address, every=4.5)
        dripper.start()
        assert closed_by_peer(garbage, 30.0) and closed_by_peer(tls, 30.0)
        # The agents are still held back by the setup line: the strangers came first.
        assert run.listening() == listening and psutil.pid_exists(run.pid)
        # Once every agent is in, the listener closes while the run goes on.
        wait_for(lambda: not run.listening(), timeout=120, message=lambda: f"the listener to close {run.state()}")
        assert psutil.pid_exists(run.pid)
        code, out = run.finish()
    finally:
        if dripper is not None:
            dripper.stop.set()
        for sock in sockets:
            sock.close()
    assert code == 0 and "succeeded" in out, out[-3000:]
    assert {f"up on {node}" for node in slurm.nodes} <= {line.split(" | ", 1)[-1] for line in out.splitlines()}
    assert flooded - before <= 64 + 2, (before, flooded)  # a bounded number of pending handshakes
    assert dripper.closed_at is not None  # closed at its deadline, not kept while it drips
    everything = out + "".join(p.read_text(errors="replace") for p in run.run_dir().rglob("*") if p.is_file())
    assert "Traceback" not in everything
    assert "STRANGER-GARBAGE" not in everything and "\x16\x03" not in everything  # never echoed
    record = json.loads((run.run_dir() / "run.json").read_text())
    assert record["status"] == "succeeded" and {t["host"] for t in record["tasks"]} == set(slurm.nodes)


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.parametrize("end", ["interrupt", "srun killed"])
def test_the_listener_closes_when_the_run_ends_before_the_agents_are_in(slurm, tmp_path, end):
    run = SlurmRun(slurm, tmp_path, "true", delay=60)
    listening = wait_for(run.listening, timeout=60, message=lambda: f"tflaunch's listener {run.state()}")
    pending = socket.create_connection(run.dialled(listening[0]), timeout=30)  # a handshake in progress
    if end == "interrupt":
        os.kill(run.pid, signal.SIGINT)
    else:
        srun = wait_for(lambda: [p for p in psutil.Process(run.pid).children() if p.name() == "srun"], timeout=30,
                        message="tflaunch's srun")
        srun[0].kill()
    wait_for(lambda: not run.listening(), timeout=60, message=lambda: f"the listener to close {run.state()}")
    assert closed_by_peer(pending, 30.0)
    code, out = run.finish()
    assert code != 0 and "Traceback" not in out, out[-3000:]
    if end == "interrupt":  # the Ctrl-C's own exit, not that of the ports the agents never came to pick
        assert code == 128 + signal.SIGINT and "cannot pick ports" not in out, (code, out[-3000:])


def test_a_listener_that_closes_with_callers_missing_names_them():
    said: list[list[str]] = []
    back = ConnectBack(["n1", "n2", "n3"], TOKEN, Delivered(), "127.0.0.1", within=1.0, missing=said.append)
    back.start()
    try:
        agent(("127.0.0.1", back.port), "n2").close()
        wait_for(lambda: said, timeout=20.0, message="the missing callers to be named")
    finally:
        back.close()
    assert said == [["n1", "n3"]]
    closed = ConnectBack(["n1"], TOKEN, Delivered(), "127.0.0.1", within=60.0, missing=said.append)
    closed.start()
    closed.close()  # closed by its owner: nothing to say
    assert said == [["n1", "n3"]]


# The run's job step, on its own under salloc, with a listener that waits 3 s: the agents' setup line
# keeps them away for a minute, so the listener closes with both missing.
STEP_WITHOUT_AGENTS = """
import sys, time
sys.path.insert(0, sys.argv[1])
from launcher.cluster.plan import TaskLaunch
from launcher.transports import srun
srun.CONNECT_TIMEOUT = 3.0
nodes = sys.argv[2].split(",")
first = TaskLaunch(name="worker-0", role="worker", index=0, host=nodes[0], address=nodes[0] + ":1", local=False,
                   argv=("true",), env={}, workdir=sys.argv[3], setup="sleep 60", python=sys.executable,
                   transport="srun")
start = time.monotonic()
step = srun.AgentStep(nodes, first, 1.0, 30.0)
print("srun ended", step.popen.wait(timeout=50), "after", round(time.monotonic() - start), "s", flush=True)
"""


@pytest.mark.slow
@pytest.mark.slurm
def test_a_step_whose_listener_closed_with_agents_missing_is_cancelled(slurm, tmp_path):
    done = subprocess.run(["salloc", "--nodes=2", "--time=3", sys.executable, "-c", STEP_WITHOUT_AGENTS, str(ROOT),
                           ",".join(slurm.nodes), str(tmp_path)],
                          env=slurm.env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    line = next((l for l in done.stdout.splitlines() if l.startswith("srun ended")), done.stdout + done.stderr)
    assert line.startswith("srun ended") and int(line.split()[-2]) < 15, line  # not the minute of the setup line


# tflaunch in the shell of an allocation that stays: killed while the agents are still on their way.
KILLED_UNDER_SALLOC = """
{python} -m launcher --slurm {cluster} --log-dir {logs} -- sleep 60 > {console} 2>&1 &
echo $! > {pidfile}
wait
sleep 40
"""


@pytest.mark.slow
@pytest.mark.slurm
def test_nothing_of_the_step_outlives_tflaunch_killed_under_salloc(slurm, tmp_path):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("slurm:\n  nodes: 2\nsetup: sleep 30\n")
    pidfile = tmp_path / "tflaunch.pid"
    script = tmp_path / "shell.sh"
    console = tmp_path / "tflaunch.out"
    script.write_text(KILLED_UNDER_SALLOC.format(python=sys.executable, cluster=cluster, logs=tmp_path / "logs",
                                                 pidfile=pidfile, console=console))
    salloc = subprocess.Popen(["salloc", "--nodes=2", "--time=3", "bash", str(script)], cwd=tmp_path,
                              env={**slurm.env, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
    try:
        pid = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), timeout=60,
                           message="tflaunch's pid"))
        srun = wait_for(lambda: [p for p in psutil.Process(pid).children() if p.name() == "srun"], timeout=60,
                        message="tflaunch's srun")[0]
        wait_for(lambda: all(slurm.pids(node) for node in slurm.nodes), timeout=60,
                 message="the agents' step on both nodes")
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:  # the step failed and tflaunch with it: say why, not just that the pid is gone
            pytest.fail(f"tflaunch ended before it was killed:\n{console.read_text(errors='replace')[-3000:]}")
        killed = time.monotonic()
        wait_for(lambda: not srun.is_running() or srun.status() == psutil.STATUS_ZOMBIE, timeout=30,
                 message="srun to end with tflaunch")
        wait_for(lambda: not any(slurm.pids(node) for node in slurm.nodes), timeout=30,
                 message=lambda: f"the nodes to be empty: { {n: slurm.pids(n) for n in slurm.nodes} }")
        assert time.monotonic() - killed < 15  # not the half minute of the agents' setup line
        assert salloc.poll() is None  # the allocation itself stays: only tflaunch's own step went
    finally:
        for shell in psutil.Process(salloc.pid).children():  # its shell waits 40 s otherwise
            shell.kill()
        slurm.cancel_all()
        salloc.wait(timeout=60)


def test_a_step_whose_srun_is_slow_to_start_loses_no_node(tmp_path, monkeypatch):
    # srun's start held 2.5 s before its exec (a loaded host): the links' heartbeat passes, once a
    # second, must find the step's srun there, not fail every node's link.
    from launcher.cluster.plan import TaskLaunch
    from launcher.transports import srun

    fake = tmp_path / "bin" / "srun"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nexec sleep 30\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    monkeypatch.setattr(srun, "_ends_with", lambda parent: lambda: time.sleep(2.5))
    first = TaskLaunch(name="worker-0", role="worker", index=0, host="n1", address="n1:1", local=False,
                       argv=("true",), env={}, workdir=str(tmp_path), python=sys.executable, transport="srun")
    step = srun.AgentStep(["n1", "n2"], first, 1.0, 30.0)
    try:
        time.sleep(1.5)  # a heartbeat pass or two over the links
        assert {node: link.lost_reason for node, link in step.links.items()} == {"n1": None, "n2": None}
    finally:
        for link in step.links.values():
            link.close_channel()
        step.close(0.5)
