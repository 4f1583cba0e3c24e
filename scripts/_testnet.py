"""What scripts/testhosts and scripts/testslurm share: a set of network namespaces on one bridge,
the processes in them, the state directory that records the set, and the one-line error boundary.

Every name a script keeps comes from its own name and a prefix: `Tool("testhosts", "hosts.json")`
keeps its state in /tmp/tflaunch-testhosts-<prefix> (marked by .tflaunch-testhosts, the only kind of
directory it ever deletes), points at it from /run/tflaunch-testhosts/<prefix>.state and describes
the set in <state>/hosts.json.
"""

import contextlib
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

SAFE_PATH = re.compile(r"/[A-Za-z0-9_.,/+=@-]*")  # nothing a config file would quote or expand (%, ~, spaces)
KILL_WAIT = 3.0


class TestbedError(Exception):
    """An expected failure, reported as one line on stderr with exit code 1."""


@dataclass(frozen=True)
class Host:
    """One namespace of a set: its hostname, its address on the bridge, and its veth's root end."""
    name: str
    address: str
    netns: str
    veth: str


# ---- names (pure) ----

def validate_prefix(prefix, max_len):
    if not re.fullmatch(rf"[a-z][a-z0-9]{{0,{max_len - 1}}}", prefix):
        raise TestbedError(f"--prefix: expected a lowercase letter then up to {max_len - 1} "
                           f"lowercase letters or digits, got {prefix!r}")
    return prefix


def validate_subnet(subnet, example, allowed, allowed_text):
    """The /24 whose first three octets are given, if it lies inside one of the allowed networks."""
    parts = subnet.split(".")
    if len(parts) != 3 or not all(p.isdigit() and int(p) <= 255 for p in parts):
        raise TestbedError(f"--subnet: expected the first three octets like {example}, got {subnet!r}")
    net = ipaddress.ip_network(f"{'.'.join(str(int(p)) for p in parts)}.0/24")
    if not any(net.subnet_of(ipaddress.ip_network(a)) for a in allowed):
        raise TestbedError(f"--subnet: {net} is not {allowed_text}")
    return net


def find_host(hosts, name, noun, prefix):
    """The entry of hosts.json or cluster.json named name (or having that address)."""
    for h in hosts:
        if name in (h["name"], h["address"]):
            return h
    raise TestbedError(f"no {noun} {name!r} with prefix {prefix} "
                       f"({noun}s: {', '.join(h['name'] for h in hosts)})")


# ---- commands and processes ----

def run(argv, check=True, env=None, timeout=30):
    proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env,
                          timeout=timeout)
    if check and proc.returncode != 0:
        detail = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        raise TestbedError(f"{' '.join(argv)}: {detail}")
    return proc


def ip_json(*args):
    return json.loads(run(["ip", "-j", *args]).stdout or "[]")


def process_state(pid):
    """The one-letter state of pid, or None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def is_running(pid):
    # A zombie counts as gone: where init does not reap orphans, killed daemons stay as zombies.
    return process_state(pid) not in (None, "Z", "X")


def read_pid(path):
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def cmdline(pid):
    """pid's command line with its arguments joined by spaces, or "" if it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def kill_all(find_pids, what, term_grace):
    """SIGTERM, wait term_grace, SIGKILL, wait KILL_WAIT; find_pids() lists what is still running."""
    for sig, wait in ((signal.SIGTERM, term_grace), (signal.SIGKILL, KILL_WAIT)):
        pids = find_pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while pids and time.monotonic() < deadline:
            time.sleep(0.02)
            pids = find_pids()
        if not pids:
            return
    raise TestbedError(f"{what}: processes {sorted(pids)} survived SIGKILL")


def spawn(argv, log_path):
    """Start a daemon in its own session, its output appended to log_path."""
    with open(log_path, "ab") as log:
        # Every fd redirected: a caller capturing our output must not wait on the daemon.
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd="/",
                                start_new_session=True)


def log_tail(path):
    """The last non-blank line of a log, or None."""
    try:
        with open(path, errors="replace") as f:
            lines = [line.strip() for line in f if line.strip()]
    except OSError:
        return None
    return lines[-1] if lines else None


