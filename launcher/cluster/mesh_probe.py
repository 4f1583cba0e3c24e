"""The mesh probe (standard library only): run on each host to prove it can reach every other task.

Sent as ``python -c <source> <base64 JSON>``, like the host probe. Input::

    {"listen": [2222, ...],                         # this host's task ports; [] when tasks hold them
     "targets": [{"id": 0, "host": "node2", "port": 2222}, ...],
     "timeout": 10,                                 # seconds per connect
     "prove": true,                                 # the targets are probes: each must prove it
     "lifetime": 40}                                # the probe exits after this long whatever happens

The run's token for the probes is in the ``TFLAUNCH_MESH_TOKEN`` environment variable (which other
users cannot read, unlike the command line). A connection to a probe's listener proves that the
probe is there: the caller sends a nonce line (``NONCE_BYTES`` as hex), the listener answers with
``proof(token, nonce, address, port)`` (HMAC-SHA256, hex) over the address and port the connection
reached it at, and only the answer for the address and port the caller dialled counts as reached.
A program of someone else's on the port, a name that leads elsewhere, or a relay that passes the
bytes on to a probe at another address or port, cannot make a pair pass. On a live
cluster (no ``listen``) the tasks hold the ports and a connection alone is tried.

Protocol on stdout/stdin, one line each, so that every host listens before any host connects:

1. binds a listener on each ``listen`` port (every address, as TensorFlow's gRPC server does) and
   prints ``TFLAUNCH_MESH_LISTENING {"2222": null | "error"}``;
2. waits for a ``go`` line on stdin (``go [0, 3]``: the ids of targets not to dial, whose ports no
   probe could listen on), then resolves every other target's name here, on this host, and
   connects to it, all in parallel, and prints ``TFLAUNCH_MESH_RESULT [{"id", "ok", "error",
   "resolved", "seconds"}, ...]``, one record for each target dialled;
3. keeps its listeners open until stdin reaches EOF (other hosts may still be connecting), then exits.

EOF at any point ends it: when the launcher or its ssh client dies, nothing stays behind.
Python 3.6+ compatible on purpose: it runs on whatever interpreter a host has.

The listeners are on the task ports of a shared host, open to anyone who can reach it, so what a
stranger can do is bounded and cannot keep the probes out: every connection is accepted and
answered as soon as its nonce line is in; at most MAX_HELD connections are held at once (the
oldest goes when another arrives), each for at most the connect timeout; anything but a nonce line
ends its connection. A prober whose connection went unanswered tries again within its timeout.
"""

import base64
import collections
import binascii
import errno
import hashlib
import hmac
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
TOKEN_VARIABLE = "TFLAUNCH_MESH_TOKEN"
# The marks of the two lines tflaunch (launcher.run.checks.mesh) reads, from here.
LISTENING_MARK = "TFLAUNCH_MESH_LISTENING "
RESULT_MARK = "TFLAUNCH_MESH_RESULT "
NONCE_BYTES = 16
RETRY_PAUSE = 0.2  # seconds between a prober's tries at one target, within its timeout

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


def proof(token, nonce, address, port):
    """The answer (hex bytes) of a listener holding ``token`` (bytes) to a caller's ``nonce`` line,
    for a connection that reached it at ``address`` and ``port``."""
    bound = b"\0".join([b"tflaunch-mesh", nonce, address_text(address).encode(), b"%d" % port])
    return hmac.new(token, bound, hashlib.sha256).hexdigest().encode()


def address_text(address):
    """An address as both ends of a connection name it: an IPv4 address a dual-stack socket shows
    as ``::ffff:a.b.c.d`` as ``a.b.c.d``, an IPv6 zone (``%eth0``) left out."""
    address = address.split("%", 1)[0].lower()
    if address.startswith("::ffff:") and "." in address:
        return address[len("::ffff:"):]
    return address


