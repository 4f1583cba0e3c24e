"""TensorBoard on a run folder: beside a run, or on its own for a run that already exists.

Every task gets ``TFLAUNCH_TENSORBOARD_DIR=<run folder>/tensorboard`` (see :mod:`launcher.cluster.plan`)
and the built-in trainer writes its per-epoch scalars there; :func:`logdir_of` finds that folder
again for a run, also when the cluster's ``env`` pointed it elsewhere.

TensorBoard is an optional extra. :func:`require` raises one line naming it when it is missing,
before anything starts.

A server never outlives the tflaunch that started it:

- it runs in a session of its own, so TensorBoard and the data server it starts are one process
  group, stopped as one (SIGTERM, a short grace, SIGKILL, then reaped);
- a few lines run in the server's process before TensorBoard's own code and ask the kernel to
  send it SIGTERM when its parent goes (``PR_SET_PDEATHSIG``), so a SIGKILLed tflaunch does not
  leave it behind. The kernel means the parent *thread*: the thread that runs the launch, or, for
  a server started again on another port (see :meth:`TensorBoard.wait_ready`), the thread that
  waited for it, which lives until the server is stopped; either stops the server itself before it
  returns.

It listens on 127.0.0.1 unless told otherwise: TensorBoard has no authentication. It is ready
when the port's listener is the process tflaunch started and its ``/data/logdir`` answers with the
folder tflaunch gave it: between the port check and TensorBoard's bind, anyone on the machine may
take the port, and a URL tflaunch prints must lead to its own server.
"""

from __future__ import annotations

import errno
import http.client
import importlib.util
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from .errors import LaunchError
from .records.files import make_folder, open_own
from .records.folder import TENSORBOARD, TENSORBOARD_LOG
from .taskenv import TENSORBOARD_DIR

DEFAULT_HOST = "127.0.0.1"
FIRST_PORT = 6006  # TensorBoard's own default; the next free one above it otherwise
PORTS_TRIED = 100
# A port tflaunch chose may be taken by someone else between its check and TensorBoard's bind: the
# server is then started again on the next free port, at most this many times.
MOVES = 3
ANSWER_LIMIT = 64 * 1024  # bytes of /data/logdir read at most: a stranger's endless answer costs no memory
# tflaunch installs TensorBoard; it is missing only where it was removed, from the interpreter that runs it.
MISSING = (f"TensorBoard is not installed for {sys.executable}; install it: {shlex.quote(sys.executable)} -m pip "
           "install tensorboard")

# Runs in the server's own process before TensorBoard: die with the parent, then be TensorBoard.
_BOOT = """\
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    sys.exit(0)  # the parent went before the request took effect
sys.argv = ["tensorboard", *sys.argv[2:]]
from tensorboard.main import run_main
run_main()
"""


class TensorBoardError(LaunchError):
    """TensorBoard is missing, or could not serve (a busy port, an early exit)."""


def available() -> bool:
    """Whether this interpreter (the one that runs TensorBoard) can import it, without importing it."""
    try:
        return importlib.util.find_spec("tensorboard") is not None
    except (ImportError, ValueError):  # an import hook that refuses it, a broken entry in sys.modules
        return False


def require() -> None:
    """Raise the one-line error naming the extra when TensorBoard is not installed."""
    if not available():
        raise TensorBoardError(MISSING)


def logdir_of(run_dir: Path, task_envs: list[dict[str, str]] | None = None) -> Path:
    """Where a run's tasks were told to write TensorBoard data: their TFLAUNCH_TENSORBOARD_DIR, else the default."""
    for env in task_envs or []:
        if env.get(TENSORBOARD_DIR):
            return Path(env[TENSORBOARD_DIR])
    return Path(run_dir) / TENSORBOARD


def pick_port(host: str, wanted: int | None) -> int:
    """``wanted`` when it is free on ``host``; without it, the first free port from 6006 up."""
    if wanted is not None:
        if not _bindable(host, wanted):
            raise TensorBoardError(f"--port {wanted}: {host}:{wanted} is already in use; expected a free port")
        return wanted
    for port in range(FIRST_PORT, FIRST_PORT + PORTS_TRIED):
        if _bindable(host, port):
            return port
    raise TensorBoardError(f"no free port for TensorBoard on {host} in {FIRST_PORT}-{FIRST_PORT + PORTS_TRIED - 1}; "
                           "expected one, or give --port")


