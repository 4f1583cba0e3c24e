"""Nodes that join a run themselves: every node runs the same ``tflaunch --nnodes N --node-rank R
--rdzv-endpoint HOST:PORT`` and no ssh or scheduler reaches from one to another.

Node rank 0 owns the run. Its :class:`Rendezvous` listens at the endpoint with the connect-back
listener (:mod:`.connectback`): each other node starts the host agent on itself (:func:`join`),
which dials the endpoint, giving its rank as its name in the hello, and both ends prove that they
hold the run's token on the channel's own handshake; the token never crosses the wire. A stranger,
or a node of another run, fails the proof and costs only its own connection; it takes no rank.
The agent retries a name that does not resolve yet, and an endpoint that does not listen yet,
pausing longer each time, for the rendezvous timeout.

Once in, a node's agent is a link like any other: :class:`JoinedTransport` starts its tasks
through it, and a node whose agent goes silent or whose connection closes is a lost host. The
links outlive the run's transports by a moment: when the run has its exit code the owner tells
every node (:meth:`Rendezvous.finish`), whose tflaunch exits with it. Until then the endpoint stays
open to the nodes that joined: one that restarts (the platform's retry: its tflaunch started again
with the same rank) joins again, from its old address or a new one (a new pod's), its earlier link
ends as lost, and the run's next attempt starts its tasks there, at the address it came from
(:meth:`JoinedTransport.addresses`). Before that attempt a lost node is waited for at most
``--rdzv-rejoin-wait`` seconds, every lost node at once. The owner gone without saying it (killed)
closes each connection: each node's agent stops its tasks and exits with
:data:`~launcher.agent.protocol.LOST_RUN`. A joining node's own side is :mod:`.nodeagent`.
"""

from __future__ import annotations

import fcntl
import math
import os
import select
import socket
import termios
import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

from ..agent.protocol import EOF_GRACE, Command, beat_for
from ..cluster.plan import TaskLaunch
from ..cluster.spec import DEFAULT_KEEPALIVE_TIMEOUT
from ..options import DEFAULT_REJOIN_WAIT
from .backend import AgentBackend
from .carriers import Carrier, NodeCarrier
from .connectback import ConnectBack
from .hostlink import AgentLink
from .linkhub import HUB

KIND = "joined"
END_WAIT = EOF_GRACE + 1.0  # for a node's agent to close its channel once it has the run's exit code


@dataclass
class _Nodes:
    """The joined nodes of this process's run (one rendezvous per process), shared by the rendezvous,
    which fills it, and the transport, which starts tasks through it."""

    links: dict[str, AgentLink] = field(default_factory=dict)  # by host (node_host)
    addresses: dict[str, str] = field(default_factory=dict)  # by host: where its tasks are reached now
    give_up: dict[str, float] = field(default_factory=dict)  # a node whose link is gone: when its wait ends
    rejoin_wait: float = DEFAULT_REJOIN_WAIT
    changed: threading.Condition = field(default_factory=threading.Condition)  # a node joined (again)


_NODES = _Nodes()


def node_host(rank: int) -> str:
    """How the run names a joined node's host (its tasks' address is the one it connected from),
    so that two nodes behind one address are still two hosts."""
    return f"rank-{rank}"


class JoinedCarrier(NodeCarrier):
    """A node's agent that joined the run over its own connection."""

    kind = KIND

    def __init__(self, host: str, rank: int):
        super().__init__(host, f"node {rank}", host)
        self.rank = rank


@dataclass(frozen=True)
class Member:
    """A node that is there: its rank and the address its tasks are reached at."""

    rank: int
    address: str


class RendezvousMissing(Exception):
    """Nodes that did not join within the rendezvous timeout, by rank (with fewer than the minimum in)."""

    def __init__(self, ranks: list[int], within: float, short: str = ""):
        self.ranks = ranks
        self.within = within
        super().__init__(f"node rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} did not join "
                         f"within --rdzv-timeout {within:g} s{short}")