def accept_connections(listeners, hold, token):
    """Accept connections, answer each nonce line with its proof, and keep each connection until
    its peer closes it, ``hold`` seconds at most.

    Accepting keeps a full backlog from turning a peer's connect into a timeout. Leaving the close
    to the peer (which resets) leaves no TIME_WAIT on the task's port here, and no reset that could
    race the peer's own connect; a connection still open at its deadline, the oldest one when
    MAX_HELD are open, or one that sent anything but one nonce line, is reset from here.
    """
    chooser = selectors.DefaultSelector()  # epoll where there is one: no limit on descriptor numbers
    for sock in listeners:
        sock.setblocking(False)
        chooser.register(sock, selectors.EVENT_READ, "listener")
    held = collections.OrderedDict()  # connection -> [deadline, what it sent], oldest first
    line = 2 * NONCE_BYTES + 1

    def drop(conn):
        chooser.unregister(conn)
        del held[conn]
        abort(conn)

    def read(conn):
        try:
            data = conn.recv(line + 1)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            drop(conn)
            return
        sent = held[conn][1] = held[conn][1] + data
        if len(sent) > line or (len(sent) == line and not sent.endswith(b"\n")):
            drop(conn)  # no caller of ours says more than its nonce line
        elif len(sent) == line:
            try:
                local = conn.getsockname()  # where the caller reached this listener
                conn.send(proof(token, sent[:-1], local[0], local[1]) + b"\n")
            except OSError:
                drop(conn)

    while True:
        now = time.time()
        while held and next(iter(held.values()))[0] <= now:
            drop(next(iter(held)))
        try:
            events = chooser.select(next(iter(held.values()))[0] - now if held else None)
        except (OSError, ValueError):
            return  # a listener was closed: the probe is ending
        for key, _ in events:
            sock = key.fileobj
            if key.data == "listener":
                try:
                    conn = sock.accept()[0]
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:  # out of descriptors, say: make room rather than spin on a ready listener
                    if held:
                        drop(next(iter(held)))
                    else:
                        time.sleep(0.05)
                    continue
                if len(held) >= MAX_HELD:
                    drop(next(iter(held)))
                conn.setblocking(False)
                held[conn] = [time.time() + hold, b""]
                chooser.register(conn, selectors.EVENT_READ, "held")
                read(conn)  # the nonce often came with the connection
            elif sock in held:
                read(sock)


def describe(exc, timeout):
    if isinstance(exc, socket.timeout):
        return "timed out after %g s" % timeout
    if isinstance(exc, socket.gaierror):
        return "cannot resolve"
    cause = CAUSES.get(exc.errno)
    return cause if cause else (os.strerror(exc.errno).lower() if exc.errno else str(exc))


NOT_OURS = "answered, but not as this run's probe (another program on the port, or the name leads elsewhere)"


def connect(target, timeout, resolved_names, lock, token=None):
    """Resolve ``target`` here and connect to its first address that answers (with ``token``: that
    answers with the proof of this run's probe); a result record."""
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
        error = reach(family, address, port, started + timeout, timeout, token)
        if error is None:
            result.update(ok=True, error=None, resolved=address)
            break
        if first_error is None:
            first_error, result["resolved"] = error, address
    if not result["ok"]:
        result["error"] = first_error or "no address"
    result["seconds"] = round(time.time() - started, 3)
    return result


def reach(family, address, port, deadline, timeout, token):
    """None once ``address:port`` is reached (and, with ``token``, has proven to be this run's
    probe), else why not. A connection closed before its answer came is tried again, while time is
    left: the listener may have let it go among a stranger's many."""
    while True:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(max(0.01, deadline - time.time()))
        try:
            sock.connect((address, port))
            if token is None:
                return None
            nonce = binascii.hexlify(os.urandom(NONCE_BYTES))
            sock.sendall(nonce + b"\n")
            answer = b""
            while not answer.endswith(b"\n") and len(answer) <= 2 * 32 + 1:
                chunk = sock.recv(128)
                if not chunk:
                    raise ConnectionResetError(errno.ECONNRESET, "closed before it answered")
                answer += chunk
            expected = proof(token, nonce, address, port) + b"\n"
            return None if hmac.compare_digest(answer, expected) else NOT_OURS
        except (OSError, socket.timeout) as exc:
            unanswered = token is not None and isinstance(exc, ConnectionResetError)
            if not unanswered or time.time() + RETRY_PAUSE >= deadline:
                return describe(exc, timeout)
        finally:
            abort(sock)
        time.sleep(RETRY_PAUSE)


def connect_all(targets, timeout, deadline, token=None):
    """Connect to every target in parallel; targets with no answer by ``deadline`` count as timed out."""
    results, lock, resolved_names = {}, threading.Lock(), {}
    slots = threading.BoundedSemaphore(MAX_PARALLEL)

    def work(target):
        with slots:
            record = connect(target, timeout, resolved_names, lock, token)
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
    sys.stdout.write(mark + json.dumps(payload) + "\n")
    sys.stdout.flush()


def main():
    request = json.loads(base64.b64decode(sys.argv[1]).decode("utf-8"))
    token = os.environ.pop(TOKEN_VARIABLE, "").encode()
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
        threading.Thread(target=accept_connections, args=(listeners, timeout, token), daemon=True).start()
    say(LISTENING_MARK, status)
    stdin = LineReader()
    line = stdin.line(deadline)
    words = line.strip().split(b" ", 1) if line is not None else []
    if words and words[0] == b"go":
        undialled = set(json.loads(words[1].decode("ascii"))) if len(words) > 1 else set()
        dialled = [t for t in targets if t["id"] not in undialled]
        say(RESULT_MARK, connect_all(dialled, timeout, min(deadline, time.time() + timeout + 2),
                                     token if request.get("prove") else None))
        while stdin.line(deadline) is not None:  # hold the listeners until the launcher closes stdin
            pass
    for sock in listeners:
        sock.close()


if __name__ == "__main__":
    main()
