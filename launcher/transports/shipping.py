"""Shipping the host agent (:mod:`.hostagent`) to a host that has only a Python: the command line
that runs it, with its bytecode and its source on that line (srun) or first on its stdin (ssh),
the agent's one argument, and what it needs to start a task. The remote transports (ssh, srun)
share these; neither imports the other."""

from __future__ import annotations

import base64
import functools
import zlib
from pathlib import Path

from ..cluster.plan import TaskLaunch
from ..cluster.tfconfig import tf_config_parts
from .hostagent import EOF_GRACE, HEARTBEAT, SAMPLE, encode_fields

AGENT_PATH = Path(__file__).with_name("hostagent.py")
AGENT_SOURCE = AGENT_PATH.read_text()

# The agent on a host that has only a Python: its bytecode, which the host runs without compiling
# when its Python reads this one's bytecode (the same magic number), else its source. Both travel
# compressed: over ssh on the agent's stdin, ahead of the protocol (the command line stays short,
# so neither the login shell nor an interpreter shim such as pyenv's copies them, and `ps` on the
# host shows a line, not 70 KB); under srun, which gives the agent no stdin, on its command line.
_RUN_SHIPPED = """magic = getattr(sys.modules.get("_frozen_importlib_external"), "MAGIC_NUMBER", b"")
if binascii.hexlify(magic).decode() == %r:
    import marshal
    code = marshal.loads(unpack(code))
else:
    code = compile(unpack(source), "tflaunch-agent", "exec")
del source, magic, unpack
exec(code)
"""

_ARGV_BOOT = """import binascii, sys, zlib
code, source = sys.argv.pop(1), sys.argv.pop(1)
def unpack(text):
    return zlib.decompress(binascii.a2b_base64(text))
""" + _RUN_SHIPPED

_STDIN_BOOT = """import binascii, os, sys, zlib
def take(size):
    # Exactly size bytes, unbuffered: the protocol's frames follow them on stdin.
    parts = []
    while size:
        part = os.read(0, size)
        if not part:
            sys.exit(0)  # tflaunch went away before the agent arrived
        parts.append(part)
        size -= len(part)
    return b"".join(parts)
code, source = take(int(sys.argv.pop(1))), take(int(sys.argv.pop(1)))
unpack = zlib.decompress
del take
""" + _RUN_SHIPPED


def remote_agent_argv(python: str, magic: bytes | None = None) -> list[str]:
    """The command line that carries the agent and runs it with ``python`` on any host (srun's
    way); the caller appends the spec.

    -I -S: the agent needs only the standard library; skipping site and the user's paths saves
    start-up on every host, and keeps a PYTHONPATH meant for the tasks from shadowing a module the
    agent uses. ``magic`` is the bytecode version the shipped bytecode claims (this Python's, by default)."""
    code, source = _agent_in_base64()
    return [python, "-I", "-S", "-c", _boot(_ARGV_BOOT, magic), code, source]


def stdin_agent_argv(python: str, magic: bytes | None = None) -> list[str]:
    """The command line that runs the agent with ``python`` on any host from what its stdin
    carries first, :func:`agent_payload` (ssh's way); the caller appends the spec. As
    :func:`remote_agent_argv` otherwise."""
    code, source, _ = _packed_agent()
    return [python, "-I", "-S", "-c", _boot(_STDIN_BOOT, magic), str(len(code)), str(len(source))]


@functools.lru_cache(maxsize=None)
def agent_payload() -> bytes:
    """What a channel carries ahead of every command to an agent started by :func:`stdin_agent_argv`
    (joined once: every host gets the same bytes)."""
    code, source, _ = _packed_agent()
    return code + source


def _boot(text: str, magic: bytes | None) -> str:
    return text % (_packed_agent()[2] if magic is None else magic).hex()


@functools.lru_cache(maxsize=None)
def _packed_agent() -> tuple[bytes, bytes, bytes]:
    """(bytecode, source, magic number), the first two compressed: the bytecode comes from
    Python's own cache of the agent module when it is fresh, so a run does not compile the agent either."""
    import marshal
    from importlib.machinery import SourceFileLoader
    from importlib.util import MAGIC_NUMBER

    code = SourceFileLoader("hostagent", str(AGENT_PATH)).get_code("hostagent")
    # Level 1: 58 KB, not 52 (level 6) or 51 (level 9), for 2.5 ms of CPU, not 5.6 or 20, ahead of
    # the first host's connection at every run's start; the host unpacks either in under 1 ms.
    return zlib.compress(marshal.dumps(code), 1), zlib.compress(AGENT_SOURCE.encode(), 1), MAGIC_NUMBER


@functools.lru_cache(maxsize=None)
def _agent_in_base64() -> tuple[str, str]:
    code, source, _ = _packed_agent()
    return base64.b64encode(code).decode("ascii"), base64.b64encode(source).decode("ascii")


SETUP_VARIABLE = "TFLAUNCH_SETUP"  # a setup line, in the environment of the shell that runs it, until it ran


def agent_spec(grace: float, keepalive: float, sample: float = SAMPLE, connect: str | None = None,
               setup_log: int | None = None, beat: float = HEARTBEAT) -> str:
    """The host agent's one argument (see :mod:`.hostagent`)."""
    return encode_fields({"keepalive": keepalive, "eof_grace": min(grace, EOF_GRACE), "sample": sample,
                          "beat": beat, "connect": connect, "setup_log": setup_log})


def setup_in_front(argv: list[str]) -> list[str]:
    """``argv`` run after the setup line in :data:`SETUP_VARIABLE` of its environment, which no
    command line shows (every user of a host can read them) and which is gone before ``argv``
    starts; ``argv`` passes through "$@" unchanged."""
    return ["/bin/sh", "-c", f'eval "${SETUP_VARIABLE}"\nunset {SETUP_VARIABLE}\nexec "$0" "$@"', *argv]


def task_fields(launch: TaskLaunch, grace: float, host_setup: str | None) -> dict[str, object]:
    """What the agent needs to start ``launch``; a setup other than the host's runs in front of it."""
    argv = list(launch.argv)
    tf_config, env = tf_config_parts(launch.env)  # the link sends the cluster once per host
    if launch.setup and launch.setup != host_setup:
        argv, env = setup_in_front(argv), {**env, SETUP_VARIABLE: launch.setup}
    return {"name": launch.name, "argv": argv, "env": env, "tf_config": tf_config, "cwd": launch.workdir,
            "grace": repr(float(grace)),
            "release": launch.address.rsplit(":", 1)[1],  # a port the agent picked and holds for it
            "watch": "1" if launch.watched else None,
            "gpus": ",".join(map(str, launch.gpus)) if launch.watched and launch.gpus else None}
