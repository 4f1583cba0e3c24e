"""The running tflaunch's control socket, served: ``tflaunch stacks`` asks it for every task's stacks, now.

The server listens on ``<run folder>/control.sock`` for as long as the run lasts; the socket's
name, limits and protocol, and the client, are in :mod:`launcher.records.control`. Only the user
who runs tflaunch may use it: the socket is mode 0600 from the moment it has its name (it is bound
in a private folder and then renamed into place), and every peer's uid is checked with
``SO_PEERCRED`` before a byte is read. Reading a request, answering it and sending the answer share
one deadline (``REQUEST_SECONDS``); at most ``MAX_CLIENTS`` requests are served at once, so a client
that connects and says nothing costs one slot for one deadline and holds nothing else up. A
``stacks`` answer's verdict is :meth:`launcher.run.faults.hang_verdict.Verdict.to_json`.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from ...records.control import MAX_CLIENTS, MAX_REQUEST, REQUEST_SECONDS, SOCKET, ControlError, peer_uid, short_path
from ...records.folder import RunFolder, iso_time
from ...records.states import TaskState
from ..lifecycle.signals import wait_readable

DUMP_SECONDS = 10.0  # of REQUEST_SECONDS, at most this long for the stacks themselves


class ControlServer:
    """Serves requests about a live run on its control socket, on a thread of its own."""

    def __init__(self, folder: RunFolder, supervisor: Callable[[], Any]):
        self.run_dir = folder.path
        self.path = self.run_dir / SOCKET
        self.run_id = folder.run_id
        self.supervisor = supervisor  # the current attempt's Supervisor (None between attempts)
        self._listener: socket.socket | None = None
        self._inode: int | None = None
        self._wake_r, self._wake_w = -1, -1
        self._thread: threading.Thread | None = None
        self._slots = threading.BoundedSemaphore(MAX_CLIENTS)

    def start(self) -> "ControlServer":
        """Listen; a socket that cannot be made costs the run nothing but ``tflaunch stacks``."""
        private = None
        try:
            private = Path(tempfile.mkdtemp(prefix=".control-", dir=self.run_dir))  # mode 0700
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                with short_path(private, SOCKET) as address:
                    listener.bind(address)
                os.chmod(private / SOCKET, 0o600)
                os.rename(private / SOCKET, self.path)
                listener.listen(MAX_CLIENTS)
                inode = os.stat(self.path).st_ino
            except OSError:
                listener.close()
                raise
        except OSError:
            return self  # e.g. a file system without sockets: 'tflaunch stacks' then says there is none
        finally:
            if private is not None:
                shutil.rmtree(private, ignore_errors=True)
        self._listener, self._inode = listener, inode
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._serve, name="tflaunch-control", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop listening and remove the socket (only ours: a later run may have made its own)."""
        if self._listener is None:
            return
        os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(5.0)
        self._listener.close()
        self._listener = None
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
        try:
            if os.stat(self.path).st_ino == self._inode:
                os.unlink(self.path)
        except OSError:
            pass

    # -- serving --------------------------------------------------------------------------------

    def _serve(self) -> None:
        while True:
            ready = wait_readable((self._listener.fileno(), self._wake_r), None)
            if self._wake_r in ready:
                return
            try:
                conn, _ = self._listener.accept()
            except OSError:
                continue
            if not self._same_user(conn) or not self._slots.acquire(blocking=False):
                conn.close()  # a stranger learns nothing; a crowd waits for nobody
                continue
            threading.Thread(target=self._handle, args=(conn,), name="tflaunch-control-request", daemon=True).start()

    @staticmethod
    def _same_user(conn: socket.socket) -> bool:
        return peer_uid(conn) == os.geteuid()

    def _handle(self, conn: socket.socket) -> None:
        deadline = time.monotonic() + REQUEST_SECONDS
        try:
            try:
                answer = self.answer(_read_line(conn, deadline), deadline)
            except ControlError as exc:
                answer = {"ok": False, "error": str(exc)}
            conn.settimeout(max(0.1, deadline - time.monotonic()))
            conn.sendall(json.dumps(answer).encode() + b"\n")
        except OSError:
            pass  # the client went away or ran out of time: its loss alone
        finally:
            conn.close()
            self._slots.release()

    def answer(self, request: bytes, deadline: float) -> dict[str, Any]:
        try:
            op = json.loads(request).get("op")
        except (ValueError, AttributeError, RecursionError):  # RecursionError: nested deeper than json can read
            raise ControlError("not a request (expected one JSON object on one line)") from None
        if op != "stacks":
            what = repr(op)[:60] if isinstance(op, str) else "(op is not a string)"
            raise ControlError(f"unknown request {what} (known: 'stacks')")
        supervisor = self.supervisor()
        tasks = list(supervisor.tasks) if supervisor is not None else []
        running = [t for t in tasks if t.state is TaskState.RUNNING and t.process is not None]
        if not running:
            raise ControlError(f"run {self.run_id} has no running task right now (starting, restarting or ending)")
        # Here, not at the top: every run starts this server, and few ever ask it for stacks.
        from .hang_verdict import sample_stacks, verdict
        from .pyspy import parse_dump

        began = time.monotonic()
        texts = sample_stacks({t.name: t.process for t in running},
                              max(0.5, min(DUMP_SECONDS, deadline - began - 1.0)))
        if texts is None:
            raise ControlError("another stack sample of this run is still running; ask again in a moment")
        seconds = time.monotonic() - began
        found = verdict({name: parse_dump(text) for name, text in texts.items()}, {t.name: t.role for t in running})
        attempt = running[0].launch.attempt
        return {"ok": True, "run_id": self.run_id, "attempt": attempt, "sampled_at": iso_time(time.time()),
                "seconds": round(seconds, 3),
                "tasks": [{"name": t.name, "role": t.role, "host": t.launch.host, "pid": t.process.pid,
                           "stacks": texts[t.name]} for t in running],
                "verdict": found.to_json()}


def _read_line(conn: socket.socket, deadline: float) -> bytes:
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ControlError("the request did not arrive in time")
        conn.settimeout(left)
        try:
            chunk = conn.recv(MAX_REQUEST + 1 - len(data))
        except socket.timeout:
            raise ControlError("the request did not arrive in time") from None
        if not chunk:
            break
        data += chunk
        if len(data) > MAX_REQUEST:
            raise ControlError(f"request longer than {MAX_REQUEST} bytes")
    return data.split(b"\n", 1)[0]