class Rendezvous:
    """The owner's side: the listener at the endpoint, and the nodes that joined it."""

    def __init__(self, nnodes: int, token: str, host: str, port: int, within: float,
                 keepalive: float = DEFAULT_KEEPALIVE_TIMEOUT, spares: int = 0, minimum: int | None = None,
                 rejoin_wait: float = DEFAULT_REJOIN_WAIT, first: int = 1, names: Callable[[int], str] = node_host,
                 carrier: Callable[[str, int], Carrier] = JoinedCarrier):
        self.first = first  # the lowest rank that joins: 1 when rank 0 is this machine, 0 when none is (Ray)
        self.names = names  # each rank's host in the run
        self.carrier = carrier  # each rank's carrier, from its address and rank
        self.nnodes = nnodes
        self.minimum = nnodes if minimum is None else minimum  # --nnodes MIN:MAX: the run starts with MIN
        self.spares = spares  # ranks nnodes .. nnodes + spares - 1: spare nodes
        self.token = token
        self.host, self.port = host, port
        self.within = within
        self.keepalive = keepalive
        self.members: dict[int, Member] = {}
        self.links: dict[int, AgentLink] = {}
        self._done = threading.Event()
        self._missing: list[int] = []
        self._again: ConnectBack | None = None  # the endpoint kept open for nodes that restart
        self._lock = threading.Lock()  # members and links: the listener's thread adds to them
        self._listener: ConnectBack | None = None
        with _NODES.changed:
            _NODES.rejoin_wait = rejoin_wait

    def listen(self) -> int:
        """Open the endpoint now (before the nodes are told where it is); the port it listens on."""
        if self._listener is None:
            self._listener = ConnectBack([str(rank) for rank in range(self.first, self.nnodes + self.spares)],
                                         self.token, self._deliver, self.host, within=self.within, port=self.port,
                                         missing=self._note_missing)
            self.port = self._listener.port
        return self.port

    def gather(self) -> list[Member]:
        """Every other node, by rank, once all have joined (spares too); RendezvousMissing names the
        nodes (not spares) that did not within the timeout. A spare that did not is left out."""
        if self.first >= self.nnodes + self.spares or self._done.is_set():
            return [self.members[rank] for rank in sorted(self.members)]
        self.listen()
        listener, self._listener = self._listener, None
        try:
            listener.start()
            self._done.wait()
        finally:
            listener.close()
        needed = [rank for rank in self._missing if rank < self.nnodes]
        if needed and self.first + sum(1 for rank in self.members if rank < self.nnodes) < self.minimum:
            self._done.clear()
            short = f" (the run needs at least {self.minimum} nodes)" if self.minimum < self.nnodes else ""
            raise RendezvousMissing(needed, self.within, short)
        self._listen_again()
        return [self.members[rank] for rank in sorted(self.members)]

    def _listen_again(self) -> None:
        """Keep the endpoint open, for the run, to the ranks that joined (see :meth:`_rejoin`)."""
        if self._again is None and self.members:
            self._again = ConnectBack([str(rank) for rank in sorted(self.members)], self.token, self._rejoin,
                                      self.host, within=math.inf, port=self.port, keep=True)
            self._again.start()

    @property
    def spares_missing(self) -> list[int]:
        """The spare ranks that had not joined when the rendezvous closed."""
        return [rank for rank in self._missing if rank >= self.nnodes]

    def _note_missing(self, names: list[str]) -> None:
        self._missing = sorted(int(name) for name in names)
        self._done.set()

    def _deliver(self, name: str, fd: int) -> None:
        rank = int(name)
        self._admit(rank, _peer_address(fd), fd)
        if len(self.members) == self.nnodes + self.spares - self.first:
            self._done.set()

    def _rejoin(self, name: str, fd: int) -> None:
        """A node that joined comes again: it restarted, so whatever its earlier link still
        carries is gone with it. It may come from another address (the platform gave the node a
        new one): the next attempt's plan puts its tasks there (:meth:`JoinedTransport.addresses`)."""
        rank, address = int(name), _peer_address(fd)
        with self._lock:
            earlier = self.links.get(rank)
        if earlier is not None:
            earlier.lose(f"node {rank} joined the run again: it restarted")
            earlier.close_channel()
        self._admit(rank, address, fd)

    def _admit(self, rank: int, address: str, fd: int) -> None:
        link = AgentLink(self.names(rank), self.carrier(address, rank), None, None, keepalive=self.keepalive, hub=HUB,
                         beat=beat_for(self.nnodes, self.keepalive))
        link.attach(fd, fd)
        with self._lock:
            self.members[rank] = Member(rank, address)
            self.links[rank] = link
        with _NODES.changed:
            _NODES.links[self.names(rank)] = link
            _NODES.addresses[self.names(rank)] = address
            _NODES.give_up.pop(self.names(rank), None)
            _NODES.changed.notify_all()

    def finish(self, code: int) -> None:
        """Tell every node the run's exit code and end its channel: its agent exits with that code.

        The channel's write side is shut after the code, and kept open until the agent has closed
        its end and the link has read all it said (within :data:`END_WAIT`): a socket closed with
        bytes it has not read resets the connection, and the agent would lose the code with them (a
        ``--dry-run`` ends before the agents' first frames are read)."""
        for listener in (self._again, self._listener):
            if listener is not None:
                listener.close()
        self._listener = None
        with self._lock:
            links = [link for link in self.links.values() if not link.gone]
        channels = []
        for link in links:
            try:
                link.send(f"{Command.END} 0 {max(0, min(255, code))}\n".encode())
                channel = socket.socket(fileno=os.dup(link.write_fd))  # open until the agent's end is read
            except (OSError, TypeError):  # gone meanwhile (TypeError: its descriptor already let go)
                continue
            channels.append(channel)
            try:
                channel.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        deadline = time.monotonic() + END_WAIT
        while channels and time.monotonic() < deadline:
            ended = [channel for channel in channels if _read_to_the_end(channel)]
            for channel in ended:
                channel.close()
            channels = [channel for channel in channels if channel not in ended]
            if channels:
                time.sleep(0.02)
        for channel in channels:
            channel.close()
        for link in links:
            link.close_channel()
        with _NODES.changed:
            for member in self.members.values():
                for known in (_NODES.links, _NODES.addresses, _NODES.give_up):
                    known.pop(self.names(member.rank), None)


