"""Sealed and isolated runs: every task of a run in one network namespace of the run's own.

Inside it there is a loopback interface, brought up, which also carries the addresses the
cluster names this machine by (:mod:`.inside`): the tasks reach each other on ``localhost``, or
this machine's address or name, as usual, and nothing outside the namespace reaches their gRPC ports (which
TensorFlow opens on every interface, without authentication). :func:`choose_network` decides,
once per run, whether a run is sealed (the default when every task is on this machine: the
namespace gets outside network through slirp4netns or pasta, see :mod:`.outside`, and a run
where no namespace can be made goes on unsealed, saying so), isolated (``--isolate-network``:
loopback only, and no start without it) or open (``--no-seal``, and every run that spans hosts).

How: a short-lived process made with ``unshare --net`` (as root) or ``unshare --user
--map-root-user --net`` (unprivileged user namespaces) brings ``lo`` up with those addresses and reserves the run's
ports inside (``ip_local_reserved_ports``: the kernel never hands them out as a connection's
local port there). tflaunch then opens the namespace's files and holds them for the run, and
the host's agent joins each task to it (setns) between fork and exec, through
``/proc/<tflaunch>/fd/<n>`` (:attr:`TaskLaunch.netns <launcher.cluster.plan.TaskLaunch>`): the
namespace cannot be mistaken for another process's even if a pid is reused, the task's command
is its own (a program that cannot run is reported as in any run), and the namespace goes away
with the run's last process.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Iterable

from ...cluster.plan import Plan
from ...cluster.spec import ClusterSpec, Network, is_local
from ...errors import ConfigError, LaunchError
from ...options import RunOptions, name
from ...records.trace import tracer
from .inside import LOOKUP_WAIT, Offline, carried, cluster_hosts, dial_line, missing_outside, outside_line, own_names

if TYPE_CHECKING:
    from .outside import OutsideLink

log = tracer("network")
START_TIMEOUT = 10.0

# The process that makes the namespace: it reserves the ports in its first argument (a kernel where
# the sysctl cannot be written keeps the run going), brings loopback up, adds the addresses (with
# their prefix lengths) of the arguments after it to loopback, says so, and waits for
# tflaunch to close its stdin once it holds the namespace. A shell with iproute2's ip where there
# is one (a few milliseconds); else Python, with the SIOCGIFFLAGS/SIOCSIFFLAGS ioctls (tens).
HOLDER_SH = '''echo "$1" > /proc/sys/net/ipv4/ip_local_reserved_ports 2>/dev/null
ip=$0; shift
"$ip" link set lo up || exit 1
for address; do "$ip" address add "$address" dev lo || exit 1; done
echo ready && read -r _'''
HOLDER = r'''
import fcntl, os, socket, struct, sys
ifreq = struct.Struct("16sh22x")
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
flags = ifreq.unpack(fcntl.ioctl(s, 0x8913, ifreq.pack(b"lo", 0)))[1]
fcntl.ioctl(s, 0x8914, ifreq.pack(b"lo", flags | 1))
def attribute(kind, data):
    return struct.pack("=HH", 4 + len(data), kind) + data + bytes(-len(data) % 4)
for given in sys.argv[2:]:  # RTM_NEWADDR on lo (index 1 in every namespace), as "ip address add" sends it
    text, bits = given.split("/")
    family = socket.AF_INET6 if ":" in text else socket.AF_INET
    raw = socket.inet_pton(family, text)
    body = struct.pack("=BBBBI", family, int(bits), 0, 0, 1) + attribute(2, raw) + attribute(1, raw)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as link:
        link.send(struct.pack("=IHHII", 16 + len(body), 20, 0x605, 1, 0) + body)
        error = -struct.unpack_from("=i", link.recv(4096), 16)[0]
    if error:
        sys.exit(f"cannot add {given} to lo: {os.strerror(error)}")
if sys.argv[1]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_reserved_ports", "w") as reserved:
            reserved.write(sys.argv[1])
    except OSError:
        pass
sys.stdout.write("ready\n")
sys.stdout.flush()
sys.stdin.read()
'''


class IsolationError(LaunchError):
    """A network namespace cannot be made here; nothing was started."""


def choose_network(spec: ClusterSpec, options: RunOptions, local_hosts: frozenset[str]) -> Network:
    """Where the run's tasks meet the network: the options' choice, else the cluster file's, else
    sealed when every task (and spare) is on this machine, and open otherwise."""
    if options.isolate_network or options.no_seal:
        asked: Network | None = Network.ISOLATED if options.isolate_network else Network.OPEN
    else:
        asked = spec.network
    if asked is Network.ISOLATED:
        check_isolation(spec, local_hosts, name("isolate_network") if options.isolate_network else "isolate_network")
    if asked is not None:
        return asked
    here = spec.transport in (None, "local") and all(is_local(t.host, local_hosts) for t in spec.slots)
    return Network.SEALED if here else Network.OPEN


def check_isolation(spec: ClusterSpec, local_hosts: frozenset[str], option: str) -> None:
    """Refuse isolation for clusters it cannot apply to: every task must run on this machine."""
    if spec.transport not in (None, "local"):
        raise ConfigError(spec.source, option, f"applies to tasks on this machine; these are started by "
                                               f"{spec.transport!r}")
    remote = [t for t in spec.slots if not is_local(t.host, local_hosts)]
    if remote:
        first = remote[0]
        raise ConfigError(spec.source, option, f"needs every task on this machine; {first.key} runs on "
                                               f"{first.host!r} (a network namespace cannot span hosts)")


@dataclass
class NetworkNamespace:
    """A network namespace held open by tflaunch; ``paths`` are its files, as a task joins them
    (its user namespace first). ``outside`` is what gives it outside network, when anything does."""

    fds: dict[str, int]  # "net", and "user" for an unprivileged one
    paths: tuple[str, ...]
    unprivileged: bool
    outside: OutsideLink | None = None
    offline: Offline | None = None  # what its tasks lack, once known (a diagnosis names it)

    @classmethod
    def create(cls, ports: Iterable[int] = (), addresses: Iterable[str] = ()) -> "NetworkNamespace":
        """A new namespace with ``ports`` reserved inside and ``addresses`` (this machine's, as the
        cluster names it) on its loopback; IsolationError saying why there is none."""
        if shutil.which("unshare") is None:
            raise IsolationError("unshare not found (util-linux)")
        attempts = [(False, ["unshare", "--net"])] if os.geteuid() == 0 else []
        attempts.append((True, ["unshare", "--user", "--map-root-user", "--net"]))
        reserved = ",".join(str(port) for port in sorted(set(ports)))
        prefixes = [f"{address}/{128 if ':' in address else 32}" for address in addresses]
        reasons = []
        for unprivileged, argv in attempts:
            made = _hold([*argv, "--", *_holder(), reserved, *prefixes], unprivileged)
            if isinstance(made, NetworkNamespace):
                return made
            reasons.append(made)
        raise IsolationError(f"cannot create a network namespace here ({'; '.join(reasons)}); it needs root or "
                             "unprivileged user namespaces (sysctl user.max_user_namespaces > 0)")

    def connect_outside(self) -> str | None:
        """Give the namespace outside network; None when it has it, else why not (one line)."""
        from .outside import connect_outside  # a sealed run's, loaded once the hosts are being reached

        made = connect_outside(self.fds["net"], self.fds.get("user"))
        if isinstance(made, str):
            return made
        self.outside = made
        return None

    def enter(self, plan: Plan) -> Plan:
        """The same plan with every task started inside the namespace (and told what it lacks)."""
        offline = (self.offline.why, self.offline.fix) if self.offline else ()
        launches = tuple(replace(launch, netns=self.paths, offline=offline) if launch.local else launch
                         for launch in plan.launches)
        return replace(plan, launches=launches)

    def close(self) -> None:
        if self.outside is not None:
            self.outside.close()
            self.outside = None
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}


def _holder() -> list[str]:
    """The holder's argv, its ports to come."""
    ip = shutil.which("ip", path=f"{os.environ.get('PATH', os.defpath)}:/usr/sbin:/sbin")
    if ip and shutil.which("sh"):
        return ["sh", "-c", HOLDER_SH, ip]
    return [sys.executable, "-I", "-S", "-c", HOLDER]


