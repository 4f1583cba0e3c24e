"""Ports a ``PORTS`` command asks for: picked free, held until the task that uses each starts, and
claimed against this user's other runs on the host.

Each port is bound on every address without SO_REUSEADDR (no other user's program can bind it,
whatever options it sets, nor get it from the kernel) and with SO_REUSEPORT set after the bind
(this user's probes, which set it too, can still listen there); a task whose ``release`` field
names one gets it freed just before it starts, since TensorFlow does not set SO_REUSEPORT. Each
port is also claimed for as long as the agent runs (see :class:`PortClaims`), so that no other
tflaunch run of this user's on the host is given it while this run's task starts or restarts on it.
"""

import errno
import os
import struct

from .protocol import Status, node_name

# Claims on this host's ports against this user's other runs: from the moment a task's port is let
# go until the task has bound it (TensorFlow's start-up, seconds) the kernel would hand the port to
# the next run that asks; a claim makes this user's next run pass it by. A claim is an
# open-file-description lock on one byte of a lock file in a folder of this user's alone, so no
# other user can take, block or see it; the byte is a keyed hash of the port (the key is the file's
# first KEY_BYTES), so /proc/locks, which everyone reads, names no port. The kernel drops the locks
# when the agent exits. tflaunch's own machine keeps its picks in a lock of its own
# (launcher.cluster.ports), keyed by the same rule (keyed_byte, claim_key).
CLAIM_FILE = "port-claims-%s.lock"
CLAIM_TRIES = 256  # ports picked and passed by, at most, before PORTS gives up
KEY_BYTES = 32
F_OFD_SETLK, F_OFD_SETLKW = 37, 38  # Linux's numbers; the fcntl module names them from Python 3.9


def claim_folders(environ):
    """Where this user's claims may live, in the order tried: ``$XDG_RUNTIME_DIR`` (made for this
    user alone), ``$TMPDIR`` (or /tmp) ``/tflaunch-<uid>``, then ``~/.cache/tflaunch``."""
    folders = []
    runtime = environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(runtime):
        folders.append(os.path.join(runtime, "tflaunch"))
    temp = environ.get("TMPDIR", "")
    folders.append(os.path.join(temp if os.path.isabs(temp) else "/tmp", "tflaunch-%d" % os.geteuid()))
    cache = environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(cache):
        cache = os.path.join(os.path.expanduser("~"), ".cache")
    if os.path.isabs(cache):
        folders.append(os.path.join(cache, "tflaunch"))
    return folders


def lock_struct(kind, start, length=1):
    """A ``struct flock`` (l_type, l_whence, l_start, l_len, and l_pid 0, as OFD locks want)."""
    return struct.pack("hhqqi4x", kind, os.SEEK_SET, start, length, 0)


class PortClaims(object):
    """This user's claims on this host's ports, kept in the first of ``folders`` that is the
    user's alone and can lock; with none, no claim can be had and every one succeeds."""

    def __init__(self, folders):
        self.fd, self.key = None, b""
        for folder in folders:
            fd = None
            try:
                fd = own_file(folder, CLAIM_FILE % node_name())
                self.key = claim_key(fd)
            except OSError:
                if fd is not None:
                    os.close(fd)
                continue  # not the user's alone, or no locks there: the next folder
            self.fd = fd
            return

    def claim(self, port):
        """True once ``port`` is claimed, False when another run of this user's holds it."""
        import fcntl

        if self.fd is None:
            return True
        try:
            fcntl.fcntl(self.fd, F_OFD_SETLK, lock_struct(fcntl.F_WRLCK, self.byte(port)))
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EAGAIN):
                return False
            raise
        return True

    def release(self, port):
        import fcntl

        if self.fd is not None:
            fcntl.fcntl(self.fd, F_OFD_SETLK, lock_struct(fcntl.F_UNLCK, self.byte(port)))

    def byte(self, port):
        return keyed_byte(self.key, port)


def keyed_byte(key, port):
    """The byte of a lock file that stands for ``port`` under ``key``: past the key, at a keyed
    hash of the port (48 bits), so that /proc/locks names no port to anyone without the key."""
    import hashlib
    import hmac

    return KEY_BYTES + int(hmac.new(key, b"%d" % port, hashlib.sha256).hexdigest()[:12], 16)


