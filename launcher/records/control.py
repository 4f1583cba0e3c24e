"""A run folder's control socket, from the side that asks: its name, its limits, and :func:`ask`.

While a run lasts, its tflaunch serves ``<run folder>/control.sock`` (:data:`SOCKET`;
:mod:`launcher.run.faults.stacks_server` is the server), and ``tflaunch stacks`` asks it for every task's
stacks. Only the user who runs tflaunch may use it, and a client talks only to a server of its own
user's (``SO_PEERCRED`` on both sides). A request is one JSON line of at most
:data:`MAX_REQUEST` bytes, served within :data:`REQUEST_SECONDS`, at most :data:`MAX_CLIENTS` at
once; an answer is one JSON object of at most :data:`MAX_ANSWER` bytes::

    {"op": "stacks"}
    {"ok": true, "run_id": "...", "attempt": 1, "sampled_at": "...", "seconds": 0.21,
     "tasks": [{"name": "worker-0", "role": "worker", "host": "localhost", "pid": 4711, "stacks": "..."}],
     "verdict": {...}}
    {"ok": false, "error": "one line"}

Unix socket paths are limited to about 107 bytes; a longer one is reached through the folder's
descriptor (``/proc/self/fd/N/control.sock``), on both sides (:func:`short_path`).
"""

from __future__ import annotations

import json
import os
import re
import socket
import struct
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from ..errors import LaunchError
from .folder import CONTROL_SOCKET as SOCKET  # the name is the folder layout's

MAX_REQUEST = 4096  # bytes of one request line
MAX_ANSWER = 64 << 20  # bytes a client accepts
MAX_CLIENTS = 8  # requests served at once
REQUEST_SECONDS = 30.0  # one deadline per request: read, sample, answer
_PATH_MAX = 100  # longer socket paths go through the folder's descriptor
# Characters a terminal acts on (C0 and C1 controls, DEL) but a line break and a tab: shown escaped.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# The same, but a colour or style code (SGR: ESC [ digits m), which only paints, passes as it is.
_CONTROL_BUT_COLOURS = re.compile("\x1b\\[[0-9;]*m|[\x00-\x08\x0b-\x1f\x7f-\x9f]")


class ControlError(LaunchError):
    """The control socket of a run cannot be used (not running, another user's, no answer)."""


@contextmanager
def short_path(folder: Path, name: str) -> Iterator[str]:
    """A path to ``folder/name`` that fits a Unix socket address."""
    path = str(folder / name)
    if len(path) <= _PATH_MAX:
        yield path
        return
    fd = os.open(folder, os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{name}"
    finally:
        os.close(fd)



def ask(run_dir: Path, run_id: str, request: dict[str, Any], timeout: float = REQUEST_SECONDS + 5) -> dict[str, Any]:
    """Send one request to a live run's tflaunch and return its answer; ControlError says why not."""
    run_dir = Path(run_dir)
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        client.settimeout(timeout)
        try:
            with short_path(run_dir, SOCKET) as address:
                client.connect(address)
        except FileNotFoundError:
            raise ControlError(f"run {run_id} has no control socket ({run_dir / SOCKET}): it is not running, "
                               "or it was started by a tflaunch without one") from None
        except ConnectionRefusedError:
            raise ControlError(f"run {run_id} is not running: nothing listens on {run_dir / SOCKET}") from None
        except PermissionError:
            raise ControlError(f"run {run_id} belongs to another user: only the user who started it may ask "
                               f"for its stacks ({run_dir / SOCKET})") from None
        server = peer_uid(client)
        if server != os.geteuid():
            raise ControlError(f"run {run_id}: {run_dir / SOCKET} is served by "
                               f"{'an unknown user' if server is None else f'uid {server}'}, not by you: "
                               "not asked (only a tflaunch of your own answers for your runs)")
        data = b""
        try:
            client.sendall(json.dumps(request).encode() + b"\n")
            while len(data) <= MAX_ANSWER:
                chunk = client.recv(1 << 16)
                if not chunk:
                    break
                data += chunk
        except socket.timeout:
            raise ControlError(f"run {run_id}: no answer from its tflaunch within {timeout:g} s") from None
        except OSError:
            data = b""  # closed on us while we spoke: the same as no answer
    finally:
        client.close()
    if not data:
        raise ControlError(f"run {run_id}: its tflaunch closed the connection without an answer (it serves only "
                           f"the user who started the run, and {MAX_CLIENTS} requests at a time)")
    try:
        answer = json.loads(data)
    except (ValueError, RecursionError):
        raise ControlError(f"run {run_id}: the answer is not JSON ({len(data)} bytes)") from None
    if not isinstance(answer, dict) or not answer.get("ok"):
        said = str(answer.get("error")) if isinstance(answer, dict) else "a bad answer"
        raise ControlError(f"run {run_id}: {escaped(said.splitlines()[0] if said else said)}")
    return answer


def peer_uid(conn: socket.socket) -> int | None:
    """The uid of the process at the other end of a Unix socket (``SO_PEERCRED``), None if unknown."""
    try:
        _, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    except OSError:
        return None
    return uid


def escaped(text: str, colours: bool = False) -> str:
    """``text`` with every character a terminal would act on (an escape sequence, a bell, a
    carriage return) written as ``\\xNN``: what a run's tflaunch answers, or a task wrote, is
    shown, never obeyed. With ``colours``, colour and style codes are kept (a task's coloured log)."""
    if colours:
        return _CONTROL_BUT_COLOURS.sub(lambda m: m[0] if len(m[0]) > 1 else f"\\x{ord(m[0]):02x}", text)
    return _CONTROL.sub(lambda match: f"\\x{ord(match[0]):02x}", text)
