"""tflaunch's end of one host agent (:mod:`launcher.agent`): the link that carries its commands and frames.

An :class:`AgentLink` is one agent and its channel: the commands tflaunch writes (buffered, so a
busy agent never blocks the supervisor), the frames it reads (cut from the channel's reads by
:mod:`.framing`, then sorted into each process's log, status and stacks), and the keep-alive each
way: a heartbeat every ``beat`` seconds without another command (``beat`` grows with the run's
hosts, see :func:`launcher.agent.protocol.beat_for`), and a peer silent for ``keepalive`` seconds is lost. A
TensorFlow cluster goes to the agent once per link (a ``CLUSTER`` command), however many of its
tasks see it: each task's start names it. How the channel is carried (a local pipe, one ssh
connection, a connection back from a Slurm step) is a :class:`Carrier`, which also says what a lost
channel means for the processes on it (:mod:`.carriers`).

Every fact of the protocol (frame header, kinds and size limit, sync mark, verbs, status words,
field codec, heartbeat) is the agent module's, imported from it. Bytes that break it end this
link alone, at once, with one line saying what was read; the exits already reported stand, the
other processes on the link are lost. All links share one thread (:mod:`.linkhub`); the
processes started through a link are :mod:`.proxies`. A link, its hub and its processes are that
one I/O thread's objects and refer to each other, so these three modules import each other's types.
"""

from __future__ import annotations

import base64
import itertools
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Callable

from ..agent.protocol import HEARTBEAT, MAX_FRAME, Command, Frame, Status, encode_fields, printable, write_some
from ..cluster.tfconfig import TfConfig
from ..records.trace import bound, run_trace, tracer
from .base import Reading
from .carriers import Carrier
from .framing import FrameReader, ProtocolError
from .readingsframe import parse_readings, well_formed

if TYPE_CHECKING:
    from .linkhub import LinkHub
    from .proxies import AgentProcessBase

# From the connection to the agent's first bytes: the host's setup line runs before the agent, and
# its output goes to the agent, not over the channel, so a long setup is silent (ssh's own
# ServerAlive probes watch the connection meanwhile).
START_WITHIN = 120.0
HOST_OUTPUT_KEPT = 1 << 16  # what a host said outside any task, kept for the tasks that start later
# Bytes asked of a channel per read, into the hub's one buffer (reused, so no read maps fresh memory):
# a flooding agent's channel holds many frames (up to CHUNK of output each), read in one go.
READ_SIZE = 1 << 20
_IDS = itertools.count(1)  # ids of processes and requests, unique in this tflaunch
_KINDS = frozenset(Frame.OF_HOST + Frame.OF_REQUEST)
_KIND_NAMES = {kind: word.lower() for word, kind in vars(Frame).items() if isinstance(kind, bytes)}  # for the trace
log = tracer("hostlink")


