"""This machine: the names and addresses that mean it, its core and GPU counts, and tflaunch's open-files
limit (raised for a run, given back to the tasks it starts here). Unlike the spec and the plan,
this module asks the system (interfaces, affinity, rlimits); whether an address is a loopback one
is pure and lives with the spec (:func:`launcher.cluster.spec.is_loopback`)."""

from __future__ import annotations

import os
import socket
import struct
import sys


def local_host_names() -> frozenset[str]:
    """Names and addresses under which a task's host is this machine."""
    names = {"localhost", "127.0.0.1", "::1", socket.gethostname()}
    try:
        names.update(interface_addresses())
    except OSError:
        try:
            names.update(psutil_addresses())
        except Exception:  # noqa: BLE001 - interface listing is a nicety; names above suffice
            pass
    return frozenset(names)


def psutil_addresses() -> set[str]:
    """What :func:`interface_addresses` reads, as psutil reads it (where there is no netlink)."""
    import psutil

    return {a.address.split("%")[0] for addresses in psutil.net_if_addrs().values() for a in addresses
            if a.family in (socket.AF_INET, socket.AF_INET6)}


# Netlink (Linux): a dump of every interface address, as getifaddrs(3) asks for it.
_RTM_NEWADDR, _RTM_GETADDR, _NLMSG_ERROR, _NLMSG_DONE = 20, 22, 2, 3
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_IFA_ADDRESS, _IFA_LOCAL = 1, 2
_NLMSG = struct.Struct("=IHHII")  # length, type, flags, sequence, port id
_IFADDRMSG = struct.Struct("=BBBBI")  # family, prefix length, flags, scope, interface index
_RTATTR = struct.Struct("=HH")  # length, type


def interface_addresses() -> set[str]:
    """Every IPv4 and IPv6 address of this machine's interfaces (in its network namespace), from
    the kernel over netlink: what psutil's ``net_if_addrs`` reports, without importing psutil at
    every start. OSError where there is no netlink (not Linux) or it answers oddly."""
    if not hasattr(socket, "AF_NETLINK"):
        raise OSError("no netlink on this system")
    found: set[str] = set()
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, 0) as sock:  # NETLINK_ROUTE
        sock.settimeout(2.0)
        sock.send(_NLMSG.pack(_NLMSG.size + _IFADDRMSG.size, _RTM_GETADDR, _NLM_F_REQUEST | _NLM_F_DUMP, 1, 0)
                  + _IFADDRMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0))
        while True:
            data = sock.recv(65536)
            offset = 0
            while offset + _NLMSG.size <= len(data):
                length, kind, _, _, _ = _NLMSG.unpack_from(data, offset)
                if length < _NLMSG.size or offset + length > len(data):
                    raise OSError("a netlink message that does not fit its reply")
                if kind == _NLMSG_DONE:
                    return found
                if kind == _NLMSG_ERROR:
                    raise OSError("netlink refused to list addresses")
                if kind == _RTM_NEWADDR:
                    found.update(_message_addresses(data[offset + _NLMSG.size:offset + length]))
                offset += (length + 3) & ~3
            if not data:
                raise OSError("netlink closed before the end of the address list")


def _message_addresses(message: bytes) -> list[str]:
    """The address of one RTM_NEWADDR message: its local address (IFA_LOCAL: on a point-to-point
    link IFA_ADDRESS is the peer's), else IFA_ADDRESS."""
    family = _IFADDRMSG.unpack_from(message)[0]
    size = {socket.AF_INET: 4, socket.AF_INET6: 16}.get(family)
    if size is None:
        return []
    attributes: dict[int, bytes] = {}
    offset = _IFADDRMSG.size
    while offset + _RTATTR.size <= len(message):
        length, kind = _RTATTR.unpack_from(message, offset)
        if length < _RTATTR.size:
            break
        attributes[kind] = message[offset + _RTATTR.size:offset + length]
        offset += (length + 3) & ~3
    raw = attributes.get(_IFA_LOCAL) or attributes.get(_IFA_ADDRESS)
    return [socket.inet_ntop(family, raw)] if raw is not None and len(raw) == size else []


def gpu_count() -> int | None:
    """The NVIDIA GPUs this machine shows, from the driver's files (no process started): the entries of
    /proc/driver/nvidia/gpus, else the /dev/nvidiaN devices (a container may have those alone); 0
    where there are neither, None where this cannot be told (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        pass
    try:
        return sum(1 for name in os.listdir("/dev") if name.startswith("nvidia") and name[6:].isdigit())
    except OSError:
        return None


def cpu_count() -> int:
    """Cores this process may use (respects affinity masks and cgroups' cpusets)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


_SOFT_AT_START: list[int] = []  # the open-files soft limit tflaunch was started with, once raised


def raise_open_files_limit() -> int:
    """Raise this process's soft RLIMIT_NOFILE to the hard limit (as far as the kernel allows) and
    return the new soft limit. What tflaunch starts on this machine gets the old one back
    (:func:`restore_open_files_limit`): tasks see the limit their user set."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if not _SOFT_AT_START:
        _SOFT_AT_START.append(soft)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass  # the kernel's nr_open is lower: keep what we have
    return soft


def restore_open_files_limit(pid: int) -> None:
    """Give process ``pid`` (a child of tflaunch) the soft limit tflaunch itself was started with."""
    if not _SOFT_AT_START:
        return
    import resource

    try:
        _, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (_SOFT_AT_START[0], hard))
    except (ValueError, OSError):
        pass  # it ended already, or the system has no prlimit: it keeps the raised limit
