"""tflaunch's end of the host agents (:mod:`.hostagent`): one link per host, one I/O thread for all.

An :class:`AgentLink` is one agent and its channel: the commands tflaunch writes (buffered, so a
busy agent never blocks the supervisor), the frames it reads (sorted into each process's log,
status and stacks), and a heartbeat each way. How the channel is carried (a local pipe, one ssh
connection, a connection back from a Slurm step) is a :class:`Carrier`, which also says what a
lost channel means for the processes on it. An :class:`AgentTask` is one task started through a
link, seen through the one process interface (:class:`.base.TaskProcess`); an
:class:`AgentHelper` is a short-lived helper (a preflight probe) with its output kept in memory.

All links share one thread (:class:`LinkHub`), so a run costs one thread, whatever its size.
"""

from __future__ import annotations

import base64
import functools
import itertools
import os
import select
import signal
import struct
import subprocess
import threading
import time
import zlib
from collections import OrderedDict
from pathlib import Path
from typing import Callable

from .base import CANNOT_START, ExitStatus, Reading

AGENT_PATH = Path(__file__).with_name("hostagent.py")
AGENT_SOURCE = AGENT_PATH.read_text()
HEADER = struct.Struct(">cII")
SYNC = b"\0TFLAUNCH-AGENT-1\0"  # the agent's first bytes (see hostagent.SYNC)
HEARTBEAT_INTERVAL = 1.0
KILL_BACKSTOP = 3.0  # after KILL, seconds before tflaunch kills a local task's group itself
OPEN_LOGS = 16  # log files of relayed tasks kept open at once; the others are reopened on output
_IDS = itertools.count(1)


# The agent on a host that has only a Python: its bytecode, which the host runs without compiling
# when its Python reads this one's bytecode (the same magic number), else its source. Both travel
# compressed on the command line; the agent's own spec follows them.
_REMOTE_BOOT = """import binascii, sys, zlib
code, source = sys.argv.pop(1), sys.argv.pop(1)
magic = getattr(sys.modules.get("_frozen_importlib_external"), "MAGIC_NUMBER", b"")
if binascii.hexlify(magic).decode() == %r:
    import marshal
    code = marshal.loads(zlib.decompress(binascii.a2b_base64(code)))
else:
    code = compile(zlib.decompress(binascii.a2b_base64(source)), "tflaunch-agent", "exec")
del source, magic
exec(code)
"""


def remote_agent_argv(python: str, magic: bytes | None = None) -> list[str]:
    """The command line that runs the agent with ``python`` on any host; the caller appends the spec.

    -I -S: the agent needs only the standard library; skipping site and the user's paths saves
    start-up on every host, and keeps a PYTHONPATH meant for the tasks from shadowing a module the
    agent uses. ``magic`` is the bytecode version the shipped bytecode claims (this Python's, by default)."""
    packed_code, packed_source, own_magic = _packed_agent()
    boot = _REMOTE_BOOT % (own_magic if magic is None else magic).hex()
    return [python, "-I", "-S", "-c", boot, packed_code, packed_source]


@functools.lru_cache(maxsize=None)
def _packed_agent() -> tuple[str, str, bytes]:
    """(bytecode, source, magic number): the bytecode comes from Python's own cache of the agent
    module when it is fresh, so a run does not compile the agent either."""
    import marshal
    from importlib.machinery import SourceFileLoader
    from importlib.util import MAGIC_NUMBER

    code = SourceFileLoader("hostagent", str(AGENT_PATH)).get_code("hostagent")

    def pack(data: bytes) -> str:
        return base64.b64encode(zlib.compress(data, 9)).decode("ascii")

    return pack(marshal.dumps(code)), pack(AGENT_SOURCE.encode()), MAGIC_NUMBER