def own_file(folder, name):
    """A read-write descriptor of ``name`` in ``folder`` (both made if missing), when the folder is
    this user's and only theirs to write and neither is a link; a name that is not the user's own
    plain file is replaced (what it points to is never touched). OSError saying why not."""
    import stat

    try:
        os.makedirs(folder, 0o700)
    except FileExistsError:
        pass
    folder_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        info = os.fstat(folder_fd)
        if info.st_uid != os.geteuid():
            raise OSError(errno.EPERM, "the folder belongs to user %d" % info.st_uid)
        if info.st_mode & 0o077:
            os.fchmod(folder_fd, 0o700)  # the user's own: from now on no one else can add a name
        for _ in range(2):
            try:
                fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600,
                             dir_fd=folder_fd)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENXIO):
                    raise
            else:
                info = os.fstat(fd)
                if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid() and info.st_nlink == 1:
                    if info.st_mode & 0o077:
                        os.fchmod(fd, 0o600)
                    return fd
                os.close(fd)
            os.unlink(name, dir_fd=folder_fd)
        raise OSError(errno.EPERM, "%s there is not this user's plain file" % name)
    finally:
        os.close(folder_fd)


def claim_key(fd):
    """The lock file's key, written by whichever agent comes first, under a lock on it: where the
    file system has no locks (NFS without its lock daemon) that lock fails, and with it the folder."""
    import fcntl

    fcntl.fcntl(fd, F_OFD_SETLKW, lock_struct(fcntl.F_WRLCK, 0, KEY_BYTES))
    try:
        key = os.pread(fd, KEY_BYTES, 0)
        if len(key) < KEY_BYTES:
            key = os.urandom(KEY_BYTES)
            os.pwrite(fd, key, 0)
        return key
    finally:
        fcntl.fcntl(fd, F_OFD_SETLK, lock_struct(fcntl.F_UNLCK, 0, KEY_BYTES))


class HeldPorts(object):
    """The ports this agent picked for ``PORTS`` commands: each held by a socket until the task
    that names it in ``release`` starts, and claimed until the agent exits."""

    def __init__(self):
        self.sockets = {}  # port -> the socket that holds it until its task starts
        self.claims = None  # this user's claims on the host's ports, once ports are asked for

    def pick(self, count):
        """Pick and hold ``count`` ports: the answer of a ``P`` frame (the ports, space-separated,
        or ``error <reason>`` with none held)."""
        import socket  # here, not at the top: importing it is a third of the agent's start-up

        picked, passed = [], []  # passed: held until the end, so the kernel hands out others
        if self.claims is None:
            self.claims = PortClaims(claim_folders(os.environ))
        try:
            while len(picked) < count:
                if len(passed) > CLAIM_TRIES:
                    raise OSError(errno.EADDRINUSE, "%d free ports in a row were claimed by this user's other "
                                  "runs" % len(passed))
                sock = bind_free_port(socket)
                port = sock.getsockname()[1]
                if not self.claims.claim(port):  # another run's task was given it: it may not have bound it yet
                    passed.append(sock)
                    continue
                self.sockets[port] = sock
                picked.append(port)
            answer = " ".join(str(port) for port in picked)
        except OSError as exc:
            for port in picked:
                self.sockets.pop(port).close()
                self.claims.release(port)
            answer = "%s %s" % (Status.ERROR, exc.strerror or exc)
        for sock in passed:
            sock.close()
        return answer

    def let_go(self, release):
        """Free the held ports a task's ``release`` field names (comma-separated): it is about to
        bind them. Their claims stay."""
        for port in (release or "").split(","):
            if port.isdigit() and int(port) in self.sockets:
                self.sockets.pop(int(port)).close()


def bind_free_port(socket):
    """A socket bound to a port the kernel picked, which no other socket can bind beside it."""
    # Without SO_REUSEADDR: the kernel hands out a port nobody holds, and a socket that set
    # SO_REUSEADDR could otherwise bind it beside this one. Dual-stack where the host has
    # IPv6, so that no IPv6-only socket can take the port either.
    try:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    except OSError:
        sock = None
    if sock is not None:
        try:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(("::", 0))
        except OSError:
            sock.close()  # IPv6 switched off here
            sock = None
    if sock is None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("0.0.0.0", 0))
    if hasattr(socket, "SO_REUSEPORT"):  # only this user's sockets may join it
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    return sock
