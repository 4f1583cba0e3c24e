"""This machine: the names and addresses that mean it, its core count, and tflaunch's open-files
limit (raised for a run, given back to the tasks it starts here). Unlike the spec and the plan,
this module asks the system (interfaces, affinity, rlimits); whether an address is a loopback one
is pure and lives with the spec (:func:`launcher.cluster.spec.is_loopback`)."""

from __future__ import annotations

import os
import socket


def local_host_names() -> frozenset[str]:
    """Names and addresses under which a task's host is this machine."""
    names = {"localhost", "127.0.0.1", "::1", socket.gethostname()}
    try:
        import psutil

        for addresses in psutil.net_if_addrs().values():
            names.update(a.address.split("%")[0] for a in addresses if a.family in (socket.AF_INET, socket.AF_INET6))
    except Exception:  # noqa: BLE001 - interface listing is a nicety; names above suffice
        pass
    return frozenset(names)


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