def encode_fields(pairs: dict[str, object]) -> str:
    """The agent's field format (:func:`.hostagent.decode_fields`), base64 so no shell reads it."""
    tokens: list[str] = []
    for key, value in pairs.items():
        if value is None:
            continue
        if key == "argv":
            tokens += [key, str(len(value)), *value]  # type: ignore[arg-type]
        elif key == "env":
            items = [x for item in value.items() for x in item]  # type: ignore[union-attr]
            tokens += [key, str(len(items)), *items]
        else:
            tokens += [key, str(value)]
    if any("\0" in token for token in tokens):
        raise ValueError("an argument or environment value contains a NUL character")
    return base64.b64encode("\0".join(tokens).encode()).decode()


class Carrier:
    """How a link's channel is carried; subclasses word the link's failures."""

    kind = "agent"

    def __init__(self, host: str):
        self.host = host

    def ended(self) -> int | None:
        """The carrier process's exit code once it ended (None while it runs or has none)."""
        return None

    def detail(self) -> str | None:
        """The carrier's own last message (ssh's, srun's), if any."""
        return None

    def close(self, wait: float) -> None:
        """End the carrier: its channel is closed already, so the agent stops what is left."""

    def where(self, reason: str) -> str:
        """An agent's reason for not starting a process, naming the host where that says more."""
        return f"{reason} on {self.host}"

    def not_started(self, detail: str) -> ExitStatus:
        return ExitStatus(error=f"could not start on {self.host} ({detail})")

    def lost(self, detail: str) -> ExitStatus:
        return ExitStatus(error=f"lost the agent on {self.host} ({detail})")

    def extra_backstop(self, pid: int | None) -> None:
        """A task ignored KILL: what tflaunch itself can still do about it."""


class ProcessCarrier(Carrier):
    """A carrier that is a child process of tflaunch (the local agent, an ssh client) with its own
    messages in a file."""

    def __init__(self, host: str, popen, stderr):
        super().__init__(host)
        self.popen = popen
        self.stderr = stderr

    def ended(self) -> int | None:
        return self.popen.poll()

    def detail(self) -> str | None:
        self.stderr.seek(0)
        lines = [line for line in self.stderr.read().decode("utf-8", "replace").splitlines() if line.strip()]
        return lines[-1].strip() if lines else None

    def close(self, wait: float) -> None:
        """Wait for the process to end (its channel is closed already); kill it if it does not."""
        try:
            self.popen.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            self.popen.kill()  # an ssh client: the connection closes and the agent sees EOF
            self.popen.wait()


