"""The mesh probe (standard library only): run on each host to prove it can reach every other task.

Sent as ``python -c <source> <base64 JSON>``, like the host probe. Input::

    {"listen": [2222, ...],                         # this host's task ports; [] when tasks hold them
     "targets": [{"id": 0, "host": "node2", "port": 2222}, ...],
     "timeout": 10,                                 # seconds per connect
     "lifetime": 40}                                # the probe exits after this long whatever happens

Protocol on stdout/stdin, one line each, so that every host listens before any host connects:

1. binds a listener on each ``listen`` port (every address, as TensorFlow's gRPC server does) and
   prints ``TFLAUNCH_MESH_LISTENING {"2222": null | "error"}``;
2. waits for a ``go`` line on stdin, then resolves every target's name here, on this host, and
   connects to it, all in parallel, and prints ``TFLAUNCH_MESH_RESULT [{"id", "ok", "error",
   "resolved", "seconds"}, ...]``;
3. keeps its listeners open until stdin reaches EOF (other hosts may still be connecting), then exits.

EOF at any point ends it: when the launcher or its ssh client dies, nothing stays behind.
Python 3.6+ compatible on purpose: it runs on whatever interpreter a host has.

The listeners are on the task ports of a shared host, open to anyone who can reach it. A prober
only needs the handshake (it resets the connection at once), so what a stranger can do is bounded:
at most MAX_HELD connections are held at once (the oldest goes when another arrives), each for at
most the connect timeout, whatever is sent on them is read and dropped, and after a total of
accepted connections that every other host's probe could not need, the listeners accept no more.
"""

import base64
import collections
import errno
import json
import os
import select
import selectors
import socket
import struct
import sys
import threading
import time

MAX_PARALLEL = 64
MAX_HELD = 64  # accepted connections held open at once
MAX_LINE = 4096  # bytes of one line on stdin (the launcher writes "go")

# Why a connect failed, by errno. Linux answers a connect through a blackhole route with EINVAL.
CAUSES = {
    errno.ECONNREFUSED: "connection refused",
    errno.EHOSTUNREACH: "no route to host",
    errno.ENETUNREACH: "network is unreachable",
    errno.EINVAL: "no route to host (blackhole route)",
    errno.EACCES: "blocked by a firewall rule (permission denied)",
    errno.EPERM: "blocked by a firewall rule (operation not permitted)",
    errno.ECONNRESET: "connection reset",
    errno.EADDRNOTAVAIL: "address not available",
}


def listen(port):
    """A listening socket on ``port`` on every address: dual-stack IPv6 where the host has it, else IPv4."""
    error = None
    for family, address in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as exc:
            error = exc
            continue  # no IPv6 here
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if hasattr(socket, "SO_REUSEPORT"):  # a port tflaunch holds for a task is held with it
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind((address, port))
            sock.listen(128)
            return sock
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRINUSE:
                raise
            error = exc  # IPv6 switched off on this host: try IPv4
    raise error


