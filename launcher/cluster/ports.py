"""Ports on this machine: free ports reserved for ``auto`` tasks, and clash checks.

A port found free is free only until someone else takes it, so each port picked for a run is
kept two ways:

- held by a socket bound to it on every address (one dual-stack IPv6 socket where the machine
  has IPv6), made without SO_REUSEADDR so that the kernel hands out a port no socket has, and no
  other user's program can bind it, whatever options it sets. SO_REUSEPORT, set after the bind,
  lets this user's own probes listen there meanwhile (see :func:`~.probe.port_is_free`).
  TensorFlow's server does not set it, so the socket is closed just before the run's tasks start
  (:meth:`PortReservation.unhold`); from then until the task has bound the port (TensorFlow's
  start-up, some seconds) any program could take it, and the task would fail to start. At most
  :data:`HELD_AT_MOST` ports of a run are held (fewer when the open-files limit has no room);
  the others were free when picked and are only locked.
- by an exclusive lock on one byte of a lock file of the user's own, for the whole run: two
  tflaunch runs of one user never pick the same port, also while one's task is still starting or
  restarting on it and the kernel does not know the port is spoken for. It is an
  open-file-description lock, so one descriptor holds all of a run's ports, two runs in one
  process exclude each other too, and the kernel drops the locks when tflaunch exits. The byte
  is a keyed hash of the port, as an agent's claims are (:func:`launcher.agent.ports.keyed_byte`,
  under the random key kept at the file's start), so /proc/locks, which every user can read,
  names no port.

The lock file is ``ports-<host>.lock`` in the first of these folders that will do:
``$XDG_RUNTIME_DIR/tflaunch`` (a folder made for this user alone), ``$TMPDIR/tflaunch-<uid>``,
``~/.cache/tflaunch`` (``$XDG_CACHE_HOME``). A folder is used only when it is this user's and no
one else may write it, and only when its file system can lock (NFS without its lock daemon cannot:
that folder is passed over for the next); neither the folder nor the file is followed when it is
a link, and a file that is not the user's own plain file is replaced. Other users can thus neither
read, lock, redirect nor corrupt it, and a folder another user made first only moves it to the next.
When another user has made every one of them first (or none can lock), the run's ports are locked
in a file of its own with no name (:func:`private_lock`): nobody can take that from the run, but it
keeps the ports from this run's own picks only, not from the user's other runs.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import stat
import struct
from collections.abc import Sequence
from pathlib import Path

from ..agent.ports import claim_key, keyed_byte
from .probe import port_is_free

__all__ = ["HELD_AT_MOST", "PortReservation", "lock_folders", "port_is_free", "reserve_ports"]

# Ports of one run held as sockets; the rest are locked only. Each held port is a descriptor until
# the tasks start, and the kernel's search for a free port slows as more of them are bound.
HELD_AT_MOST = 256
# What a lock says on a file system that has none (NFS without its lock daemon, some FUSE ones).
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


class PortReservation:
    """Ports picked for one run: locked against the user's other runs until :meth:`release` (or
    process exit), and the held ones held by a socket until :meth:`unhold`."""

    def __init__(self) -> None:
        self.ports: dict[str, int] = {}
        self._holders: list[socket.socket] = []
        self._lock_fd: int | None = None

    def unhold(self) -> None:
        """Let go of the sockets (the tasks bind their ports next); the locks stay."""
        for holder in self._holders:
            holder.close()
        self._holders.clear()

    def release(self) -> None:
        self.unhold()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # drops every byte lock of this reservation at once
            self._lock_fd = None

    def __enter__(self) -> "PortReservation":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_folders() -> list[Path]:
    """Where this user's port lock may live, in the order tried."""
    import tempfile  # with shutil and random behind it: loaded where a lock is taken, not at every start

    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    folders = [Path(runtime) / "tflaunch"] if os.path.isabs(runtime) else []
    folders.append(Path(tempfile.gettempdir()) / f"tflaunch-{os.geteuid()}")
    cache = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(cache):  # the XDG rule: a relative path is ignored
        try:
            cache = str(Path.home() / ".cache")
        except (KeyError, RuntimeError):  # no HOME and no password entry
            return folders
    return folders + [Path(cache) / "tflaunch"]


def reserve_ports(names: list[str], folders: Sequence[Path] | None = None, attempts: int = 200,
                  hold: int = HELD_AT_MOST) -> PortReservation:
    """A free port for each task name, locked, and the first ``hold`` of them held (see the
    module docstring); the others were free when picked.

    OSError when the lock has none of ``folders`` of the user's own (with the default folders it
    falls back on :func:`private_lock`), or when ``attempts`` picks in a row were all ports that
    this run or another of the user's has locked."""
    reservation = PortReservation()
    if not names:
        return reservation
    if folders is not None:
        fd, key = open_port_lock(folders)
    else:
        try:
            fd, key = open_port_lock(lock_folders())
        except OSError as exc:
            if exc.errno != errno.EACCES:
                raise
            fd, key = private_lock()
    reservation._lock_fd = fd
    taken: set[int] = set()
    try:
        for name in names:
            for _ in range(attempts):
                holder = _hold()
                if holder is None:
                    continue
                port = holder.getsockname()[1]
                # Taken: an earlier port of this run that is locked only (its own lock does not stop
                # it), or locked by another run of this user's, whose task may still be starting.
                if port in taken or not _lock_byte(fd, key, port):
                    holder.close()
                    continue
                taken.add(port)
                reservation.ports[name] = port
                if len(reservation._holders) < min(hold, HELD_AT_MOST):
                    reservation._holders.append(holder)
                else:
                    holder.close()
                break
            else:
                raise OSError(errno.EADDRINUSE, f"no free port found for {name} after {attempts} tries")
    except BaseException:
        reservation.release()
        raise
    return reservation


