"""The stand-in worker's network (tests/workers/lockstep.py): a mesh over TF_CONFIG's addresses and
an all-reduce over it, and the servers of a ParameterServer cluster. Standard library only.

Every message is one :data:`FRAME`; a task that dials sends one :data:`HELLO` first, and a
connection that does not (a port probe) is closed.
"""

from __future__ import annotations

import socket
import struct
import sys
import threading
import time

FRAME = struct.Struct("!qd")  # (step, value): every message between tasks
HELLO = struct.Struct("!8sq")  # (magic, rank of the task that dials)
MAGIC = b"LOCKSTEP"
# A task whose peer went away ends this long after, as TensorFlow's survivors end only when its
# heartbeats miss the peer: the peer's own failure stays the first one tflaunch sees.
PEER_LOST_EXIT = 2.0
_keep: list = []  # the listening sockets: a task keeps its port while it runs


def say(text: str) -> None:
    print(text, flush=True)


def split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def listen(address: str) -> socket.socket:
    server = socket.socket(socket.AF_INET6 if ":" in split(address)[0] else socket.AF_INET)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        server.bind(("", split(address)[1]))
    except OSError as exc:
        say(f"lockstep: cannot listen on {address}: {exc}")
        sys.exit(1)
    server.listen(64)
    _keep.append(server)
    return server


def dial(address: str, rank: int, deadline: float) -> socket.socket:
    """A connection to the task at ``address``, retried until ``deadline`` while it is not up yet."""
    while True:
        try:
            conn = socket.create_connection(split(address), timeout=5)
            conn.settimeout(None)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.sendall(HELLO.pack(MAGIC, rank))
            return conn
        except OSError as exc:
            if time.monotonic() > deadline:
                say(f"lockstep: could not reach {address}: {exc}")
                sys.exit(1)
            time.sleep(0.2)


def accept_peer(server: socket.socket, deadline: float) -> tuple[int, socket.socket]:
    """The next peer that dials in with a proper hello (anything else, a port probe, is closed)."""
    while True:
        server.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            conn, _ = server.accept()
        except socket.timeout:
            say("lockstep: not every peer dialled in")
            sys.exit(1)
        conn.settimeout(5)
        try:
            magic, rank = HELLO.unpack(read_exactly(conn, HELLO.size))
        except (OSError, EOFError, struct.error):
            conn.close()
            continue
        if magic != MAGIC:
            conn.close()
            continue
        conn.settimeout(None)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return rank, conn


def read_exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))  # a late peer keeps the main thread here
        if not chunk:
            raise EOFError("the peer closed the connection")
        data += chunk
    return data


def read_frame(conn: socket.socket) -> tuple[int, float]:
    return FRAME.unpack(read_exactly(conn, FRAME.size))


def mesh(trainers: list[tuple[str, str]], rank: int, server: socket.socket, timeout: float) -> dict[str, socket.socket]:
    """A connection to every other trainer, (name, address) in rank order: dialled to those before
    ``rank``, accepted from those after."""
    deadline = time.monotonic() + timeout
    peers = {}
    names = [name for name, _ in trainers]
    for other, (_, address) in enumerate(trainers[:rank]):
        peers[names[other]] = dial(address, rank, deadline)
    while len(peers) < len(trainers) - 1:
        other, conn = accept_peer(server, deadline)
        if other <= rank or other >= len(names):
            conn.close()
            continue
        peers[names[other]] = conn
    return peers


def all_reduce(peers: dict[str, socket.socket], step: int, value: float) -> float:
    """The sum of ``value`` over every trainer: sent to each peer, then each peer's read."""
    frame = FRAME.pack(step, value)
    total = value
    for name, conn in peers.items():
        try:
            conn.sendall(frame)
        except OSError as exc:
            fail(name, exc)
    for name, conn in peers.items():
        try:
            their_step, theirs = read_frame(conn)
        except (OSError, EOFError) as exc:
            fail(name, exc)
        if their_step != step:
            say(f"lockstep: {name} is at step {their_step}, this task at {step}")
            sys.exit(1)
        total += theirs
    return total


def fail(peer: str, exc: BaseException) -> None:
    say(f"lockstep: the collective with {peer} failed: {exc}")
    time.sleep(PEER_LOST_EXIT)
    sys.exit(1)


def serve(address: str) -> None:
    """A server of a ParameterServer cluster: answers every frame it is sent until stopped."""
    server = listen(address)

    def answer(conn: socket.socket) -> None:
        with conn:
            try:
                while True:
                    step, value = read_frame(conn)
                    conn.sendall(FRAME.pack(step, value))
            except (OSError, EOFError):
                return

    while True:
        _, conn = accept_peer(server, time.monotonic() + 10**9)
        threading.Thread(target=answer, args=(conn,), daemon=True).start()