class AgentLink:
    """One host's agent, as tflaunch sees it."""

    def __init__(self, host: str, carrier: Carrier, read_fd: int | None, write_fd: int | None,
                 keepalive: float, hub: "LinkHub", attach_within: float | None = None, beat: float = HEARTBEAT,
                 preamble: bytes = b""):
        """``read_fd``/``write_fd`` None: the channel arrives later (:meth:`attach`), within
        ``attach_within`` seconds or the link is lost. ``beat``: the seconds between heartbeats
        both ways, as the agent was told. ``preamble``: what the channel carries before any
        command (the agent itself, for one that reads it from its stdin)."""
        self.host = host
        self.carrier = carrier
        self.read_fd = read_fd
        self.write_fd = write_fd
        self.keepalive = keepalive
        self.beat = beat
        self.hub = hub
        # What the host said outside any task: the login shell before the agent's sync mark, the
        # setup line (relayed by the agent). Each task's log starts with it.
        self.host_output = bytearray()
        self.lost_reason: str | None = None
        self.closed = False
        self.last_heard = time.monotonic()  # the last whole frame (or the connection's start)
        self.attach_within = attach_within
        self.attach_by = None if attach_within is None else time.monotonic() + attach_within
        # The newest readings frame (payload, time.time() it came), and its parse (see :meth:`reading`).
        self._newest: tuple[bytes, float] | None = None
        self._parsed: tuple[tuple[bytes, float] | None, dict[int, Reading]] = (None, {})
        self._processes: dict[int, AgentProcessBase] = {}
        self._lock = threading.Lock()
        self._out = bytearray(preamble)  # written by the hub once it has the link
        self.frames = FrameReader(self._valid, self._dispatch, self._host_said)  # what the agent sends
        self._last_id = 0  # the newest id given in a command: the agent can speak of no later one
        self._ports: dict[int, tuple[threading.Event, list]] = {}  # request id -> (answered, answer)
        self._clusters: dict[str, int] = {}  # a cluster's JSON text -> the id it was sent under
        self._starting = threading.Lock()  # a cluster goes out before the first start that names it
        self.last_sent = time.monotonic()  # the last command queued: a heartbeat is due a beat later
        self.frame_counts: dict[bytes, int] = {}  # frames read, by kind: the trace's account of the link
        self._end_traced = False
        self.trace = run_trace()  # the link's run: the links' thread traces it to that run's debug.log
        self.log = bound(log, self.trace)
        self.log.debug("%s: link over %s made (channel %s, keep-alive %g s, beat %g s)", host,
                       getattr(carrier, "kind", None), "open" if read_fd is not None else "to come", keepalive, beat)
        hub.add(self)

    # -- commands -------------------------------------------------------------------------

    @property
    def gone(self) -> bool:
        """Whether this link can carry nothing more, so the host's agent must be dialled again:
        lost, closed, or its carrier (the local agent, ssh, the job step) ended. The last is read
        here, not waited for from the hub's thread, which may not have seen the end yet: a Slurm
        step killed for one silent node ends every other node's agent in it too, and the check
        before a restart must not probe a spare through the step that just died."""
        return self.lost_reason is not None or self.closed or self.carrier.ended() is not None

    def new_id(self) -> int:
        """An id for a process or a request on this link."""
        with self._lock:
            self._last_id = next(_IDS)
            return self._last_id

    def start(self, process: "AgentProcessBase", fields: dict[str, object]) -> None:
        """Start ``process`` on the agent; a ``tf_config`` field that is a :class:`TfConfig` is sent
        as its parts, its cluster once per link. ValueError (from :func:`encode_fields`, before
        anything is sent for it) when the fields cannot be sent."""
        with self._starting:
            tf_config = fields.get("tf_config")
            if isinstance(tf_config, TfConfig):
                fields = {**fields, "tf_config": f"{self._cluster_id(tf_config.cluster)} {tf_config.role} "
                                                 f"{tf_config.index}"}
            line = f"{Command.START} {process.id} {encode_fields(fields)}\n".encode()
            with self._lock:
                self._processes[process.id] = process
            if self.lost_reason is not None:
                process.lose(self.carrier, self.lost_reason, started=False)
                self.hub.changes.add(process)
                return
            self.send(line)

    def _cluster_id(self, cluster: str) -> int:
        ident = self._clusters.get(cluster)
        if ident is None:
            ident = self._clusters[cluster] = self.new_id()
            self.send(f"{Command.CLUSTER} {ident} {base64.b64encode(cluster.encode()).decode()}\n".encode())
        return ident

    def send(self, data: bytes) -> None:
        """Queue a command; written at once if the channel takes it, else by the hub's thread."""
        with self._lock:
            if self.closed or self.lost_reason is not None:
                return
            self.last_sent = time.monotonic()
            waiting = bool(self._out)
            self._out += data
            self._write_locked()
            blocked = not waiting and bool(self._out)
        if blocked:
            self.hub.update(self)  # the channel is full: the hub writes the rest when it drains

    def attach(self, read_fd: int, write_fd: int) -> None:
        """The channel arrived (a Slurm agent connected back): what was queued goes out now."""
        os.set_blocking(write_fd, False)
        self.log.debug("%s: its agent connected back", self.host)
        with self._lock:
            self.read_fd, self.write_fd = read_fd, write_fd
            self.last_heard = time.monotonic()
        self.hub.update(self)

    def pick_ports(self, count: int, timeout: float, stopped: Callable[[], bool] = lambda: False) -> list[int]:
        """``count`` free ports on the agent's host, held there until the tasks that use them start.

        Raises OSError naming the host when they cannot be had (the host is lost, or said why), or
        once ``stopped()`` says the run was stopped (a Ctrl-C while an agent is still on its way)."""
        ident = self.new_id()
        answered: tuple[threading.Event, list] = (threading.Event(), [])
        self._ports[ident] = answered
        self.send(f"{Command.PORTS} {ident} {count}\n".encode())
        deadline = time.monotonic() + timeout
        while not answered[0].wait(0.05):
            if self.lost_reason is not None:
                raise OSError(f"cannot pick ports on {self.host}: {self.lost_reason}")
            if stopped():
                raise OSError(f"cannot pick ports on {self.host}: the run was stopped first")
            if time.monotonic() > deadline:
                raise OSError(f"cannot pick ports on {self.host}: no answer from its agent within {timeout:g} s")
        text = answered[1][0]
        word, _, reason = text.partition(" ")
        if word == Status.ERROR:
            raise OSError(f"cannot pick ports on {self.host}: {reason}")
        return [int(port) for port in text.split()]

    def close(self, wait: float = 5.0) -> None:
        """End of the run: EOF to the agent (it stops whatever is left), then the carrier ends."""
        self.close_channel()
        self.carrier.close(wait)

    def close_channel(self) -> None:
        """EOF to the agent: it stops whatever is left of its processes and exits."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
        self._trace_end("closed by tflaunch")
        # The hub's thread closes the descriptors, between two polls: closed here, their numbers
        # could be handed to a new link's pipes while the hub still polls them for this link.
        self.hub.retire(self)
        for process in list(self._processes.values()):
            if process.status is None:
                process.lose(self.carrier, "tflaunch closed the channel", started=process.started)
                self.hub.changes.add(process)

    # -- the hub's side ---------------------------------------------------------------------

    def release_descriptors(self) -> None:
        """Close the channel's descriptors and the carrier's stderr (the hub's thread only, once
        nothing polls them)."""
        for fd in {self.read_fd, self.write_fd}:
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.carrier.release()

    def wants_write(self) -> bool:
        return bool(self._out) and self.write_fd is not None and not self.closed

    def write_pending(self) -> None:
        with self._lock:
            self._write_locked()

    def _write_locked(self) -> None:
        while self._out and self.write_fd is not None and not self.closed:
            sent = write_some(self.write_fd, self._out)
            if sent is None:
                self._out.clear()  # the channel is gone: reading says how
                return
            if not sent:
                return
            del self._out[:sent]

    def read_ready(self, buffer: bytearray) -> None:
        """Read what the channel holds into ``buffer`` (the hub's, reused for every read of every
        link) and act on each whole frame in it."""
        if self.closed or self.lost_reason is not None:
            self.hub.remove(self)  # a lost link reads nothing more (a channel attached too late, say)
            return
        try:
            count = os.readv(self.read_fd, [buffer])
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            count = 0  # a broken channel ends as EOF does
        if not count:
            self.hub.remove(self)
            self.hub.watch_end(self)
            return
        synced = self.frames.synced
        with memoryview(buffer) as view:
            try:
                self.frames.feed(view[:count])
            except ProtocolError as exc:
                self.end(f"protocol error: {exc}")
                return
        if not synced and self.frames.synced:
            self.last_heard = time.monotonic()  # the agent has started
            self.log.debug("%s: its agent started (the sync mark read)", self.host)

    def _valid(self, kind: bytes, ident: int, length: int) -> bool:
        if kind not in _KINDS or length > MAX_FRAME:
            return False
        if kind in Frame.OF_HOST:
            return ident == 0
        return 0 < ident <= self._last_id

    def _host_said(self, data: bytes) -> None:
        room = HOST_OUTPUT_KEPT - len(self.host_output)
        if room > 0:
            self.host_output += data[:room]

    def _dispatch(self, kind: bytes, ident: int, payload: memoryview) -> None:
        """Act on one whole frame. An output frame's payload goes on as the view it is, into the
        read's buffer: its process uses it before this returns (see ``AgentProcessBase.output``)."""
        self.last_heard = time.monotonic()  # a whole frame: the agent lives
        self.frame_counts[kind] = self.frame_counts.get(kind, 0) + 1
        if kind != Frame.OUTPUT:
            payload = bytes(payload)
        if kind == Frame.HEARTBEAT:
            return
        if kind == Frame.SETUP:  # the setup line, or a job it left running: each running task's log gets it
            self._host_said(payload)
            with self._lock:
                processes = list(self._processes.values())
            for process in processes:
                if process.started and process.status is None:
                    process.host_said(payload)
            return
        if kind == Frame.PORTS:
            waiting = self._ports.pop(ident, None)
            if waiting is not None:
                waiting[1].append(payload.decode("utf-8", "replace"))
                waiting[0].set()
            return
        if kind == Frame.READINGS:
            self._readings(payload)
            return
        process = self._processes.get(ident)
        if process is None:
            return
        if kind == Frame.OUTPUT:
            process.output(payload)
        elif kind == Frame.STATUS:
            if not process.status_line(payload.decode("utf-8", "replace")):
                raise ProtocolError(f"read the status {printable(payload)}, which is none of the agent's")
            self.hub.changes.add(process)
            if process.status is not None:
                with self._lock:
                    self._processes.pop(ident, None)
        elif kind == Frame.STACKS:
            process.stacks(payload.decode("utf-8", "replace"))

    def _readings(self, payload: bytes) -> None:
        """Keep the frame whole, checked but not parsed: the hub wakes for each host's frame, and
        parsing it there, line by line, cost more than everything else the hub does; whoever asks
        for a reading (:meth:`reading`) parses the newest frame once for all its processes."""
        if not well_formed(payload):
            raise ProtocolError(f"read the readings {printable(payload)}, which are none of the agent's")
        self._newest = (payload, time.time())

    def reading(self, ident: int) -> Reading | None:
        """The newest resource reading of process ``ident`` (any thread), None while there is none."""
        newest = self._newest  # replaced whole by the hub's thread, so read once
        if newest is None:
            return None
        parsed = self._parsed
        if parsed[0] is not newest:
            # Two threads at once parse it twice, alike.
            parsed = self._parsed = (newest, parse_readings(*newest, self._processes))
        return parsed[1].get(ident)

    def heartbeat(self, now: float) -> None:
        if self.lost_reason is not None or self.closed:
            return
        if self.read_fd is None:
            if self.carrier.ended() is not None:
                self.lose()
            elif self.attach_by is not None and now > self.attach_by:
                self.lose(f"its agent did not connect back to tflaunch within {self.attach_within:g} s")
            return
        limit = self.keepalive if self.frames.synced else max(self.keepalive, START_WITHIN)
        if now - self.last_heard > limit:
            self.hub.remove(self)
            self.carrier.close(0.0)  # a wedged or unreachable agent: end our side of it
            if self.frames.synced:
                self.lose(f"no word from its agent within the {self.keepalive:g} s keep-alive timeout")
            else:
                self.lose(f"its agent did not start within {limit:g} s (is the host's setup line still running?)")
            return
        # The hub looks once a second: half of that is the slack that keeps a 1 s beat at 1 s.
        if now - self.last_sent >= self.beat - HEARTBEAT / 2:
            self.send(b"\n")

    def end(self, detail: str) -> None:
        """This link cannot go on: its processes without an exit are lost with ``detail``, and the
        agent gets EOF, so it stops them on its host."""
        self.hub.remove(self)
        self.frames.pending.clear()
        self.lose(detail)
        self.close_channel()

    def lose(self, detail: str | None = None) -> None:
        """The channel ended: every process on it that has not reported its exit ends as lost."""
        if self.lost_reason is not None or self.closed:
            return
        detail = detail or self.carrier.detail() or self._ended_text()
        self.lost_reason = detail
        self._trace_end("lost", detail)
        with self._lock:
            processes = list(self._processes.values())
            self._processes.clear()
        for process in processes:
            if process.status is None:
                process.lose(self.carrier, detail, started=process.started)
                self.hub.changes.add(process)

    def _trace_end(self, how: str, detail: str = "") -> None:
        """The link's end in the trace, once: how, and how many frames of each kind it read."""
        if self.log.isEnabledFor(logging.DEBUG) and not self._end_traced:
            self._end_traced = True
            self.log.debug("%s: link %s%s%s; frames read: %s", self.host, how, ": " if detail else "", detail,
                           {_KIND_NAMES.get(kind, kind): count for kind, count in sorted(self.frame_counts.items())})

    def _ended_text(self) -> str:
        code = self.carrier.ended()
        if code is None:
            return f"the connection to {self.host} closed"
        return f"{self.carrier.kind} was killed by signal {-code}" if code < 0 else f"{self.carrier.kind} exited with {code}"