def _hold(port: int = 0) -> socket.socket | None:
    """A socket bound to ``port`` (0: one the kernel picks) on every address; None when taken.

    Without SO_REUSEADDR: the kernel hands out a port no socket has, and no socket that sets it
    can bind the port beside this one."""
    for family, address in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as exc:
            if family == socket.AF_INET6 and exc.errno == errno.EAFNOSUPPORT:
                continue  # no IPv6 on this machine
            raise
        try:
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # IPv4 too
            sock.bind((address, port))
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRINUSE:  # taken, or (port 0) none left to hand out
                return None
            if family == socket.AF_INET6 and exc.errno == errno.EADDRNOTAVAIL:
                continue  # IPv6 switched off on this machine
            raise
        if hasattr(socket, "SO_REUSEPORT"):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        return sock
    raise OSError(errno.EAFNOSUPPORT, "no TCP socket can be made on this machine")


# -- the lock file -------------------------------------------------------------------------


def open_port_lock(folders: Sequence[Path]) -> tuple[int, bytes]:
    """A read-write descriptor of the lock file in the first folder that is the user's alone and
    can lock, and the file's key.

    OSError naming every folder tried and why it was passed over, when none will do."""
    passed: list[str] = []
    for folder in folders:
        try:
            fd = _open_in(Path(folder))
        except _NotPrivate as exc:
            passed.append(f"{folder} {exc}")
            continue
        except OSError as exc:
            passed.append(f"{folder}: {exc.strerror or exc}")
            continue
        try:
            key = claim_key(fd)  # under a lock: it shows whether the file system has locks at all
        except OSError as exc:
            os.close(fd)
            if exc.errno not in _NO_LOCKS:
                raise
            passed.append(f"{folder}: cannot lock files there ({exc.strerror})")
            continue
        return fd, key
    raise OSError(errno.EACCES, "no folder of this user's alone for the port lock: " + "; ".join(passed))


def private_lock() -> tuple[int, bytes]:
    """A lock file with no name (O_TMPFILE; else one unlinked at once) and its key: where every
    folder the lock could live in was taken, this run still runs, its picks locked against each
    other only."""
    import tempfile

    with tempfile.TemporaryFile() as anonymous:
        fd = os.dup(anonymous.fileno())
    os.set_inheritable(fd, False)
    return fd, claim_key(fd)


class _NotPrivate(Exception):
    """A folder someone else could write to, or a link: never used."""


def _open_in(folder: Path) -> int:
    try:
        folder.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        pass
    try:
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _NotPrivate("is a link or not a folder") from None
        raise
    try:
        info = os.fstat(dir_fd)
        if info.st_uid != os.geteuid():
            raise _NotPrivate(f"belongs to user {info.st_uid}")
        if stat.S_IMODE(info.st_mode) & 0o077:
            os.fchmod(dir_fd, 0o700)  # the user's own: from now on no one else can add a file to it
        name = f"ports-{os.uname().nodename}.lock"  # one per machine: a home folder may be shared by several
        fd = _open_file(name, dir_fd)
        if fd is None:
            # Not the user's own plain file (put there while the folder was open to others): only
            # its name goes, whatever it points to is not touched.
            os.unlink(name, dir_fd=dir_fd)
            fd = _open_file(name, dir_fd)
            if fd is None:
                raise _NotPrivate(f"holds a {name} that is not this user's plain file")
        return fd
    finally:
        os.close(dir_fd)


def _open_file(name: str, dir_fd: int) -> int | None:
    """The lock file, made if missing; None when what is there is not the user's own plain file."""
    try:
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600,
                     dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            return None
        raise
    info = os.fstat(fd)
    # One link only: a hard link to another file of the user's is not a lock file.
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_nlink != 1:
        os.close(fd)
        return None
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.fchmod(fd, 0o600)
    return fd


def _flock(kind: int, start: int) -> bytes:
    """A ``struct flock`` for byte ``start`` (l_type, l_whence, l_start, l_len, l_pid = 0 for OFD locks)."""
    return struct.pack("hhqqi4x", kind, os.SEEK_SET, start, 1, 0)


def _lock_byte(fd: int, key: bytes, port: int) -> bool:
    """Lock the byte that stands for ``port``; False when another run of this user's holds it."""
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _flock(fcntl.F_WRLCK, keyed_byte(key, port)))
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            return False
        raise
    return True
