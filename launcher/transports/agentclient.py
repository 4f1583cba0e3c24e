"""tflaunch's side of the agent protocol (see :mod:`.agent`), shared by every transport that puts
the agent in front of a task: the spec it is started with, its status lines, and a task process
that talks to it through a pipe on its stdin.

The pipe is what makes a task end with tflaunch: only tflaunch writes to it, so when tflaunch dies
(even by SIGKILL) the agent reads EOF and stops the task's whole tree.
"""

from __future__ import annotations

import base64
import fcntl
import os
import subprocess
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

from ..cluster.plan import TaskLaunch
from .base import CANNOT_START, ExitStatus

AGENT_PATH = Path(__file__).with_name("agent.py")
AGENT_SOURCE = AGENT_PATH.read_text()
AGENT_MARK = "TFLAUNCH_AGENT"
HEARTBEAT_INTERVAL = 1.0
KILL_BACKSTOP = 3.0  # after KILL, seconds before the agent itself is killed if it has not ended


def agent_spec(argv: list[str], env: dict[str, str], grace: float, eof_grace: float, timeout: float | None,
               cwd: str | None = None) -> str:
    """The agent's one argument, base64 so that no value of it passes through a shell (the
    format is :func:`agent.read_spec`'s)."""
    tokens = ["grace", repr(float(grace)), "eof_grace", repr(float(eof_grace)),
              "timeout", "" if timeout is None else repr(float(timeout))]
    if cwd is not None:
        tokens += ["cwd", cwd]
    tokens += ["argv", str(len(argv)), *argv, "env", str(2 * len(env))]
    for name, value in env.items():
        tokens += [name, value]
    if any("\0" in token for token in tokens):
        raise ValueError("an argument or environment value contains a NUL character")
    return base64.b64encode("\0".join(tokens).encode()).decode()


@dataclass(frozen=True)
class AgentReport:
    """What an agent said on its stderr, and the other lines that came with it (ssh's own, say)."""

    started: int | None = None  # the task's pid on its host
    exit: ExitStatus | None = None
    error: str | None = None  # the task could not be started (the agent's reason)
    leftovers: tuple[str, ...] = ()  # "sleep (pid 4711)": processes that outlived the task, stopped
    other: tuple[str, ...] = ()


def strip_stacks(text: str) -> str:
    """``text`` without the stack dumps between the agent's marks (collected already)."""
    begin, end = f"{AGENT_MARK} stacks-begin", f"{AGENT_MARK} stacks-end"
    while begin in text:
        before, _, rest = text.partition(begin)
        text = before + rest.partition(end)[2].lstrip("\n")
    return text


def parse_agent_output(text: str) -> AgentReport:
    """Read an agent's status lines; a line it did not write goes to ``other``."""
    started = exit_status = error = None
    leftovers: list[str] = []
    other: list[str] = []
    for line in strip_stacks(text).splitlines():
        if not line.startswith(AGENT_MARK + " "):
            if line.strip():
                other.append(line)
            continue
        word, _, rest = line[len(AGENT_MARK) + 1:].partition(" ")
        if word == "started" and rest.strip().isdigit():
            started = int(rest)
        elif word == "exit" and rest.startswith("code=") and rest[5:].strip().lstrip("-").isdigit():
            exit_status = ExitStatus(code=int(rest[5:]))
        elif word == "exit" and rest.startswith("signal=") and rest[7:].strip().isdigit():
            exit_status = ExitStatus(signal=int(rest[7:]))
        elif word == "error":
            error = rest
        elif word == "leftover":
            pid, _, name = rest.partition(" ")
            leftovers.append(f"{name or '?'} (pid {pid})")
        else:
            other.append(line)
    return AgentReport(started, exit_status, error, tuple(leftovers), tuple(other))


def status_file() -> int:
    """An anonymous file for an agent's stderr, appended to by the writer and read with pread:
    the descriptor is shared with the writer, so reading must never move its offset."""
    fd, path = tempfile.mkstemp(prefix="tflaunch-agent-")
    os.unlink(path)
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)
    return fd


def read_all(fd: int) -> str:
    chunks, offset = [], 0
    while True:
        chunk = os.pread(fd, 1 << 20, offset)
        if not chunk:
            return b"".join(chunks).decode("utf-8", "replace")
        chunks.append(chunk)
        offset += len(chunk)


class AgentProcess:
    """A task behind an agent: commands on the agent's stdin, its status lines in ``status_fd``.

    ``popen`` is the process tflaunch started (the agent itself, or a client such as ssh that
    carries its stdin and stderr). Subclasses say what an ending without an exit report means.
    """

    channel = "agent"  # how the carrier is named in the task's log

    def __init__(self, launch: TaskLaunch, popen: subprocess.Popen[bytes], status_fd: int, output_fd: int):
        self.launch = launch
        self.popen = popen
        self.leftovers: tuple[str, ...] = ()
        self._status_fd = status_fd
        self._output_fd, self._output_path = _by_path(output_fd)
        self._stdin_lock = threading.Lock()  # the heartbeat thread writes too
        self._kill_deadline: float | None = None
        self._status: ExitStatus | None = None
        self._report: AgentReport | None = None
        fcntl.fcntl(popen.stdin.fileno(), fcntl.F_SETFL, os.O_NONBLOCK)
        HEARTBEATS.add(self)

    # -- the process interface ------------------------------------------------------------

    def poll(self) -> ExitStatus | None:
        if self._status is not None:
            return self._status
        now = time.monotonic()
        if self._kill_deadline is not None and now > self._kill_deadline:
            self._backstop()
        returncode = self.popen.poll()
        if returncode is None:
            return None
        self._report = parse_agent_output(self._status_text())
        self.leftovers = self._report.leftovers
        if self._report.other:
            # The carrier's own messages (ssh's, a remote shell's, an agent's traceback) belong
            # in the task's log too.
            self._append_output("".join(f"[{self.channel} {self.launch.host}] {line}\n"
                                        for line in self._report.other).encode())
        self._status = self._exit_status(self._report, returncode)
        return self._status

    def terminate(self) -> None:
        self._send(b"TERM\n")

    def kill(self) -> None:
        self._send(b"KILL\n")
        self._close_stdin()  # EOF also stops the task, should the command not arrive
        if self._kill_deadline is None:
            self._kill_deadline = time.monotonic() + KILL_BACKSTOP

    def send_signal(self, signum: int) -> None:
        self._send(f"SIG {int(signum)}\n".encode())

    def dump_stacks(self, timeout: float = 10.0) -> str:
        """Ask the agent for a py-spy dump; it arrives on the agent's stderr between marks."""
        start = os.fstat(self._status_fd).st_size
        self._send(b"DUMP\n")
        begin, end = f"{AGENT_MARK} stacks-begin\n", f"{AGENT_MARK} stacks-end"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = os.pread(self._status_fd, 1 << 22, start).decode("utf-8", "replace")
            if begin in text and end in text:
                return text.split(begin, 1)[1].split(end, 1)[0]
            if self.popen.poll() is not None:
                break
            time.sleep(0.05)
        return f"no stack dump: no answer from the agent on {self.launch.host} within {timeout:g} s\n"

    def cleanup(self) -> None:
        self._close_stdin()  # EOF: the agent stops whatever is left of the task
        if self.popen.poll() is None:
            try:
                self.popen.wait(timeout=KILL_BACKSTOP + 2)
            except subprocess.TimeoutExpired:
                self._backstop()
                self.popen.wait()
        if self._status is None:
            self.poll()  # read the agent's report before its file goes
        for name in ("_output_fd", "_status_fd"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)

    # -- for subclasses ---------------------------------------------------------------------

    def _exit_status(self, report: AgentReport, returncode: int) -> ExitStatus:
        """The task's exit status from the agent's report; ``returncode`` is the carrier's."""
        if report.exit is not None:
            return report.exit
        if report.error is not None:
            return ExitStatus(error=report.error, error_code=CANNOT_START)
        detail = report.other[-1].strip() if report.other else f"{self.channel} {describe(returncode)}"
        return ExitStatus(error=f"the agent in front of the task ended without an exit report ({detail})")

    def _backstop(self) -> None:
        """The agent did not end after KILL: kill it (and, where it can be reached, the task)."""
        self.popen.kill()

    # -- helpers ----------------------------------------------------------------------------

    def _append_output(self, data: bytes) -> None:
        try:
            if self._output_fd >= 0:
                os.write(self._output_fd, data)
            elif self._output_path is not None:
                with open(self._output_path, "ab") as log:
                    log.write(data)
        except OSError:
            pass  # a full disk or a vanished run folder: the run reports that on its own

    def _status_text(self) -> str:
        return read_all(self._status_fd) if self._status_fd >= 0 else ""

    def _send(self, data: bytes) -> None:
        with self._stdin_lock:  # never a write to a descriptor closed (and reused) meanwhile
            stdin = self.popen.stdin
            if stdin is None or stdin.closed:
                return
            try:
                os.write(stdin.fileno(), data)
            except OSError:
                pass  # the agent is gone or busy; its exit status tells the rest

    def _close_stdin(self) -> None:
        with self._stdin_lock:
            if self.popen.stdin and not self.popen.stdin.closed:
                try:
                    self.popen.stdin.close()
                except OSError:
                    pass


class _Heartbeats:
    """One daemon thread that sends every live agent a heartbeat each second, whatever the
    supervisor is busy with (collecting stacks of many hung tasks can take longer than an
    agent's timeout). It dies with tflaunch, and then the agents see EOF anyway."""

    def __init__(self) -> None:
        self._processes: weakref.WeakSet[AgentProcess] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, process: AgentProcess) -> None:
        with self._lock:
            self._processes.add(process)
            if self._thread is None:
                self._thread = threading.Thread(target=self._beat, name="agent-heartbeats", daemon=True)
                self._thread.start()

    def _beat(self) -> None:
        while True:
            time.sleep(HEARTBEAT_INTERVAL)
            with self._lock:
                processes = list(self._processes)
            for process in processes:
                process._send(b"\n")  # a no-op once its stdin is closed


HEARTBEATS = _Heartbeats()


def _by_path(fd: int) -> tuple[int, str | None]:
    """A task's log as a path to reopen when needed, closing ``fd``, so that a long-running task
    costs tflaunch no descriptor for it; ``fd`` itself when it is not a regular file."""
    try:
        path = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return fd, None
    if not (path.startswith("/") and os.path.isfile(path)):
        return fd, None
    os.close(fd)
    return -1, path


def describe(returncode: int) -> str:
    return f"was killed by signal {-returncode}" if returncode < 0 else f"exited with {returncode}"