def _bindable(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a server binds: TIME_WAIT is no clash
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                raise TensorBoardError(f"--host {host}: not an address of this machine") from None
            return False
    return True


class TensorBoard:
    """One TensorBoard server process (and its process group)."""

    def __init__(self, process: subprocess.Popen, host: str, port: int, logdir: Path, log_path: Path | None,
                 python: str = sys.executable, chosen: bool = False):
        self.process = process
        self.host = host
        self.port = port
        self.logdir = logdir
        self.log_path = log_path  # where its output goes; None: the caller's terminal
        self.python = python
        self.chosen = chosen  # tflaunch chose the port (none was asked for): another may be chosen
        self.moves = 0

    @property
    def url(self) -> str:
        shown = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{shown}:{self.port}/"

    @property
    def pid(self) -> int:
        return self.process.pid

    @classmethod
    def start(cls, logdir: Path, *, host: str = DEFAULT_HOST, port: int | None = None,
              log_path: Path | None = None, python: str = sys.executable) -> "TensorBoard":
        """Start serving ``logdir``; returns at once (see :meth:`wait_ready`)."""
        require()
        chosen = pick_port(host, port)
        process = _spawn(python, Path(logdir), host, chosen, log_path)
        return cls(process, host, chosen, Path(logdir), log_path, python=python, chosen=port is None)

    def wait_ready(self, timeout: float = 120.0, wait: Callable[[float], object] = time.sleep) -> None:
        """Return once this server serves its logdir; TensorBoardError if it exits or takes too long.

        ``wait(seconds)`` sleeps between tries; it may return truthy to give up early (a signal).
        A server on a port tflaunch chose that exits because someone took the port first is started
        again on the next free one (at most :data:`MOVES` times), by the calling thread.
        """
        deadline = time.monotonic() + timeout
        while True:
            code = self.process.poll()
            if code is not None and self.chosen and self.moves < MOVES and not _bindable(self.host, self.port):
                if wait(0.0):
                    raise TensorBoardError("stopped while TensorBoard was starting")
                self.moves += 1
                self.port = pick_port(self.host, None)
                self.process = _spawn(self.python, self.logdir, self.host, self.port, self.log_path)
                continue
            if code is not None:
                raise TensorBoardError(f"TensorBoard exited with code {code} before serving {self.url}"
                                       f"{self._last_words()}")
            if self._serving():
                return
            if time.monotonic() >= deadline:
                raise TensorBoardError(f"TensorBoard did not serve {self.url} within {timeout:g} s{self._last_words()}")
            if wait(0.2):
                raise TensorBoardError("stopped while TensorBoard was starting")

    def _serving(self) -> bool:
        """Whether this server, and no other, answers on the port (see the module docstring)."""
        return self._listening() and self._logdir_answered() == str(self.logdir)

    def _listening(self) -> bool:
        """Whether the process tflaunch started holds the listening socket of ``port``."""
        import psutil  # imported here: "tflaunch --help" loads nothing it does not need

        try:
            sockets = psutil.Process(self.process.pid).net_connections(kind="inet")
        except psutil.Error:
            return False
        return any(s.status == psutil.CONN_LISTEN and s.laddr and s.laddr.port == self.port for s in sockets)

    def _logdir_answered(self) -> str | None:
        """The logdir the server on the port names at /data/logdir (TensorBoard's own route), or None."""
        connection = http.client.HTTPConnection(self.host, self.port, timeout=2.0)
        try:
            connection.request("GET", "/data/logdir")
            response = connection.getresponse()
            body = response.read(ANSWER_LIMIT) if response.status == 200 else b""
            answer = json.loads(body) if body else None
        except (OSError, http.client.HTTPException, ValueError):
            return None
        finally:
            connection.close()
        logdir = answer.get("logdir") if isinstance(answer, dict) else None
        return logdir if isinstance(logdir, str) else None

    def _last_words(self) -> str:
        if self.log_path is None:
            return ""
        try:
            lines = [line for line in self.log_path.read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            return ""
        return f": {lines[-1].strip()}" if lines else ""

    def stop(self, grace: float = 3.0) -> None:
        """SIGTERM to the server's group, up to ``grace`` seconds, then SIGKILL; always reaped."""
        if self.process.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.process.wait()

    def _signal_group(self, signum: int) -> None:
        try:
            os.killpg(self.process.pid, signum)
        except ProcessLookupError:
            pass  # already gone


def _spawn(python: str, logdir: Path, host: str, port: int, log_path: Path | None) -> subprocess.Popen:
    """TensorBoard's process, in a session of its own, its output appended to ``log_path``."""
    argv = [python, "-c", _BOOT, str(os.getpid()), "--logdir", str(logdir), "--host", host,
            "--port", str(port), "--reload_interval", "2"]
    output = None
    try:
        if log_path is not None:
            output = open(open_own(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND), "ab")
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=output, stderr=output, start_new_session=True)
    except OSError as exc:
        raise TensorBoardError(f"cannot start TensorBoard ({python}): {exc.strerror or exc}") from None
    finally:
        if output is not None:
            output.close()


class BesideRun:
    """A TensorBoard started next to a run: it announces its address and goes when the run does.

    Starting returns at once, so the run does not wait for TensorBoard's start-up; a thread waits
    for the server and says where it is, or why it could not start. A server that cannot start
    does not touch the run.
    """

    def __init__(self, message: Callable[[str], None], *, host: str = DEFAULT_HOST, port: int | None = None):
        self.message = message
        self.host = host
        self.port = port
        self.server: TensorBoard | None = None
        self._stopping = threading.Event()
        self._waiter: threading.Thread | None = None

    def start(self, run_dir: Path) -> None:
        logdir = Path(run_dir) / TENSORBOARD
        try:
            make_folder(logdir)  # the run folder's mode: its owner's, or its group's to read
            self.server = TensorBoard.start(logdir, host=self.host, port=self.port, log_path=Path(run_dir) / TENSORBOARD_LOG)
        except (OSError, TensorBoardError) as exc:
            self.message(f"TensorBoard not started: {exc}")
            return
        self._waiter = threading.Thread(target=self._announce, name="tensorboard-ready", daemon=True)
        self._waiter.start()

    def _announce(self) -> None:
        server = self.server
        try:
            server.wait_ready(wait=self._stopping.wait)
        except TensorBoardError as exc:
            if not self._stopping.is_set():
                self.message(f"TensorBoard not started: {exc} (see {server.log_path})")
            return
        self.message(f"TensorBoard at {server.url} (stops with the run)")
        # A server started again on another port is this thread's child: the kernel stops it when
        # this thread ends (PR_SET_PDEATHSIG), so the thread stays until the run stops the server.
        self._stopping.wait()

    def stop(self) -> None:
        self._stopping.set()
        if self.server is not None:
            self.server.stop()
        if self._waiter is not None:
            self._waiter.join()
        if self.server is not None:
            self.server.stop()  # one the waiter started again while the first was being stopped