def _read_to_the_end(channel: socket.socket) -> bool:
    """Whether the node closed its end of ``channel`` and every byte it sent has been read."""
    poller = select.poll()
    poller.register(channel, select.POLLRDHUP)
    if not poller.poll(0):
        return False
    return fcntl.ioctl(channel, termios.FIONREAD, bytes(4)) == bytes(4)


def _peer_address(fd: int) -> str:
    with socket.socket(fileno=os.dup(fd)) as peer:
        return peer.getpeername()[0]


class JoinedTransport(AgentBackend):
    """Starts tasks on the nodes that joined, through the agent each brought."""

    kind = KIND

    def prepare(self, launches: Sequence[TaskLaunch]) -> None:
        """As every backend; a node whose link is gone is waited for (it may be restarting) at most
        ``--rdzv-rejoin-wait`` seconds from now, every such node at once, not one after another."""
        with _NODES.changed:
            give_up = time.monotonic() + _NODES.rejoin_wait
            for launch in self.mine(launches):
                link = _NODES.links.get(launch.host)
                if link is not None and link.gone:
                    _NODES.give_up.setdefault(launch.host, give_up)
        super().prepare(launches)

    def connect(self, launch: TaskLaunch) -> AgentLink:
        """The node's link; for a node whose link is gone, the one it brings when it joins again
        (it restarted) within ``--rdzv-rejoin-wait``, waited for once per absence."""
        with _NODES.changed:
            give_up = _NODES.give_up.setdefault(launch.host, time.monotonic() + _NODES.rejoin_wait)
            while (link := _NODES.links.get(launch.host)) is not None and link.gone and time.monotonic() < give_up:
                _NODES.changed.wait(give_up - time.monotonic())
            if link is None or link.gone:
                raise OSError(f"on {launch.host}: the node is not in the run (it left, and did not join again "
                              f"within --rdzv-rejoin-wait {_NODES.rejoin_wait:g} s)")
            _NODES.give_up.pop(launch.host, None)
            return link

    def addresses(self) -> Mapping[str, str]:
        """Where each joined node's tasks are reached now: the address it last joined from."""
        with _NODES.changed:
            return dict(_NODES.addresses)

    def cannot_connect(self, exc: OSError) -> str:
        return f"cannot start: {exc}"

    def host_key(self, launch: TaskLaunch) -> Hashable:
        return launch.host

    def close(self) -> None:
        """The links stay the rendezvous's, which closes them with the run's exit code; the
        transport only lets them go."""
        self.links = {}
        self.logs.close()