class AgentLink:
    """One host's agent, as tflaunch sees it."""

    def __init__(self, host: str, carrier: Carrier, read_fd: int | None, write_fd: int | None,
                 keepalive: float, hub: "LinkHub", attach_within: float | None = None):
        """``read_fd``/``write_fd`` None: the channel arrives later (:meth:`attach`), within
        ``attach_within`` seconds or the link is lost."""
        self.host = host
        self.carrier = carrier
        self.read_fd = read_fd
        self.write_fd = write_fd
        self.keepalive = keepalive
        self.hub = hub
        self.preamble = b""  # what the remote shell and the host's setup printed before the agent ran
        self._synced = False
        self.lost_reason: str | None = None
        self.closed = False
        self.last_heard = time.monotonic()
        self.attach_within = attach_within
        self.attach_by = None if attach_within is None else time.monotonic() + attach_within
        self.readings: dict[int, Reading] = {}  # process id -> its newest resource reading
        self._processes: dict[int, AgentProcessBase] = {}
        self._lock = threading.Lock()
        self._out = bytearray()
        self._in = bytearray()
        self._ports: dict[int, tuple[threading.Event, list]] = {}  # request id -> (answered, answer)
        hub.add(self)

    # -- commands -------------------------------------------------------------------------

    def start(self, process: "AgentProcessBase", fields: dict[str, object]) -> None:
        with self._lock:
            self._processes[process.id] = process
        if self.lost_reason is not None:
            process.lose(self.carrier, self.lost_reason, started=False)
            return
        self.send(f"START {process.id} {encode_fields(fields)}\n".encode())

    def send(self, data: bytes) -> None:
        """Queue a command; written at once if the channel takes it, else by the hub's thread."""
        with self._lock:
            if self.closed or self.lost_reason is not None:
                return
            self._out += data
            self._write_locked()
        if self._out:
            self.hub.wake()

    def attach(self, read_fd: int, write_fd: int) -> None:
        """The channel arrived (a Slurm agent connected back): what was queued goes out now."""
        set_nonblocking(write_fd)
        with self._lock:
            self.read_fd, self.write_fd = read_fd, write_fd
            self.last_heard = time.monotonic()
        self.hub.wake()

    def pick_ports(self, count: int, timeout: float) -> list[int]:
        """``count`` free ports on the agent's host, held there until the tasks that use them start.

        Raises OSError naming the host when they cannot be had (the host is lost, or said why)."""
        ident = next(_IDS)
        answered: tuple[threading.Event, list] = (threading.Event(), [])
        self._ports[ident] = answered
        self.send(f"PORTS {ident} {count}\n".encode())
        deadline = time.monotonic() + timeout
        while not answered[0].wait(0.05):
            if self.lost_reason is not None:
                raise OSError(f"cannot pick ports on {self.host}: {self.lost_reason}")
            if time.monotonic() > deadline:
                raise OSError(f"cannot pick ports on {self.host}: no answer from its agent within {timeout:g} s")
        text = answered[1][0]
        if text.startswith("error "):
            raise OSError(f"cannot pick ports on {self.host}: {text[6:]}")
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
        # The hub's thread closes the descriptors, between two polls: closed here, their numbers
        # could be handed to a new link's pipes while the hub still polls them for this link.
        self.hub.retire(self)
        for process in list(self._processes.values()):
            if process.status is None:
                process.lose(self.carrier, "tflaunch closed the channel", started=process.started)

    # -- the hub's side ---------------------------------------------------------------------

    def release_descriptors(self) -> None:
        """Close the channel's descriptors (the hub's thread only, once nothing polls them)."""
        for fd in {self.read_fd, self.write_fd}:
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass

    def wants_write(self) -> bool:
        return bool(self._out) and self.write_fd is not None and not self.closed

    def write_pending(self) -> None:
        with self._lock:
            self._write_locked()

    def _write_locked(self) -> None:
        while self._out and self.write_fd is not None and not self.closed:
            try:
                sent = os.write(self.write_fd, self._out)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._out.clear()  # the channel is gone: reading says how
                return
            del self._out[:sent]

    def read_ready(self) -> None:
        if self.closed:
            return
        try:
            chunk = os.read(self.read_fd, 1 << 20)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.hub.remove(self)
            self.hub.watch_end(self)
            return
        self.last_heard = time.monotonic()
        self._in += chunk
        self._frames()

    def _frames(self) -> None:
        if not self._synced:
            mark = self._in.find(SYNC)
            if mark < 0:
                keep = len(SYNC) - 1  # the mark may be cut between two reads
                if len(self._in) > keep:
                    self.preamble += bytes(self._in[:-keep])
                    del self._in[:-keep]
                return
            self.preamble += bytes(self._in[:mark])
            del self._in[:mark + len(SYNC)]
            self._synced = True
        data, offset, size = self._in, 0, len(self._in)
        while size - offset >= HEADER.size:
            kind, ident, length = HEADER.unpack_from(data, offset)
            if size - offset - HEADER.size < length:
                break
            start = offset + HEADER.size
            payload = bytes(data[start:start + length])
            offset = start + length
            self._dispatch(kind, ident, payload)
        del data[:offset]

    def _dispatch(self, kind: bytes, ident: int, payload: bytes) -> None:
        if kind == b"H":
            return
        if kind == b"P":
            waiting = self._ports.pop(ident, None)
            if waiting is not None:
                waiting[1].append(payload.decode())
                waiting[0].set()
            return
        if kind == b"R":
            now = time.time()
            for line in payload.decode().splitlines():
                number, rss, cpu, count = line.split()
                process = self._processes.get(int(number))
                if process is not None:
                    self.readings[process.id] = Reading(process.pid, int(rss), float(cpu), int(count), now)
            return
        process = self._processes.get(ident)
        if process is None:
            return
        if kind == b"O":
            process.output(payload)
        elif kind == b"S":
            process.status_line(payload.decode("utf-8", "replace"))
            if process.status is not None:
                with self._lock:
                    self._processes.pop(ident, None)
                self.readings.pop(ident, None)
        elif kind == b"D":
            process.stacks(payload.decode("utf-8", "replace"))

    def heartbeat(self, now: float) -> None:
        if self.read_fd is None and self.lost_reason is None and not self.closed:
            if self.carrier.ended() is not None:
                self.lose()
            elif self.attach_by is not None and now > self.attach_by:
                self.lose(f"its agent did not connect back to tflaunch within {self.attach_within:g} s")
            return
        if self.lost_reason is None and not self.closed:
            if self.read_fd is not None and now - self.last_heard > self.keepalive:
                self.hub.remove(self)
                self.carrier.close(0.0)  # a wedged or unreachable agent: end our side of it
                self.lose(f"no word from its agent within the {self.keepalive:g} s keep-alive timeout")
                return
            self.send(b"\n")

    def lose(self, detail: str | None = None) -> None:
        """The channel ended: every process on it that has not reported its exit ends as lost."""
        if self.lost_reason is not None or self.closed:
            return
        detail = detail or self.carrier.detail() or self._ended_text()
        self.lost_reason = detail
        with self._lock:
            processes = list(self._processes.values())
            self._processes.clear()
        for process in processes:
            if process.status is None:
                process.lose(self.carrier, detail, started=process.started)

    def _ended_text(self) -> str:
        code = self.carrier.ended()
        if code is None:
            return f"the connection to {self.host} closed"
        return f"{self.carrier.kind} was killed by signal {-code}" if code < 0 else f"{self.carrier.kind} exited with {code}"


class AgentProcessBase:
    """One process started through a link: its status as the agent reports it."""

    def __init__(self, link: AgentLink, name: str):
        self.id = next(_IDS)
        self.link = link
        self.name = name
        self.pid: int | None = None
        self.started = False
        self.status: ExitStatus | None = None
        self.leftovers: tuple[str, ...] = ()
        self._leftovers: list[str] = []
        self._stacks: str | None = None
        self._stacks_event = threading.Event()

    def status_line(self, text: str) -> None:
        word, _, rest = text.partition(" ")
        if word == "started" and rest.isdigit():
            if self.link.preamble:  # the host's setup ran for this task too: its log shows what it said
                self.output(self.link.preamble)
            self.pid, self.started = int(rest), True
        elif word == "error":
            self._end(ExitStatus(error=self.link.carrier.where(rest), error_code=CANNOT_START))
        elif word == "leftover":
            pid, _, name = rest.partition(" ")
            self._leftovers.append(f"{name or '?'} (pid {pid})")
        elif word == "exit" and rest.startswith("code="):
            self._end(ExitStatus(code=int(rest[5:])))
        elif word == "exit" and rest.startswith("signal="):
            self._end(ExitStatus(signal=int(rest[7:])))

    def _end(self, status: ExitStatus) -> None:
        self.leftovers = tuple(self._leftovers)
        self.status = status  # last: a reader that sees the status sees the leftovers too
        self._stacks_event.set()

    def lose(self, carrier: Carrier, detail: str, started: bool) -> None:
        self._end(carrier.lost(detail) if started else carrier.not_started(detail))

    def output(self, data: bytes) -> None:
        raise NotImplementedError

    def stacks(self, text: str) -> None:
        self._stacks = text
        self._stacks_event.set()


class AgentTask(AgentProcessBase):
    """A task behind a host agent: the one process interface, over its host's link."""

    def __init__(self, link: AgentLink, name: str, log_path: str | int | None, logs: "LogWriter"):
        """``log_path``: where relayed output and the link's last words go (a path, or a descriptor
        this task owns); None when the task writes its log itself."""
        super().__init__(link, name)
        self.log_path = log_path
        self.logs = logs
        self._kill_deadline: float | None = None

    # -- the process interface --------------------------------------------------------------

    def poll(self) -> ExitStatus | None:
        if self.status is None and self._kill_deadline is not None and time.monotonic() > self._kill_deadline:
            self._kill_deadline = None
            self.link.carrier.extra_backstop(self.pid)
        return self.status

    def terminate(self) -> None:
        self.link.send(f"TERM {self.id}\n".encode())

    def kill(self) -> None:
        self.link.send(f"KILL {self.id}\n".encode())
        if self._kill_deadline is None:
            self._kill_deadline = time.monotonic() + KILL_BACKSTOP

    def send_signal(self, signum: int) -> None:
        self.link.send(f"SIG {self.id} {int(signum)}\n".encode())

    def dump_stacks(self, timeout: float = 10.0) -> str:
        self._stacks_event.clear()
        self._stacks = None
        self.link.send(f"DUMP {self.id}\n".encode())
        self._stacks_event.wait(timeout)
        if self._stacks is not None:
            return self._stacks
        if self.status is not None:
            return "no stack dump: the task has ended\n"
        return f"no stack dump: no answer from the agent on {self.link.host} within {timeout:g} s\n"

    def cleanup(self) -> None:
        """Nothing is left to do: the agent stopped the task's leftovers before it reported the exit."""

    def reading(self) -> Reading | None:
        """The newest sample of the task's CPU and memory, while it runs."""
        return self.link.readings.get(self.id)

    # -- from the hub -------------------------------------------------------------------------

    def output(self, data: bytes) -> None:
        if self.log_path is not None:
            self.logs.append(self.log_path, data)

    def lose(self, carrier: Carrier, detail: str, started: bool) -> None:
        if self.log_path is not None and detail:
            self.logs.append(self.log_path, f"[{carrier.kind} {carrier.host}] {detail}\n".encode())
        carrier.extra_backstop(self.pid)
        super().lose(carrier, detail, started)

    def _end(self, status: ExitStatus) -> None:
        super()._end(status)
        if isinstance(self.log_path, int):
            try:
                os.close(self.log_path)
            except OSError:
                pass
            self.log_path = None


class AgentHelper(AgentProcessBase):
    """A short-lived helper process (a probe): its output is collected, line by line, for a reader."""

    def __init__(self, link: AgentLink, name: str, on_line: Callable[[str | None], None]):
        super().__init__(link, name)
        self.on_line = on_line
        self._partial = b""

    def output(self, data: bytes) -> None:
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            self.on_line(line.decode("utf-8", "replace") + "\n")

    def _end(self, status: ExitStatus) -> None:
        super()._end(status)
        if self._partial:
            self.on_line(self._partial.decode("utf-8", "replace"))
            self._partial = b""
        self.on_line(None)

    def write(self, data: bytes) -> None:
        self.link.send(f"IN {self.id} {base64.b64encode(data).decode()}\n".encode())

    def close_stdin(self) -> None:
        self.link.send(f"CLOSE {self.id}\n".encode())

    def stop(self) -> None:
        self.link.send(f"KILL {self.id}\n".encode())


class LogWriter:
    """Appends relayed output to task logs, keeping a few files open (descriptors grow with hosts)."""

    def __init__(self, limit: int = OPEN_LOGS):
        self.limit = limit
        self._open: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()

    def append(self, path: str | int, data: bytes) -> None:
        if isinstance(path, int):  # a descriptor of the task's own (its log is no regular file)
            try:
                os.write(path, data)
            except OSError:
                pass
            return
        with self._lock:
            try:
                fd = self._open.pop(path, None)
                if fd is None:
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                    if len(self._open) >= self.limit:
                        os.close(self._open.popitem(last=False)[1])
                self._open[path] = fd
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            except OSError:
                pass  # a full disk or a vanished run folder: the run's own files report it

    def close(self) -> None:
        with self._lock:
            for fd in self._open.values():
                os.close(fd)
            self._open.clear()