def _hold(argv: list[str], unprivileged: bool) -> NetworkNamespace | str:
    """Make the namespace with ``argv`` and open its files; the reason it failed otherwise."""
    try:
        holder = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  start_new_session=True)
    except OSError as exc:
        return f"{argv[0]}: {exc.strerror}"
    try:
        ready = holder.stdout.readline().strip() == b"ready"  # EOF when unshare failed
        if not ready:
            holder.wait(timeout=START_TIMEOUT)
            text = holder.stderr.read().decode("utf-8", "replace").strip().splitlines()
            return text[-1] if text else f"{' '.join(argv[:4])} exited with {holder.returncode}"
        kinds = ["user", "net"] if unprivileged else ["net"]
        fds = {kind: os.open(f"/proc/{holder.pid}/ns/{kind}", os.O_RDONLY) for kind in kinds}
    finally:
        holder.stdin.close()
        try:
            holder.wait(timeout=START_TIMEOUT)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait()
        holder.stdout.close()
        holder.stderr.close()
    # Inside an unprivileged one, the user is root of its own user namespace, mapped to the same
    # user outside; a task keeps its credentials as it joins it.
    paths = tuple(f"/proc/{os.getpid()}/fd/{fds[kind]}" for kind in kinds)
    return NetworkNamespace(fds, paths, unprivileged)


