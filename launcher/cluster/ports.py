"""Ports on this machine: free ports reserved for ``auto`` tasks, and clash checks.

A port found free with ``bind(0)`` is free only until someone else takes it. Two tflaunch runs
started at the same moment must not pick the same one, so each picked port is also claimed with
an exclusive lock on byte ``port`` of one lock file shared by every tflaunch on the machine (an
open-file-description lock, so one descriptor holds all of a run's ports, and two runs in one
process exclude each other too); the locks live as long as the run (the kernel drops them when
tflaunch exits, even on SIGKILL).
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import struct
import tempfile
from pathlib import Path

from .probe import port_is_free

__all__ = ["PortReservation", "port_is_free", "reserve_ports"]

LOCK_DIR = Path(tempfile.gettempdir()) / "tflaunch-ports"


class PortReservation:
    """Ports held for one run; ``release`` (or process exit) frees them."""

    def __init__(self) -> None:
        self.ports: dict[str, int] = {}
        self._lock_fd: int | None = None

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # drops every byte lock of this reservation at once
            self._lock_fd = None

    def __enter__(self) -> "PortReservation":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def reserve_ports(names: list[str], lock_dir: Path = LOCK_DIR, attempts: int = 200) -> PortReservation:
    """A free, locked port for each task name."""
    reservation = PortReservation()
    if not names:
        return reservation
    lock_dir.mkdir(mode=0o1777, parents=True, exist_ok=True)
    try:
        os.chmod(lock_dir, 0o1777)  # shared by every user's tflaunch; mkdir's mode is cut by the umask
    except PermissionError:
        pass  # someone else's folder, already set up
    path = lock_dir / "ports.lock"
    reservation._lock_fd = fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        os.fchmod(fd, 0o666)  # every user's tflaunch locks bytes of the same file
    except PermissionError:
        pass
    taken: set[int] = set()
    for name in names:
        for _ in range(attempts):
            port = _ephemeral_port()
            if port in taken or not _lock_byte(fd, port):
                continue  # ours already, or another tflaunch holds it
            if port_is_free(port):
                taken.add(port)
                reservation.ports[name] = port
                break
            _unlock_byte(fd, port)
        else:
            reservation.release()
            raise OSError(errno.EADDRINUSE, f"no free port found for {name} after {attempts} tries")
    return reservation


def _ephemeral_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def _flock(kind: int, port: int) -> bytes:
    """A ``struct flock`` for byte ``port`` (l_type, l_whence, l_start, l_len, l_pid = 0 for OFD locks)."""
    return struct.pack("hhqqi4x", kind, os.SEEK_SET, port, 1, 0)


def _lock_byte(fd: int, port: int) -> bool:
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _flock(fcntl.F_WRLCK, port))
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            return False
        raise
    return True


def _unlock_byte(fd: int, port: int) -> None:
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _flock(fcntl.F_UNLCK, port))