def wait_until(what, ready, timeout, proc=None, log=None, interval=0.1):
    """Poll ready() until it is true; fail early when proc, the daemon being waited for, has exited."""
    deadline = time.monotonic() + timeout
    while not ready():
        if proc is not None and proc.poll() is not None:
            problem = f"exited with {proc.returncode}"
        elif time.monotonic() > deadline:
            problem = f"did not come up within {timeout:g} s"
        else:
            time.sleep(interval)
            continue
        tail = log_tail(log) if log else None
        raise TestbedError(f"{what} {problem}" + (f" (last log line: {tail})" if tail else ""))


# ---- network ----

def netns_list():
    out = run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def netns_matching(pattern):
    return [ns for ns in netns_list() if re.fullmatch(pattern, ns)]


def netns_pids(ns):
    """The live processes in network namespace ``ns``, as ``ip netns pids`` finds them (the namespace
    each /proc entry is in against /run/netns/<ns>), read here: an ``ip`` per call took seconds on a
    loaded machine, where tests look for processes that live a few seconds."""
    try:
        wanted = os.stat(f"/run/netns/{ns}")
    except OSError:
        return []
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            there = os.stat(f"/proc/{entry}/ns/net")
        except OSError:
            continue  # it ended meanwhile, or is a kernel thread without one
        if (there.st_dev, there.st_ino) == (wanted.st_dev, wanted.st_ino) and is_running(int(entry)):
            found.append(int(entry))
    return found


def sshd_pid(host_dir):
    """The pid of a test host's sshd listener if it is alive and really its sshd (pid files outlive
    their process), else None."""
    pid = read_pid(os.path.join(host_dir, "sshd.pid"))
    if pid is None or not is_running(pid):
        return None
    return pid if os.path.join(host_dir, "sshd_config") in cmdline(pid) else None


def host_pids(ns, host_dir):
    """The live processes in a test host's network namespace ``ns`` other than its sshd listener,
    sorted: what runs there for the tests (sessions, agents, tasks)."""
    listener = sshd_pid(host_dir)
    return sorted(pid for pid in netns_pids(ns) if pid != listener)


def link_names():
    return [link["ifname"] for link in ip_json("link", "show")]


def check_subnet_free(net):
    for link in ip_json("-4", "addr", "show"):
        for a in link.get("addr_info", []):
            if ipaddress.ip_network(f"{a['local']}/{a['prefixlen']}", strict=False).overlaps(net):
                raise TestbedError(f"subnet {net} overlaps {a['local']}/{a['prefixlen']} on "
                                   f"{link['ifname']}; pick another --subnet")
    for route in ip_json("-4", "route", "show"):
        if route["dst"] != "default" and ipaddress.ip_network(route["dst"], strict=False).overlaps(net):
            raise TestbedError(f"subnet {net} overlaps route {route['dst']} via {route.get('dev')}; "
                               f"pick another --subnet")


def create_network(bridge, bridge_address, hosts):
    """The bridge with bridge_address/24 here, and per host a namespace joined to it by a veth pair."""
    run(["ip", "link", "add", bridge, "type", "bridge"])
    run(["ip", "addr", "add", f"{bridge_address}/24", "dev", bridge])
    run(["ip", "link", "set", bridge, "up"])
    for h in hosts:
        run(["ip", "netns", "add", h.netns])
        run(["ip", "link", "add", h.veth, "type", "veth", "peer", "name", "eth0", "netns", h.netns])
        run(["ip", "link", "set", h.veth, "master", bridge, "up"])
        run(["ip", "-n", h.netns, "addr", "add", f"{h.address}/24", "dev", "eth0"])
        run(["ip", "-n", h.netns, "link", "set", "eth0", "up"])
        run(["ip", "-n", h.netns, "link", "set", "lo", "up"])


def remove_network(namespaces, veth_pattern, bridge):
    """Delete what create_network made, found by name, so that a partial set goes too."""
    for name in link_names():  # deleting the root end deletes its peer too
        if re.fullmatch(veth_pattern, name):
            run(["ip", "link", "del", name], check=False)
    for ns in namespaces:
        run(["ip", "netns", "del", ns])
    if bridge in link_names():
        run(["ip", "link", "del", bridge])


# ---- state ----

def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_json(path, doc):
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")


class Tool:
    """One script's names and its command-line error boundary."""

    def __init__(self, name, doc_name):
        self.name = name
        self.doc_name = doc_name
        self.run_dir = f"/run/tflaunch-{name}"
        self.marker = f".tflaunch-{name}"

    def info(self, msg):
        print(f"{self.name}: {msg}", file=sys.stderr, flush=True)

    def default_state_dir(self, prefix):
        return f"/tmp/tflaunch-{self.name}-{prefix}"

    def pointer_path(self, prefix):
        return os.path.join(self.run_dir, f"{prefix}.state")

    def resolve_state_dir(self, prefix, given):
        """The given directory, else where the last `up` of this prefix put its state, else the default."""
        if given:
            return os.path.abspath(given)
        with contextlib.suppress(OSError), open(self.pointer_path(prefix)) as f:
            return f.read().strip()
        return self.default_state_dir(prefix)

    def prepare_state_dir(self, state_dir, mode, subdirs=()):
        if not SAFE_PATH.fullmatch(state_dir):
            raise TestbedError(f"--state-dir: use only letters, digits and _.,/+=@- in the path, "
                               f"got {state_dir!r}")
        ours = os.path.exists(os.path.join(state_dir, self.marker))
        if os.path.isdir(state_dir) and os.listdir(state_dir) and not ours:
            raise TestbedError(f"--state-dir: {state_dir} is not empty and was not made by {self.name}")
        for sub in ("", *subdirs):
            os.makedirs(os.path.join(state_dir, sub), mode=mode, exist_ok=True)
            os.chmod(os.path.join(state_dir, sub), mode)
        open(os.path.join(state_dir, self.marker), "w").close()

    def remember_state_dir(self, prefix, state_dir):
        """Point this prefix at its state, so that later commands need no --state-dir."""
        os.makedirs(self.run_dir, mode=0o755, exist_ok=True)
        with open(self.pointer_path(prefix), "w") as f:
            f.write(state_dir + "\n")

    def remove_state(self, prefix, state_dir, keep_state):
        if not keep_state and os.path.exists(os.path.join(state_dir, self.marker)):
            shutil.rmtree(state_dir)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.pointer_path(prefix))

    @contextlib.contextmanager
    def rolled_back(self, prefix, undo):
        """Call undo() when the block fails, so that a failed `up` leaves nothing of itself behind."""
        try:
            yield
        except BaseException:
            try:
                undo()
            except TestbedError as e:
                self.info(f"rollback incomplete ({e}); run '{self.name} down --prefix {prefix}'")
            raise

    def load_up(self, prefix, given_state_dir):
        """The document `up` wrote for this prefix; an error if it is not up."""
        doc = read_json(os.path.join(self.resolve_state_dir(prefix, given_state_dir), self.doc_name))
        if doc is None:
            raise TestbedError(f"prefix {prefix} is not up (run '{self.name} up --prefix {prefix}')")
        return doc

    def main(self, args, commands, root_reason):
        """Run args.command; print the document it returns as JSON; an expected failure is one line, exit 1."""
        try:
            if os.geteuid() != 0:
                raise TestbedError(f"must run as root ({root_reason})")
            if shutil.which("ip") is None or shutil.which("nsenter") is None:
                raise TestbedError("needs iproute2 (ip) and util-linux (nsenter, unshare)")
            doc = commands[args.command](args)
        except TestbedError as e:
            print(f"{self.name}: error: {e}", file=sys.stderr)
            return 1
        except subprocess.TimeoutExpired as e:
            print(f"{self.name}: error: {' '.join(e.cmd)} did not answer within {e.timeout:g} s", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 130
        if doc is not None:
            print(json.dumps(doc, indent=2))
        return 0