class RunNetwork(threading.Thread):
    """A run's namespace and its outside network, made beside the rest of the run's start (the
    hosts' agents, the run folder): :meth:`held` waits for the namespace, :meth:`ready` for its
    outside network. The thread stays until :meth:`close`, as the outside network's tool is
    stopped when the thread that started it ends."""

    def __init__(self, spec: ClusterSpec, ports: Iterable[int]):
        super().__init__(name="tflaunch-network", daemon=True)
        self.spec, self.mode, self.ports = spec, spec.network, list(ports)
        self._held, self._made, self._closing = threading.Event(), threading.Event(), threading.Event()
        self._network: NetworkNamespace | None = None
        self._failed: IsolationError | None = None
        self.names: dict[str, tuple[str, ...]] = {}  # the names the cluster gives this machine (own_names)

    @classmethod
    def begin(cls, spec: ClusterSpec, ports: Iterable[int]) -> "RunNetwork | None":
        """Start making the namespace of a sealed or isolated run; None for an open one."""
        if spec.network in (None, Network.OPEN):
            return None
        network = cls(spec, ports)
        network.start()
        return network

    def run(self) -> None:
        try:
            self.names = own_names(self.spec, wait=LOOKUP_WAIT)
            unresolved = [host for host in cluster_hosts(self.spec) if host not in self.names]
            if unresolved:
                log.debug("network: not carried, unresolved within %.1f s: %s", LOOKUP_WAIT, ", ".join(unresolved))
            self._network = NetworkNamespace.create(self.ports, carried(self.names))
        except IsolationError as exc:
            self._failed = exc
        except OSError as exc:
            self._failed = IsolationError(f"cannot create a network namespace here ({exc})")
        finally:
            self._held.set()
        lacking = names = None
        try:
            if self._network is not None and self.mode is Network.SEALED:
                lacking = self._network.connect_outside()
                if lacking is None:
                    from .outside import name_problem

                    names = name_problem()
        except OSError as exc:
            lacking = str(exc)
        finally:
            if self._network is not None:
                # Said only where it matters: --dry-run, check, and the diagnosis of a task that failed of it.
                offline = self._network.offline = missing_outside(self.mode, lacking, names)
                log.debug("network: %s", f"{offline.why}; {offline.fix}" if offline else "outside network up")
            self._made.set()
        self._closing.wait()
        if self._network is not None:
            self._network.close()

    def held(self, say: Callable[[str], None]) -> NetworkNamespace | None:
        """The namespace, once made; None for a sealed run where none can be made (``say`` is told
        why, in one line). An isolated run without one raises IsolationError: nothing was started."""
        self._held.wait()
        if self._failed is not None:
            if self.mode is Network.ISOLATED:
                raise IsolationError(f"{name('isolate_network')}: {self._failed}; nothing was started")
            say(f"network: not sealed: {self._failed}; other users of this machine can reach the tasks' ports "
                f"(docs/security.md; {name('no_seal')} leaves runs unsealed without this line)")
        return self._network

    def ready(self) -> None:
        """Wait until the namespace has its outside network, or is known to lack it (nothing is said
        of that here: a run may never need it). For the tasks' start, which comes last."""
        self._made.wait()

    def close(self) -> None:
        """Stop the outside network's tool and let go of the namespace (its tasks have ended). The
        tool is killed at once; the thread reaps it after, so that the run's end does not wait."""
        self._made.wait()
        if self._network is not None and self._network.outside is not None:
            self._network.outside.kill()
        self._closing.set()


def check_network(spec: ClusterSpec, ports: Iterable[int]) -> list[tuple[str, bool, str]]:
    """What ``tflaunch check`` says of a sealed or isolated run's network, as (check, ok, detail):
    the namespace is made as a run makes it (this machine's addresses carried, the outside network
    up), then let go. An outside network the tasks lack is not ok (a warning: a run may not need it)."""
    network = RunNetwork(spec, ports)
    network.start()
    refused: list[str] = []
    try:
        made = network.held(refused.append)
        network.ready()
        tool = made.outside.tool if made is not None and made.outside is not None else None  # gone once closed
    except IsolationError as exc:
        return [("network", False, str(exc))]
    finally:
        network.close()
    if made is None:
        return [("network", False, refused[0].removeprefix("network: "))]
    found = [("network", True, f"{spec.network.value}: {dial_line(spec, network.names, carried(network.names))}")]
    outside = outside_line(spec.network, made.offline, tool)
    if outside and spec.network is Network.SEALED:  # an isolated run asked to reach nothing outside
        found.append(("outside", made.offline is None, outside))
    return found
