"""Shipping the host agent (:mod:`.hostagent`) to a host that has only a Python: the command line
that runs it, with its bytecode and its source on that line, the agent's one argument, and what it
needs to start a task. The remote transports (ssh, srun) share these; neither imports the other."""

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
        # Level 6, not 9: 2% more bytes on the command line, a quarter of the CPU (5 ms, not 19,
        # at every run's start).
        return base64.b64encode(zlib.compress(data, 6)).decode("ascii")

    return pack(marshal.dumps(code)), pack(AGENT_SOURCE.encode()), MAGIC_NUMBER


def agent_spec(grace: float, keepalive: float, sample: float = SAMPLE, connect: str | None = None,
               setup_log: int | None = None, beat: float = HEARTBEAT) -> str:
    """The host agent's one argument (see :mod:`.hostagent`)."""
    return encode_fields({"keepalive": keepalive, "eof_grace": min(grace, EOF_GRACE), "sample": sample,
                          "beat": beat, "connect": connect, "setup_log": setup_log})


def task_fields(launch: TaskLaunch, grace: float, host_setup: str | None) -> dict[str, object]:
    """What the agent needs to start ``launch``; a setup other than the host's runs in front of it."""
    argv = list(launch.argv)
    if launch.setup and launch.setup != host_setup:
        argv = ["/bin/sh", "-c", f'{launch.setup}\nexec "$0" "$@"', *argv]
    tf_config, env = tf_config_parts(launch.env)  # the link sends the cluster once per host
    return {"name": launch.name, "argv": argv, "env": env, "tf_config": tf_config, "cwd": launch.workdir,
            "grace": repr(float(grace)),
            "release": launch.address.rsplit(":", 1)[1]}  # a port the agent picked and holds for it
