"""The listener that a job step's agents connect back to, and the address it should listen on.

Each caller and the listener prove to each other that they hold the run's token, without sending
it (the handshake of :mod:`launcher.agent`: a hello with the caller's name and nonce, the listener's
nonce and proof, the caller's proof, the listener's welcome); the connection is then handed over
as that name's channel, with nothing after the caller's proof consumed. Anyone who can reach the
port can connect, so every connection is a stranger until its proof checks out: its lines are read
as bytes and never decoded or shown, proofs are compared in constant time, a hello for a name that
is not expected (or already in) gets no answer, and each handshake has one deadline for all of it
(as OpenSSH's LoginGraceTime) and runs beside all the others on one selector thread, so a silent,
dripping or garbage-sending peer costs only its own connection.

At most ``pending_limit`` handshakes are open at once; a connection beyond that displaces the
oldest pending one that has not named an expected caller (else the oldest of all). A real caller
sends its hello as soon as it is connected, so a flood of idle connections cannot keep it out, and
what the listener holds stays bounded: ``pending_limit`` descriptors and buffers of at most
``HELLO_LIMIT`` bytes. The port closes as soon as every expected
caller is in, when its owner closes it, when ``alive()`` turns false, or ``within`` seconds after
it opened; closed for any reason but the owner's with callers still missing, it says which to
``missing``. A closed port is never opened again, so a caller that finds nothing listening there
knows that it is too late. A listener made with ``keep`` expects every name again after it came (a
node that restarted joins again under its name) and stays open until its owner closes it.
"""

from __future__ import annotations

import errno
import hmac
import ipaddress
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterable

from ..agent.protocol import HELLO_LIMIT, WELCOME, handshake_proof, new_nonce, read_hello

