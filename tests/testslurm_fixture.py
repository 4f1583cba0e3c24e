"""Session fixtures `testslurm` and `testslurm3`: real Slurm clusters (slurmctld + two, or three, slurmd nodes
in network namespaces).

Use it in a test::

    @pytest.mark.slow
    @pytest.mark.slurm
    def test_something(testslurm):
        testslurm.env                      # os.environ plus SLURM_CONF: pass to every Slurm/tflaunch call
        testslurm.nodes                    # ["s1a2-1", "s1a2-2"]
        testslurm.run("sinfo")             # CompletedProcess of a Slurm command, text
        testslurm.pids("s1a2-2")           # processes left on a node (its slurmd excluded)
        testslurm.wait_idle()              # every job finished, nothing left, both nodes idle again
        testslurm.kill_node(node); testslurm.revive(node)   # a node dies, and comes back (always revive)

`slurm` and `slurm3` are the same clusters, checked to be idle after each test.

The cluster comes up once per session under a random prefix, subnet 10.126.<1-250>.0/24 (never
used by scripts/testhosts or its tests) and controller port, so it cannot collide with a cluster someone
started by hand, and is taken down at the end of the session, also when tests fail. Without root,
`ip netns`, munge or slurm-wlm the fixture skips with the reason; under CI it fails instead.
"""

import importlib.machinery
import importlib.util
import json
import os
import random
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "testslurm"
DAEMONS = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd")


def _script_module():
    """scripts/testslurm itself, loaded once: asked in this process, a node's processes cost no Python start."""
    loader = importlib.machinery.SourceFileLoader("testslurm_script", str(SCRIPT))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


def unavailable_reason():
    if os.geteuid() != 0:
        return "the test Slurm cluster needs root (network namespaces, Slurm daemons)"
    if shutil.which("ip") is None or subprocess.run(["ip", "netns", "list"], capture_output=True).returncode:
        return "the test Slurm cluster needs `ip netns` (iproute2)"
    missing = [d for d in DAEMONS if not os.path.exists(d)] + [c for c in ("sbatch", "srun") if not shutil.which(c)]
    if missing:
        return f"the test Slurm cluster needs {', '.join(missing)}: apt-get install -y munge slurm-wlm"
    return None


def run_script(*args, timeout=90):
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


class TestSlurm:
    """A running test cluster, built from the JSON `scripts/testslurm up` prints."""

    __test__ = False

    def __init__(self, doc):
        self.doc = doc
        self.prefix = doc["prefix"]
        self.state_dir = doc["state_dir"]
        self.slurm_conf = doc["slurm_conf"]
        self.partition = doc["partition"]
        self.nodes = [n["name"] for n in doc["nodes"]]
        self.env = {**os.environ, "SLURM_CONF": self.slurm_conf}

    def run(self, *argv, timeout=60):
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=self.env,
                              stdin=subprocess.DEVNULL)

    def _script(self, *args):
        done = run_script(*args, "--prefix", self.prefix, "--state-dir", self.state_dir)
        if done.returncode != 0:
            raise RuntimeError(f"testslurm {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout

    def pids(self, node):
        # In this process: a test's end asks about every node several times a second, and a loaded
        # machine takes seconds to start the script once.
        return _SCRIPT.node_pids(self.doc, node)

    def kill_node(self, node):
        """The node dies: every process in it (slurmd included) killed, its link cut."""
        self._script("kill-node", node)

    def revive(self, node):
        """Bring a killed node back: link up, slurmd restarted, node resumed in Slurm."""
        self._script("revive", node)

    def jobs(self):
        """Jobs the controller still has pending or running."""
        out = self.run("squeue", "-h", "-o", "%i %T").stdout
        return [line.split() for line in out.splitlines() if line.strip()]

    def states(self):
        """Each node's state as sinfo names it: idle, alloc, comp, down*, idle* (not responding), ..."""
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t").stdout
        return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)

    def wait_idle(self, timeout=60.0):
        """Every job ended, nothing left on any node and every node idle, as slurmctld sees it (the next
        test's job can have it at once); raises AssertionError naming what stayed."""
        deadline = time.monotonic() + timeout
        while True:
            jobs, left, states = self.jobs(), {n: self.pids(n) for n in self.nodes}, self.states()
            if not jobs and not any(left.values()) and all(states.get(n) == "idle" for n in self.nodes):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"still there after {timeout:g} s: jobs {jobs}, processes {left}, "
                                     f"nodes {states}")
            time.sleep(0.2)

    def cancel_all(self):
        self.run("scancel", "--partition", self.partition)

    def down(self):
        self._script("down", "--keep-state")


_SCRIPT = _script_module()

# The OS's randomness, not the random module's: a random-order plugin reseeds that one before every
# test, so two sessions given the same seed would otherwise draw the same subnets and ports.
_random = random.SystemRandom()


def _free_port():
    while True:
        port = _random.randint(17000, 19990)
        with socket.socket() as a, socket.socket() as b:
            try:
                a.bind(("0.0.0.0", port))
                b.bind(("0.0.0.0", port + 1))
                return port
            except OSError:
                continue


def start_testslurm(state_dir, attempts=3, nodes=2):
    for attempt in range(attempts):
        prefix = "s" + secrets.token_hex(2)
        done = run_script("up", "--prefix", prefix, "--subnet", f"10.126.{_random.randint(1, 250)}",
                          "--port", str(_free_port()), "--state-dir", str(state_dir / prefix), "--nodes", str(nodes))
        if done.returncode == 0:
            return TestSlurm(json.loads(done.stdout))
        if ("overlaps" not in done.stderr and "in use" not in done.stderr) or attempt == attempts - 1:
            pytest.fail(f"testslurm up failed: {done.stderr.strip()}", pytrace=False)
    raise AssertionError("unreachable")


_shared: dict[int, dict] = {}  # node count -> {"cluster", "users"}


def _session_cluster(tmp_path_factory, nodes):
    reason = unavailable_reason()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI is set, so this fails instead of skipping)", pytrace=False)
        pytest.skip(reason)
    shared = _shared.setdefault(nodes, {"cluster": None, "users": 0})
    if shared["cluster"] is None:
        shared["cluster"] = start_testslurm(tmp_path_factory.mktemp("testslurm"), nodes=nodes)
    shared["users"] += 1
    try:
        yield shared["cluster"]
    finally:
        shared["users"] -= 1
        if shared["users"] == 0:
            cluster, shared["cluster"] = shared["cluster"], None
            cluster.cancel_all()
            cluster.down()  # the state dir stays under pytest's tmp dirs, for the daemons' logs


def _idle_after(cluster):
    yield cluster
    try:
        cluster.wait_idle(timeout=30)
    finally:
        cluster.cancel_all()


@pytest.fixture(scope="session")
def testslurm(tmp_path_factory):
    yield from _session_cluster(tmp_path_factory, 2)


@pytest.fixture(scope="session")
def testslurm3(tmp_path_factory):
    """A cluster of three nodes, for tests that hold a node back as a spare."""
    yield from _session_cluster(tmp_path_factory, 3)


@pytest.fixture
def slurm(testslurm):
    """The shared cluster, checked to be idle after the test: no job and no process on any node."""
    yield from _idle_after(testslurm)


@pytest.fixture
def slurm3(testslurm3):
    """The three-node cluster, checked to be idle after the test."""
    yield from _idle_after(testslurm3)
