"""Outside network for a sealed run's namespace, through slirp4netns or pasta (Debian's passt).

Either one runs beside the run as tflaunch's child and gives the namespace an interface whose
traffic it carries out through ordinary sockets of the user who runs tflaunch, as rootless
containers do: the tasks can download data sets and weights, reach name servers and remote
file systems. Nothing comes in: pasta is told to forward no port in either direction (its
default would forward the ports the tasks bind), and slirp4netns forwards none unless asked on
its API socket, which it is not given. Both find the namespace through tflaunch's own open
files (``/proc/self/fd/N`` in the tool, the descriptors passed down), end with the run (and,
should tflaunch be killed, when its end of slirp4netns's exit pipe closes, or on pasta's
parent-death signal), and are never waited on longer than READY_TIMEOUT.
"""

from __future__ import annotations

import ctypes
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass

READY_TIMEOUT = 5.0
PR_SET_PDEATHSIG = 1
# Say where the tool comes from: one line a user can act on.
INSTALL = "apt-get install slirp4netns (or passt, for pasta)"
TOOLS = ("slirp4netns", "pasta")  # in the order they are tried


@dataclass
class OutsideLink:
    """The running slirp4netns or pasta of one namespace."""

    tool: str
    process: subprocess.Popen
    keep: list[int]  # tflaunch's ends of the tool's pipes, closed with it

    def kill(self) -> None:
        """Stop it now; :meth:`close` reaps it (its exit takes tens of milliseconds)."""
        if self.process.poll() is None:
            self.process.kill()

    def close(self) -> None:
        for fd in self.keep:
            os.close(fd)
        self.keep = []
        if self.process.poll() is None:
            self.process.kill()  # it keeps nothing worth a graceful stop (pasta takes a second over SIGTERM)
        self.process.wait()


def loopback_name_servers(resolv_conf: str) -> list[str]:
    """The name servers of resolv.conf's text when every one of them is on loopback (a resolver of
    this machine's own, such as systemd-resolved's 127.0.0.53): a namespace's tasks cannot reach
    them, as 127.0.0.1 there is the namespace's own. Empty otherwise."""
    servers = [line.split()[1] for line in resolv_conf.splitlines()
               if line.split()[:1] == ["nameserver"] and len(line.split()) > 1]
    local = [server for server in servers if server.startswith("127.") or server == "::1"]
    return local if servers and local == servers else []


def name_problem(path: str = "/etc/resolv.conf") -> str | None:
    """Why names would not resolve in a sealed run's namespace, in a few words; None when they would."""
    try:
        with open(path, encoding="utf-8", errors="replace") as conf:
            local = loopback_name_servers(conf.read())
    except OSError:
        return None
    if not local:
        return None
    return f"this machine's name server ({', '.join(local)}) is on its loopback, out of the tasks' reach"


def missing_tools() -> str | None:
    """Why no sealed run here can have outside network (neither tool installed); None when one is."""
    if any(shutil.which(tool) for tool in TOOLS):
        return None
    return "neither slirp4netns nor pasta is installed"


def connect_outside(net: int, user: int | None) -> OutsideLink | str:
    """Start slirp4netns, else pasta, for the namespace open as ``net`` (``user``: its user namespace,
    when unprivileged); the reason neither works otherwise. slirp4netns first: it is up in about
    10 ms, pasta in about 40, and the tasks' start waits for it."""
    missing = missing_tools()
    if missing:
        return missing
    reasons = []
    for tool, argv in zip(TOOLS, (_slirp4netns, _pasta)):
        if shutil.which(tool) is None:
            continue
        made = _start(tool, argv, net, user)
        if isinstance(made, OutsideLink):
            return made
        reasons.append(f"{tool}: {made}")
    return "; ".join(reasons)


def _pasta(net: int, user: int | None, ready: int, stay: int) -> list[str]:
    # slirp4netns's addresses rather than a copy of this machine's, so that this machine's own
    # addresses are outside too (but those the cluster names it by, which the namespace carries on
    # its loopback); neither maps this machine's loopback into the namespace.
    argv = ["pasta", "--foreground", "--quiet", "--config-net", "--tcp-ports", "none", "--udp-ports", "none",
            "--tcp-ns", "none", "--udp-ns", "none", "--address", "10.0.2.100", "--netmask", "24",
            "--gateway", "10.0.2.2", "--no-map-gw", "--pid", f"/proc/self/fd/{ready}",
            "--netns", f"/proc/self/fd/{net}"]
    if user is not None:
        argv += ["--userns", f"/proc/self/fd/{user}"]
    elif os.geteuid() == 0:
        argv += ["--runas", "0"]  # as another user it could not open tflaunch's descriptors
    return argv


def _slirp4netns(net: int, user: int | None, ready: int, stay: int) -> list[str]:
    argv = ["slirp4netns", "--configure", "--mtu=65520", "--disable-host-loopback", f"--ready-fd={ready}",
            f"--exit-fd={stay}", "--netns-type=path"]
    if user is not None:
        argv += [f"--userns-path=/proc/self/fd/{user}"]
    return [*argv, f"/proc/self/fd/{net}", "tap0"]


def _start(tool: str, argv_for, net: int, user: int | None) -> OutsideLink | str:
    """Start one tool and wait until it says the namespace's interface is up."""
    ready_r, ready_w = os.pipe()
    stay_r, stay_w = os.pipe()  # slirp4netns ends when tflaunch's end closes
    passed = [net, ready_w, stay_r, *([user] if user is not None else [])]
    with tempfile.TemporaryFile() as errors:
        try:
            # slirp4netns ends when its exit pipe closes; pasta, on the parent-death signal (which
            # costs a fork rather than a vfork of tflaunch).
            process = subprocess.Popen(argv_for(net, user, ready_w, stay_r), stdin=subprocess.DEVNULL,
                                       stdout=subprocess.DEVNULL, stderr=errors, pass_fds=passed,
                                       preexec_fn=_die_with_parent if tool == "pasta" else None,
                                       start_new_session=True)
        except OSError as exc:
            for fd in (ready_r, ready_w, stay_r, stay_w):
                os.close(fd)
            return exc.strerror or str(exc)
        os.close(ready_w)
        os.close(stay_r)
        said = _read_ready(ready_r, process)
        os.close(ready_r)
        if said:
            return OutsideLink(tool, process, [stay_w])
        link = OutsideLink(tool, process, [stay_w])
        link.close()
        errors.seek(0)
        lines = [line for line in errors.read()[-4096:].decode("utf-8", "replace").splitlines()
                 if line.strip() and "syslog" not in line]
        return lines[0].strip() if lines else f"did not start within {READY_TIMEOUT:g} s"  # the cause, not its echo


def _read_ready(fd: int, process: subprocess.Popen) -> bool:
    """Whether the tool wrote to its ready pipe (pasta: its pid; slirp4netns: "1") in time."""
    deadline = time.monotonic() + READY_TIMEOUT
    while (left := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select([fd], [], [], left)
        if readable:
            return bool(os.read(fd, 64))  # EOF: it ended without saying so
    return False


def _die_with_parent() -> None:
    """In the tool's process before it starts: SIGTERM when tflaunch's thread that started it ends."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