HANDSHAKE_DEADLINE = 10.0  # seconds from accept to the caller's proof; an agent answers at once
PENDING_LIMIT = 64  # open handshakes at least; twice the callers when there are more
ACCEPT_BURST = 64  # connections taken per wake-up before pending lines are read again
TICK = 0.5  # how often alive() and the overall deadline are looked at
_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class ConnectBack:
    """A TCP listener for a known set of callers; ``deliver(name, fd)`` gets each one's socket.

    ``deliver`` runs on the listener's thread, once per name, with a non-blocking descriptor that
    is then the receiver's to close. Call :meth:`start` once, and :meth:`close` on every exit path.
    """

    def __init__(self, names: Iterable[str], token: str, deliver: Callable[[str, int], None], host: str = "",
                 *, within: float, port: int = 0, alive: Callable[[], bool] = lambda: True,
                 deadline: float = HANDSHAKE_DEADLINE, pending_limit: int | None = None,
                 missing: Callable[[list[str]], None] = lambda names: None, keep: bool = False):
        self._keep = keep
        self._names = {name.encode(): name for name in names}
        self._waiting = set(self._names)
        self._token = token.encode()
        self._deliver = deliver
        self._alive = alive
        self._missing = missing
        self._deadline = deadline
        self._limit = pending_limit or max(PENDING_LIMIT, 2 * len(self._names))
        self._pending: dict[socket.socket, _Handshake] = {}  # in accept order: oldest first
        self._listener = socket.create_server((host, port), family=socket.AF_INET,
                                              backlog=min(socket.SOMAXCONN, max(128, 2 * len(self._names))))
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._end = time.monotonic() + within
        self._resume_at: float | None = None  # listening paused after running out of descriptors
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_lock = threading.Lock()  # close() may write to _wake_w while the thread closes it
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="tflaunch-connect-back", daemon=True)

    def start(self) -> None:
        if not self._stopping.is_set():
            self._thread.start()

    def close(self) -> None:
        """Stop listening and drop every pending handshake; returns once the port is closed."""
        self._stopping.set()
        if self._thread.ident is None:
            self._shut(None)
            return
        with self._wake_lock:
            if self._wake_w.fileno() != -1:
                try:
                    self._wake_w.send(b"\0")
                except OSError:
                    pass  # full or gone: the thread sees _stopping within a tick anyway
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=10.0)

    # -- the listener's thread ------------------------------------------------------------

    def _serve(self) -> None:
        selector = selectors.DefaultSelector()
        try:
            selector.register(self._listener, selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            while self._waiting and not self._stopping.is_set():
                now = time.monotonic()
                if now >= self._end or not self._alive():
                    break
                self._expire(now, selector)
                if self._resume_at is not None and now >= self._resume_at:
                    self._resume_at = None
                    selector.register(self._listener, selectors.EVENT_READ)
                timeout = TICK
                if self._pending:
                    timeout = min(timeout, max(0.0, next(iter(self._pending.values())).deadline - now))
                if self._resume_at is not None:
                    timeout = min(timeout, max(0.0, self._resume_at - now))
                for key, _ in selector.select(timeout):
                    if key.fileobj is self._listener:
                        self._accept(selector)
                    elif key.fileobj is not self._wake_r and key.fileobj in self._pending:
                        self._read(key.fileobj, selector)
                    if not self._waiting:
                        break
        finally:
            self._shut(selector)
        if self._waiting and not self._stopping.is_set():
            self._missing(sorted(self._names[name] for name in self._waiting))

    def _shut(self, selector: selectors.BaseSelector | None) -> None:
        for connection in self._pending:
            connection.close()
        self._pending.clear()
        if selector is not None:
            selector.close()
        self._listener.close()
        with self._wake_lock:
            self._wake_r.close()
            self._wake_w.close()

    def _expire(self, now: float, selector: selectors.BaseSelector) -> None:
        while self._pending:
            connection, handshake = next(iter(self._pending.items()))
            if handshake.deadline > now:
                return
            self._drop(connection, selector)

    def _drop(self, connection: socket.socket, selector: selectors.BaseSelector) -> None:
        del self._pending[connection]
        selector.unregister(connection)
        connection.close()

    def _least_likely(self) -> socket.socket:
        """The pending connection to give up for room: the oldest that has not yet named an expected
        caller, else the oldest of all. A real agent names itself as soon as it is connected."""
        return next((c for c, h in self._pending.items() if h.name is None), next(iter(self._pending)))

    def _accept(self, selector: selectors.BaseSelector) -> None:
        # A bounded burst: a flood of connections must not starve the lines already arriving.
        for _ in range(ACCEPT_BURST):
            try:
                connection, _ = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno not in _OUT_OF_DESCRIPTORS:
                    continue  # such as ECONNABORTED: that peer gave up before it was taken
                if self._pending:
                    self._drop(self._least_likely(), selector)
                    continue
                # Nothing of ours to free: stop listening briefly rather than spin on a ready listener.
                selector.unregister(self._listener)
                self._resume_at = time.monotonic() + 0.1
                return
            if len(self._pending) >= self._limit:
                self._drop(self._least_likely(), selector)
            connection.setblocking(False)
            self._pending[connection] = _Handshake(time.monotonic() + self._deadline)
            selector.register(connection, selectors.EVENT_READ)
            self._read(connection, selector)  # the line has often arrived with the connection
            if not self._waiting:
                return

    def _read(self, connection: socket.socket, selector: selectors.BaseSelector) -> None:
        handshake = self._pending[connection]
        line = handshake.line
        try:
            # Peek, then take only up to the newline: what follows the proof is the caller's first
            # frames, which belong to whoever receives the connection.
            seen = connection.recv(HELLO_LIMIT - len(line), socket.MSG_PEEK)
            end = seen.find(b"\n")
            taken = connection.recv(end + 1 if end >= 0 else len(seen)) if seen else b""
        except BlockingIOError:
            return
        except OSError:
            self._drop(connection, selector)
            return
        line += taken
        if not taken:
            self._drop(connection, selector)  # the peer closed before finishing its line
        elif end >= 0:
            whole = bytes(line[:-1])
            line.clear()
            if handshake.name is None:
                self._hello(connection, handshake, whole, selector)
            else:
                self._finish(connection, handshake, whole, selector)
        elif len(line) >= HELLO_LIMIT:
            self._drop(connection, selector)

    def _hello(self, connection: socket.socket, handshake: "_Handshake", line: bytes,
               selector: selectors.BaseSelector) -> None:
        hello = read_hello(line)
        if hello is None or hello[0] not in self._waiting:
            self._drop(connection, selector)  # a stranger, or a name that is in: no proof for it
            return
        handshake.name, handshake.theirs = hello
        handshake.mine = new_nonce()
        answer = handshake.mine + b" " + self._proof(b"listener", handshake) + b"\n"
        try:
            sent = connection.send(answer)  # a hundred bytes into an empty send buffer
        except OSError:
            sent = 0
        if sent != len(answer):
            self._drop(connection, selector)

    def _finish(self, connection: socket.socket, handshake: "_Handshake", line: bytes,
                selector: selectors.BaseSelector) -> None:
        name = handshake.name
        if not hmac.compare_digest(line, self._proof(b"agent", handshake)) or name not in self._waiting:
            self._drop(connection, selector)
            return
        try:
            sent = connection.send(WELCOME)  # the agent obeys nothing before it, and tries again without it
        except OSError:
            sent = 0
        if sent != len(WELCOME):
            self._drop(connection, selector)
            return
        del self._pending[connection]
        selector.unregister(connection)
        if not self._keep:
            self._waiting.discard(name)
        self._deliver(self._names[name], connection.detach())

    def _proof(self, side: bytes, handshake: "_Handshake") -> bytes:
        return handshake_proof(self._token, side, handshake.name, handshake.theirs, handshake.mine)


class _Handshake:
    """One connection's way through the handshake: its deadline, the line being read, and once its
    hello came, the name it calls as and both nonces."""

    __slots__ = ("deadline", "line", "name", "theirs", "mine")

    def __init__(self, deadline: float):
        self.deadline = deadline
        self.line = bytearray()
        self.name: bytes | None = None
        self.theirs = b""
        self.mine = b""


def source_address(addresses: Iterable[str]) -> str | None:
    """The one IPv4 address of this host that its routes to ``addresses`` leave from, or None.

    That is the address a peer at each of them can reach this host at. None when one of them
    cannot be resolved or routed, or when the routes leave from different addresses. A target
    routed through loopback is this host itself, which reaches any of its own addresses.
    """
    sources: list[str] = []
    for address in addresses:
        try:
            target = socket.getaddrinfo(address, None, socket.AF_INET, socket.SOCK_DGRAM)[0][4][0]
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((target, 9))  # a UDP connect only picks the route: nothing is sent
                sources.append(probe.getsockname()[0])
        except (OSError, UnicodeError):  # UnicodeError: a name that is no valid host name at all
            return None
    outward = {s for s in sources if not ipaddress.ip_address(s).is_loopback}
    if len(outward) > 1:
        return None
    return next(iter(outward), sources[0] if sources else None)
