"""Facts about this machine that planning needs: its names and its core count."""

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