def abort(sock):
    """Close with a reset, so neither end keeps the connection in TIME_WAIT."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


def accept_connections(listeners, hold, total):
    """Accept connections and keep each until its peer closes it, ``hold`` seconds at most.

    Accepting keeps a full backlog from turning a peer's connect into a timeout. Leaving the close
    to the peer (which resets) leaves no TIME_WAIT on the task's port here, and no reset that could
    race the peer's own connect; a connection still open at its deadline, or the oldest one when
    MAX_HELD are open, is reset from here. After ``total`` connections the listeners stay bound
    (the ports stay held) but nothing more is accepted.
    """
    chooser = selectors.DefaultSelector()  # epoll where there is one: no limit on descriptor numbers
    for sock in listeners:
        sock.setblocking(False)
        chooser.register(sock, selectors.EVENT_READ, "listener")
    held = collections.OrderedDict()  # connection -> deadline, oldest first

    def drop(conn):
        chooser.unregister(conn)
        del held[conn]
        abort(conn)

    accepted = 0
    while True:
        now = time.time()
        while held and next(iter(held.values())) <= now:
            drop(next(iter(held)))
        try:
            events = chooser.select(next(iter(held.values())) - now if held else None)
        except (OSError, ValueError):
            return  # a listener was closed: the probe is ending
        for key, _ in events:
            sock = key.fileobj
            if key.data == "listener":
                if accepted >= total:
                    continue
                try:
                    conn = sock.accept()[0]
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:  # out of descriptors, say: wait rather than spin on a ready listener
                    time.sleep(0.05)
                    continue
                accepted += 1
                if accepted >= total:
                    for listener in listeners:
                        chooser.unregister(listener)
                if len(held) >= MAX_HELD:
                    drop(next(iter(held)))
                conn.setblocking(False)
                held[conn] = time.time() + hold
                chooser.register(conn, selectors.EVENT_READ, "held")
            elif sock in held:
                try:
                    data = sock.recv(4096)  # nothing is expected; what comes is dropped
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                if not data:
                    drop(sock)


def describe(exc, timeout):
    if isinstance(exc, socket.timeout):
        return "timed out after %g s" % timeout
    if isinstance(exc, socket.gaierror):
        return "cannot resolve"
    cause = CAUSES.get(exc.errno)
    return cause if cause else (os.strerror(exc.errno).lower() if exc.errno else str(exc))


def connect(target, timeout, resolved_names, lock):
    """Resolve ``target`` here and connect to its first address that answers; a result record."""
    started = time.time()
    result = {"id": target["id"], "ok": False, "error": None, "resolved": None, "seconds": 0.0}
    name, port = target["host"], int(target["port"])
    try:
        with lock:
            addresses = resolved_names.get(name)
        if addresses is None:
            infos = socket.getaddrinfo(name, port, 0, socket.SOCK_STREAM)
            addresses = [(info[0], info[4][0]) for info in infos]
            with lock:
                resolved_names[name] = addresses
    except socket.gaierror as exc:
        result["error"] = "cannot resolve"
        result["detail"] = exc.strerror
        result["seconds"] = round(time.time() - started, 3)
        return result
    first_error = None
    for family, address in addresses:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect((address, port))
            result.update(ok=True, error=None, resolved=address)
            abort(sock)
            break
        except (OSError, socket.timeout) as exc:
            sock.close()
            if first_error is None:
                first_error = describe(exc, timeout)
                result["resolved"] = address
    if not result["ok"]:
        result["error"] = first_error or "no address"
    result["seconds"] = round(time.time() - started, 3)
    return result


def connect_all(targets, timeout, deadline):
    """Connect to every target in parallel; targets with no answer by ``deadline`` count as timed out."""
    results, lock, resolved_names = {}, threading.Lock(), {}
    slots = threading.BoundedSemaphore(MAX_PARALLEL)

    def work(target):
        with slots:
            record = connect(target, timeout, resolved_names, lock)
        with lock:
            results[target["id"]] = record

    threads = [threading.Thread(target=work, args=(t,), daemon=True) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.time()))
    with lock:
        done = dict(results)
    # A name lookup that never returns (an unreachable DNS server) must not hold the probe forever.
    return [done.get(t["id"]) or {"id": t["id"], "ok": False, "error": "no answer (name lookup or connect) "
                                  "within %g s" % timeout, "resolved": None, "seconds": timeout}
            for t in targets]


class LineReader:
    """Lines from stdin read straight from its file descriptor, so select() sees everything unread."""

    def __init__(self, fd=0):
        self.fd = fd
        self.buffer = b""
        self.eof = False

    def line(self, deadline):
        """The next line (bytes), or None on EOF, when ``deadline`` passes, or after MAX_LINE bytes
        without a newline (then nothing more is read: no line of this protocol is that long)."""
        while b"\n" not in self.buffer and not self.eof:
            remaining = deadline - time.time()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([self.fd], [], [], remaining)
            if ready:
                chunk = os.read(self.fd, 4096)
                self.eof = not chunk
                self.buffer += chunk
                if b"\n" not in self.buffer and len(self.buffer) > MAX_LINE:
                    self.eof, self.buffer = True, b""
        if b"\n" not in self.buffer:
            return None
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line


def say(mark, payload):
    sys.stdout.write(mark + " " + json.dumps(payload) + "\n")
    sys.stdout.flush()


def main():
    request = json.loads(base64.b64decode(sys.argv[1]).decode("utf-8"))
    deadline = time.time() + float(request.get("lifetime", 60))
    timeout = float(request.get("timeout", 10))
    listeners, status = [], {}
    for port in request.get("listen", []):
        try:
            listeners.append(listen(int(port)))
            status[str(port)] = None
        except OSError as exc:
            status[str(port)] = describe(exc, timeout)
    targets = request.get("targets", [])
    if listeners:
        # Every other host's probe dials each of these ports once; its targets include every other host.
        total = MAX_HELD + 2 * len(listeners) * (len(targets) + 1)
        threading.Thread(target=accept_connections, args=(listeners, timeout, total), daemon=True).start()
    say("TFLAUNCH_MESH_LISTENING", status)
    stdin = LineReader()
    line = stdin.line(deadline)
    if line is not None and line.strip() == b"go":
        say("TFLAUNCH_MESH_RESULT", connect_all(targets, timeout, min(deadline, time.time() + timeout + 2)))
        while stdin.line(deadline) is not None:  # hold the listeners until the launcher closes stdin
            pass
    for sock in listeners:
        sock.close()


if __name__ == "__main__":
    main()
