"""Ports on this machine: free ports reserved for ``auto`` tasks, and clash checks.

A port found free with ``bind(0)`` is free only until someone else takes it. Two tflaunch runs
started at the same moment must not pick the same one, so each picked port is also claimed with
an exclusive ``flock`` on a lock file shared by every tflaunch on the machine; the lock lives as
long as the run (the kernel drops it when tflaunch exits, even on SIGKILL).
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import tempfile
from pathlib import Path

from .probe import port_is_free

__all__ = ["PortReservation", "port_is_free", "reserve_ports"]

LOCK_DIR = Path(tempfile.gettempdir()) / "tflaunch-ports"


class PortReservation:
    """Ports held for one run; ``release`` (or process exit) frees them."""

    def __init__(self) -> None:
        self.ports: dict[str, int] = {}
        self._lock_fds: list[int] = []

    def release(self) -> None:
        for fd in self._lock_fds:
            os.close(fd)
        self._lock_fds.clear()

    def __enter__(self) -> "PortReservation":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def reserve_ports(names: list[str], lock_dir: Path = LOCK_DIR, attempts: int = 200) -> PortReservation:
    """A free, locked port for each task name."""
    lock_dir.mkdir(mode=0o1777, parents=True, exist_ok=True)
    try:
        os.chmod(lock_dir, 0o1777)  # shared by every user's tflaunch; mkdir's mode is cut by the umask
    except PermissionError:
        pass  # someone else's folder, already set up
    reservation = PortReservation()
    for name in names:
        for _ in range(attempts):
            port = _ephemeral_port()
            fd = _try_lock(lock_dir / f"{port}.lock")
            if fd is None:
                continue  # another tflaunch holds it
            if port_is_free(port):
                reservation._lock_fds.append(fd)
                reservation.ports[name] = port
                break
            os.close(fd)
        else:
            reservation.release()
            raise OSError(errno.EADDRINUSE, f"no free port found for {name} after {attempts} tries")
    return reservation


def _ephemeral_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def _try_lock(path: Path) -> int | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
    except PermissionError:
        return None  # another user's lock file we cannot open: treat the port as held
    try:
        os.fchmod(fd, 0o644)
    except PermissionError:
        pass
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd
