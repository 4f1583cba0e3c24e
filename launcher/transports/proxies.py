"""The processes tflaunch starts through a host's link (:mod:`.hostlink`), and where their relayed
output goes.

An :class:`AgentTask` is one task seen through the one process interface
(:class:`.base.TaskProcess`); an :class:`AgentHelper` is a short-lived helper (a preflight probe)
with its output kept in memory. :class:`LogWriter` appends relayed output to task logs.
"""

from __future__ import annotations

import base64
import os
import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Callable

from ..agent.protocol import Command, Status
from ..records.boundedlog import WRITING, BoundedLog
from ..records.files import open_own
from .base import CANNOT_START, OPEN_LOGS, ExitStatus, Reading

if TYPE_CHECKING:
    from .carriers import Carrier
    from .hostlink import AgentLink

KILL_BACKSTOP = 3.0  # after KILL, seconds before tflaunch kills a local task's group itself
STDIN_PIECE = 1 << 20  # bytes of a helper's stdin per command, well under the longest command line


class AgentProcessBase:
    """One process started through a link: its status as the agent reports it."""

    def __init__(self, link: AgentLink, name: str):
        self.id = link.new_id()
        self.link = link
        self.name = name
        self.pid: int | None = None
        self.started = False
        self.status: ExitStatus | None = None
        self.leftovers: tuple[str, ...] = ()
        self._leftovers: list[str] = []
        self._stacks: str | None = None
        self._stacks_event = threading.Event()

    def status_line(self, text: str) -> bool:
        """Take one status line from the agent; False when it is none of the agent's."""
        word, _, rest = text.partition(" ")
        if word == Status.STARTED and rest.isdigit():
            if self.link.host_output:  # the host's setup ran for this task too: its log shows what it said
                self.host_said(bytes(self.link.host_output))
            self.pid, self.started = int(rest), True
        elif word == Status.ERROR:
            self._end(ExitStatus(error=self.link.carrier.where(rest), error_code=CANNOT_START))
        elif word == Status.LEFTOVER:
            pid, _, name = rest.partition(" ")
            self._leftovers.append(f"{name or '?'} (pid {pid})")
        elif word == Status.EXIT and (ended := _exit_status(rest)) is not None:
            self._end(ended)
        else:
            return False
        return True

    def _end(self, status: ExitStatus) -> None:
        self.leftovers = tuple(self._leftovers)
        self.status = status  # last: a reader that sees the status sees the leftovers too
        self._stacks_event.set()

    def lose(self, carrier: Carrier, detail: str, started: bool) -> None:
        self._end(carrier.lost(detail) if started else carrier.not_started(detail))

    def output(self, data: bytes | memoryview) -> None:
        """Bytes the process wrote (relayed by the agent): a view into the hub's read buffer, valid
        only until this returns, so what is kept of it is copied."""

    def host_said(self, data: bytes) -> None:
        """Bytes the host wrote outside any task (its login shell, its setup line) while this ran."""

    def stacks(self, text: str) -> None:
        self._stacks = text
        self._stacks_event.set()


class AgentTask(AgentProcessBase):
    """A task behind a host agent: the one process interface, over its host's link."""

    def __init__(self, link: AgentLink, name: str, log_path: str | None, logs: "LogWriter"):
        """``log_path``: where relayed output and the link's last words go; None when the task
        writes its log itself."""
        super().__init__(link, name)
        self.log_path = log_path
        self.logs = logs
        self._kill_deadline: float | None = None

    # -- the process interface --------------------------------------------------------------

    def poll(self) -> ExitStatus | None:
        if self.status is None and self._kill_deadline is not None and time.monotonic() > self._kill_deadline:
            self._kill_deadline = None
            self.link.carrier.extra_backstop(self.pid, self.id)
        return self.status

    def terminate(self) -> None:
        self.link.send(f"{Command.TERM} {self.id}\n".encode())

    def kill(self) -> None:
        self.link.send(f"{Command.KILL} {self.id}\n".encode())
        if self._kill_deadline is None:
            self._kill_deadline = time.monotonic() + KILL_BACKSTOP

    def dump_stacks(self, timeout: float = 10.0) -> str:
        self._stacks_event.clear()
        self._stacks = None
        self.link.send(f"{Command.DUMP} {self.id}\n".encode())
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
        return None if self.status is not None else self.link.reading(self.id)

    # -- from the hub -------------------------------------------------------------------------

    def output(self, data: bytes | memoryview) -> None:
        if self.log_path is not None:
            self.logs.append(self.log_path, data)

    host_said = output

    def lose(self, carrier: Carrier, detail: str, started: bool) -> None:
        if self.log_path is not None and detail:
            self.logs.append(self.log_path, f"[{carrier.kind} {carrier.host}] {detail}\n".encode())
        carrier.extra_backstop(self.pid, self.id)
        super().lose(carrier, detail, started)


class AgentHelper(AgentProcessBase):
    """A short-lived helper process (a probe): its output is collected, line by line, for a reader."""

    def __init__(self, link: AgentLink, name: str, on_line: Callable[[str | None], None]):
        super().__init__(link, name)
        self.on_line = on_line
        self._partial = b""

    def output(self, data: bytes | memoryview) -> None:
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
        for start in range(0, len(data), STDIN_PIECE):
            piece = base64.b64encode(data[start:start + STDIN_PIECE]).decode()
            self.link.send(f"{Command.IN} {self.id} {piece}\n".encode())

    def close_stdin(self) -> None:
        self.link.send(f"{Command.CLOSE} {self.id}\n".encode())

    def stop(self) -> None:
        self.link.send(f"{Command.KILL} {self.id}\n".encode())


class LogWriter:
    """Appends relayed output to task logs, keeping a few files open (descriptors grow with hosts).

    A log the run keeps within a size limit (:data:`launcher.records.boundedlog.WRITING` has it)
    is written through its :class:`~launcher.records.boundedlog.BoundedLog`; any other file as it is.
    """

    def __init__(self, limit: int = OPEN_LOGS):
        self.limit = limit
        self._open: OrderedDict[str, int | BoundedLog] = OrderedDict()
        self._lock = threading.Lock()

    def append(self, path: str, data: bytes) -> None:
        with self._lock:
            try:
                held = self._open.pop(path, None)
                if isinstance(held, BoundedLog) and held.closed:
                    # Its attempt ended: a restart's new log at the same path is another BoundedLog,
                    # followed by the pump, and writes to the closed one would not be announced.
                    held.release()
                    held = None
                if held is None:
                    held = WRITING.get(path) or open_own(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
                    if len(self._open) >= self.limit:
                        _let_go(self._open.popitem(last=False)[1])
                self._open[path] = held
                if isinstance(held, BoundedLog):
                    held.write(data)
                    return
                view = memoryview(data)
                while view:
                    view = view[os.write(held, view):]
            except OSError:
                pass  # a full disk or a vanished run folder: the run's own files report it

    def close(self) -> None:
        with self._lock:
            for held in self._open.values():
                _let_go(held)
            self._open.clear()


def _let_go(held: int | BoundedLog) -> None:
    """Close a plain file's descriptor, or let a bounded log close its own until its next write."""
    if isinstance(held, BoundedLog):
        held.release()
    else:
        os.close(held)


def _exit_status(text: str) -> ExitStatus | None:
    """``code=<n>`` or ``signal=<n>``, then `` termed`` when tflaunch's stop ended the process; None if neither."""
    value, _, flag = text.partition(" ")
    if flag not in ("", Status.TERMED):
        return None
    for prefix, key in ((Status.CODE, "code"), (Status.SIGNAL, "signal")):
        if value.startswith(prefix) and value[len(prefix):].isdigit():
            return ExitStatus(**{key: int(value[len(prefix):])}, termed=bool(flag))
    return None
