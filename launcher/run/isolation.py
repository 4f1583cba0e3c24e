"""``--isolate-network``: every task of a run in one network namespace of the run's own.

Inside it there is only a loopback interface, brought up: the tasks reach each other on
``localhost`` as usual, and nothing outside the namespace reaches their gRPC ports (which
TensorFlow opens on every interface, without authentication). The price: no network outside
the namespace for the tasks (no downloads, no remote file systems over the network).

How: a short-lived process made with ``unshare --net`` (as root) or ``unshare --user
--map-root-user --net`` (unprivileged user namespaces) brings ``lo`` up. tflaunch then opens the
namespace's files and holds them for the run, and each task is entered with ``nsenter``, put in
front of its argv, through ``/proc/<tflaunch>/fd/<n>``: the namespace cannot be mistaken for
another process's even if a pid is reused, and it goes away with the run's last process.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Iterator

from ..cluster.plan import Plan
from ..cluster.spec import ClusterSpec, is_local
from ..errors import ConfigError, LaunchError
from ..options import name

START_TIMEOUT = 10.0

# Brings loopback up with the SIOCGIFFLAGS/SIOCSIFFLAGS ioctls (no iproute2 needed), says so,
# and waits for tflaunch to close its stdin once it holds the namespace.
HOLDER = r'''
import fcntl, socket, struct, sys
ifreq = struct.Struct("16sh22x")
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
flags = ifreq.unpack(fcntl.ioctl(s, 0x8913, ifreq.pack(b"lo", 0)))[1]
fcntl.ioctl(s, 0x8914, ifreq.pack(b"lo", flags | 1))
sys.stdout.write("ready\n")
sys.stdout.flush()
sys.stdin.read()
'''


class IsolationError(LaunchError):
    """A network namespace cannot be made here; nothing was started."""


def check_isolation(spec: ClusterSpec, local_hosts: frozenset[str], option: str) -> None:
    """Refuse isolation for clusters it cannot apply to: every task must run on this machine."""
    if spec.transport not in (None, "local"):
        raise ConfigError(spec.source, option, f"applies to tasks on this machine; these are started by "
                                               f"{spec.transport!r}")
    remote = [t for t in spec.tasks if not is_local(t.host, local_hosts)]
    if remote:
        first = remote[0]
        raise ConfigError(spec.source, option, f"needs every task on this machine; {first.key} runs on "
                                               f"{first.host!r} (a network namespace cannot span hosts)")


@dataclass
class NetworkNamespace:
    """A network namespace held open by tflaunch; ``prefix`` enters it."""

    fds: list[int]
    prefix: tuple[str, ...]
    unprivileged: bool

    @classmethod
    def create(cls) -> "NetworkNamespace":
        missing = [tool for tool in ("unshare", "nsenter") if shutil.which(tool) is None]
        if missing:
            raise IsolationError(f"{name('isolate_network')}: {' and '.join(missing)} not found (util-linux); "
                                 "nothing was started")
        attempts = [(False, ["unshare", "--net"])] if os.geteuid() == 0 else []
        attempts.append((True, ["unshare", "--user", "--map-root-user", "--net"]))
        reasons = []
        for unprivileged, argv in attempts:
            made = _hold([*argv, "--", sys.executable, "-I", "-S", "-c", HOLDER], unprivileged)
            if isinstance(made, NetworkNamespace):
                return made
            reasons.append(made)
        raise IsolationError(f"{name('isolate_network')}: cannot create a network namespace here "
                             f"({'; '.join(reasons)}); it needs root or unprivileged user namespaces "
                             "(sysctl user.max_user_namespaces > 0); nothing was started")

    def enter(self, plan: Plan) -> Plan:
        """The same plan with every task started inside the namespace."""
        launches = tuple(replace(launch, argv=(*self.prefix, *launch.argv)) if launch.local else launch
                         for launch in plan.launches)
        return replace(plan, launches=launches)

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


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
        fds = [os.open(f"/proc/{holder.pid}/ns/{kind}", os.O_RDONLY) for kind in kinds]
    finally:
        holder.stdin.close()
        try:
            holder.wait(timeout=START_TIMEOUT)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait()
        holder.stdout.close()
        holder.stderr.close()
    me = os.getpid()
    paths = dict(zip(kinds, (f"/proc/{me}/fd/{fd}" for fd in fds)))
    prefix = ["nsenter", f"--net={paths['net']}"]
    if unprivileged:
        # Inside, the user is root of its own user namespace, mapped to the same user outside.
        prefix = ["nsenter", f"--user={paths['user']}", f"--net={paths['net']}", "--preserve-credentials"]
    return NetworkNamespace(fds, (*prefix, "--"), unprivileged)


@contextmanager
def isolated_network(spec: ClusterSpec) -> Iterator[NetworkNamespace | None]:
    """The run's namespace while the run lasts, when the spec asks for one; else None."""
    if not spec.isolate_network:
        yield None
        return
    network = NetworkNamespace.create()
    try:
        yield network
    finally:
        network.close()
