"""Session fixture `testhosts`: real hosts (network namespaces, each with its own sshd) for ssh tests.

Make it available in a conftest.py with::

    from tests.testhosts_fixture import testhosts  # noqa: F401  (or: from testhosts_fixture import ...)

and use it in a test::

    @pytest.mark.slow
    @pytest.mark.ssh
    def test_something(testhosts):
        node1, node2 = testhosts.hosts[:2]          # .name "node1", .address "10.124.x.11", .netns, .veth
        done = testhosts.run("node1", "hostname")   # CompletedProcess, text, stdout/stderr captured
        assert done.stdout.strip() == "node1"
        argv = ["ssh", *testhosts.ssh_options, "node2", "sleep 30"]   # for a Popen of your own
        assert testhosts.pids("node1") == []        # nothing of the test left on node1
        testhosts.cut("node2")                      # link failure: new connections time out
        testhosts.restore("node2")                  # always restore in a finally block: the hosts are shared
        port = testhosts.port()                     # a port for a task on the hosts: one no other test got

Tasks on the hosts listen on ports from `testhosts.port()`, never on a fixed number: a port an earlier
test listened on may still be held by that test's connections in TIME_WAIT (a minute on Linux), which
makes a later bind() without SO_REUSEADDR (TensorFlow's, the test tasks') fail whatever the test order.

Four hosts, node1 to node4, with sshd's stock limits, come up once per session under a random prefix ("t" + 4 hex digits) on a
random subnet 10.124.<1-250>.0/24, with no change to ~/.ssh/config or /etc/hosts: reach them through
`testhosts.ssh_options` (["-F", ssh_config]), which also resolves the names. Addresses are only usable
while the session's hosts are up. They are torn down at the end of the session, also when tests fail.

Without root, `ip netns` or /usr/sbin/sshd the fixture skips with the reason; when the CI environment
variable is set it fails instead, because CI must run these tests.
"""

import itertools
import json
import os
import random
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
SCRIPT = SCRIPTS / "testhosts"
SSHD = "/usr/sbin/sshd"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))
# Host: the scripts' own record of a host (.name, .address, .netns, .veth); netns_pids and sshd_pid
# are here for the tests of the test hosts themselves.
from _testnet import Host, host_pids, netns_pids, sshd_pid  # noqa: E402,F401


def unavailable_reason():
    """Why real test hosts cannot run here, or None if they can."""
    if os.geteuid() != 0:
        return "test hosts need root (network namespaces)"
    if shutil.which("ip") is None or subprocess.run(["ip", "netns", "list"], capture_output=True).returncode:
        return "test hosts need `ip netns` (iproute2) with network namespace support"
    if not os.path.exists(SSHD):
        return f"test hosts need {SSHD}: apt-get install -y openssh-server"
    if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        return "test hosts need the ssh client: apt-get install -y openssh-client"
    return None


def require_testhosts():
    """Skip the calling test (fail it under CI) when test hosts cannot run here."""
    reason = unavailable_reason()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI is set, so this fails instead of skipping)", pytrace=False)
        pytest.skip(reason)


# The OS's randomness, not the random module's: a random-order plugin reseeds that one before every
# test, so two sessions given the same seed would otherwise draw the same subnets and ports.
_random = random.SystemRandom()


def run_script(*args, timeout=60):
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


class TestHosts:
    """A running set of test hosts; built from the JSON that `scripts/testhosts up` prints."""

    __test__ = False  # not a test class, despite the name

    def __init__(self, doc):
        self.doc = doc
        self.prefix = doc["prefix"]
        self.state_dir = doc["state_dir"]
        self.ssh_config = doc["ssh_config"]
        self.identity_file = doc["identity_file"]
        self.hosts = [Host(**{k: h[k] for k in ("name", "address", "netns", "veth")}) for h in doc["hosts"]]
        self.ssh_options = ["-F", self.ssh_config]
        # Below Linux's ephemeral range (32768-60999), so no outgoing connection's port ever holds one.
        self._ports = itertools.count(_random.randrange(20000, 28000))

    def port(self, span=1):
        """The first of ``span`` consecutive TCP ports that no earlier caller in this session got."""
        first = next(self._ports)
        for _ in range(span - 1):
            next(self._ports)
        return first

    def host(self, name):
        for h in self.hosts:
            if name in (h.name, h.address):
                return h
        raise KeyError(f"no test host {name!r}; have {[h.name for h in self.hosts]}")

    def ssh_argv(self, host_name, shell_cmd, *options):
        return ["ssh", *self.ssh_options, *options, self.host(host_name).name, shell_cmd]

    def run(self, host_name, shell_cmd, *options, timeout=60, check=False):
        """Run shell_cmd on the host over ssh; returns the CompletedProcess (text, output captured)."""
        return subprocess.run(self.ssh_argv(host_name, shell_cmd, *options), capture_output=True, text=True,
                              timeout=timeout, check=check, stdin=subprocess.DEVNULL)

    def _script(self, *args):
        done = run_script(*args, "--prefix", self.prefix, "--state-dir", self.state_dir)
        if done.returncode != 0:
            raise RuntimeError(f"testhosts {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout

    def pids(self, host_name):
        """Pids of processes in the host's namespace other than its sshd listener, as
        ``scripts/testhosts pids`` prints them, read in this process (in milliseconds)."""
        host = self.host(host_name)
        return host_pids(host.netns, os.path.join(self.state_dir, host.name))

    def cut(self, host_name):
        self._script("cut", self.host(host_name).name)

    def restore(self, host_name):
        self._script("restore", self.host(host_name).name)

    def down(self, keep_state=True):
        args = ["down", "--keep-state"] if keep_state else ["down"]
        self._script(*args)


def start_testhosts(state_dir, count=4, attempts=3, stock_limits=True):
    """Bring up a set with a fresh prefix and subnet; retries when the random subnet is taken.

    Their sshds keep OpenSSH's stock MaxStartups and MaxSessions unless ``stock_limits`` is False:
    what real hosts allow is what tflaunch must live within."""
    extra = ["--stock-limits"] if stock_limits else []
    for attempt in range(attempts):
        prefix = "t" + secrets.token_hex(2)
        subnet = f"10.124.{_random.randint(1, 250)}"
        done = run_script("up", "--no-global", "--hosts", str(count), "--prefix", prefix, "--subnet", subnet,
                          "--state-dir", str(state_dir), *extra)
        if done.returncode == 0:
            return TestHosts(json.loads(done.stdout))
        if "overlaps" not in done.stderr or attempt == attempts - 1:
            pytest.fail(f"testhosts up failed: {done.stderr.strip()}", pytrace=False)
    raise AssertionError("unreachable")


# One set per pytest process even when several modules import the fixture (each import registers its
# own session fixture): the first user brings it up, the last one to finish takes it down.
_shared = {"hosts": None, "users": 0}


@pytest.fixture(scope="session")
def testhosts(tmp_path_factory):
    require_testhosts()
    if _shared["hosts"] is None:
        _shared["hosts"] = start_testhosts(tmp_path_factory.mktemp("testhosts") / "state")
    _shared["users"] += 1
    try:
        yield _shared["hosts"]
    finally:
        _shared["users"] -= 1
        if _shared["users"] == 0:
            hosts, _shared["hosts"] = _shared["hosts"], None
            hosts.down(keep_state=True)  # the state dir stays under pytest's tmp dirs, for its sshd logs