def log_target(fd: int) -> str | int:
    """A task's log as a path that the agent or the hub opens when needed, so a task costs
    tflaunch no descriptor; a copy of ``fd`` when it is not a regular file. The caller keeps ``fd``."""
    try:
        path = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return os.dup(fd)
    if not (path.startswith("/") and os.path.isfile(path)):
        return os.dup(fd)
    return path


class LinkHub:
    """The one thread that reads and writes every link, sends heartbeats and notices silence."""

    def __init__(self) -> None:
        self._links: list[AgentLink] = []
        self._ending: list[tuple[AgentLink, float]] = []  # links whose channel closed: waiting for the carrier
        self._retired: list[AgentLink] = []  # closed links whose descriptors this thread closes
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        set_nonblocking(self._wake_r)
        set_nonblocking(self._wake_w)
        self._thread: threading.Thread | None = None

    def add(self, link: AgentLink) -> None:
        with self._lock:
            self._links.append(link)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="tflaunch-agents", daemon=True)
                self._thread.start()
        self.wake()

    def remove(self, link: AgentLink) -> None:
        with self._lock:
            if link in self._links:
                self._links.remove(link)

    def retire(self, link: AgentLink) -> None:
        """``link`` is closed: its descriptors are closed by this hub's thread, before its next poll."""
        self.remove(link)
        with self._lock:
            self._retired.append(link)
        self.wake()

    def _release_retired(self) -> None:
        retired, self._retired = self._retired, []
        for link in retired:
            link.release_descriptors()

    def watch_end(self, link: AgentLink) -> None:
        """The channel closed: give the carrier a moment to exit so its message can be read."""
        with self._lock:
            self._ending.append((link, time.monotonic() + 2.0))

    def wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass  # a wakeup is pending already

    def _run(self) -> None:
        next_beat = time.monotonic() + HEARTBEAT_INTERVAL
        while True:
            with self._lock:
                self._release_retired()
                links = list(self._links)
                ending = list(self._ending)
            poller = select.poll()
            poller.register(self._wake_r, select.POLLIN)
            by_fd: dict[int, list[tuple[AgentLink, int]]] = {}
            for link in links:
                if link.read_fd is not None:
                    by_fd.setdefault(link.read_fd, []).append((link, select.POLLIN))
                if link.wants_write():
                    by_fd.setdefault(link.write_fd, []).append((link, select.POLLOUT))
            for fd, entries in by_fd.items():
                mask = 0
                for _, flag in entries:
                    mask |= flag
                poller.register(fd, mask)
            timeout = max(0.0, next_beat - time.monotonic())
            if ending:
                timeout = min(timeout, 0.05)
            try:
                events = poller.poll(timeout * 1000)
            except InterruptedError:
                continue
            for fd, mask in events:
                if fd == self._wake_r:
                    try:
                        os.read(self._wake_r, 4096)
                    except OSError:
                        pass
                    continue
                for link, flag in by_fd.get(fd, ()):
                    try:
                        if flag == select.POLLIN and mask & (select.POLLIN | select.POLLHUP | select.POLLERR):
                            link.read_ready()
                        elif flag == select.POLLOUT and mask & (select.POLLOUT | select.POLLERR):
                            link.write_pending()
                    except Exception as exc:  # a broken frame must not take every other host down
                        self.remove(link)
                        link.lose(f"unreadable answer from its agent ({exc})")
            now = time.monotonic()
            for link, deadline in ending:
                if link.carrier.ended() is not None or now > deadline:
                    with self._lock:
                        self._ending.remove((link, deadline))
                    link.lose()
            if now >= next_beat:
                next_beat = now + HEARTBEAT_INTERVAL
                for link in links:
                    try:
                        link.heartbeat(now)
                    except Exception as exc:  # one broken link must not stop every other host's heartbeat
                        self.remove(link)
                        link.lose(f"its link failed ({exc})")


def set_nonblocking(fd: int) -> None:
    os.set_blocking(fd, False)


def kill_group(pid: int | None) -> None:
    if pid is None:
        return
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


HUB = LinkHub()
