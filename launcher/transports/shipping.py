"""Shipping the host agent (:mod:`launcher.agent`) to a host that has only a Python: its modules
bundled into one source, the command line that runs it, with its bytecode and its source on that
line (srun) or first on its stdin (ssh), the agent's one argument, and what it needs to start a
task. The remote transports (ssh, srun) share these; neither imports the other."""

from __future__ import annotations

import base64
import functools
import re
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ..agent.protocol import EOF_GRACE, HEARTBEAT, SAMPLE, encode_fields
from ..taskenv import RDZV_TOKEN

if TYPE_CHECKING:  # a node that joins a run loads this module for its agent's command line only
    from ..cluster.plan import TaskLaunch

AGENT_PACKAGE = Path(__file__).resolve().parent.parent / "agent"  # its modules are read here as text
AGENT_MAIN = "loop"  # the module whose ``main`` runs the agent: last in the bundle, which runs it
# On this machine (and on a node that runs tflaunch itself) the agent's package is imported as it
# is, not bundled, so that its compiled form is Python's cache. The folder above it goes at the end
# of sys.path (the standard library must win over any module there), and the package is imported by
# its own name: launcher's __init__ stays out.
AGENT_BOOT = (f"import sys; sys.path.append({str(AGENT_PACKAGE.parent)!r}); "
              f"from {AGENT_PACKAGE.name} import {AGENT_MAIN}; {AGENT_MAIN}.main()")


def agent_modules(folder: Path = AGENT_PACKAGE) -> dict[str, str]:
    """The agent package's modules (name: source), each after every module it imports."""
    sources = {path.stem: path.read_text() for path in sorted(folder.glob("*.py")) if path.stem != "__init__"}
    needs = {name: set(_SIBLING.findall(text)) for name, text in sources.items()}
    ordered: list[str] = []
    while len(ordered) < len(sources):
        ready = [name for name in sources if name not in ordered and needs[name] <= set(ordered)
                 and (name != AGENT_MAIN or len(ordered) == len(sources) - 1)]
        if not ready:
            left = sorted(set(sources) - set(ordered))
            raise ValueError(f"the agent's modules import each other in a circle: {left}")
        ordered.append(ready[0])
    return {name: sources[name] for name in ordered}


# An import of another of the agent's modules: a line of its own at a module's top level, its
# names in parentheses when they take more than one line. Read as text, not parsed: building the
# bundle then costs under a millisecond, and a test holds the result to what the parser reads.
_SIBLING = re.compile(r"^from \.(\w+) import ", re.MULTILINE)
_SIBLING_IMPORT = re.compile(r"^from \.\w+ import (?:\([^)]*\)|[^\n(]*)\n", re.MULTILINE)
_DOCSTRING = re.compile(r'\A"""(?:[^"\\]|\\.|"(?!""))*"""\n')
_COMMENT_LINE = re.compile(r"^[ \t]*#.*\n", re.MULTILINE)  # a line that is only a comment
# A docstring that opens a function's or class's body with more of the body after it, at its indent
# (so that the body stays a body without it).
_BLOCK_DOCSTRING = re.compile(r':\n([ \t]+)"""(?:[^"\\]|\\.|"(?!""))*"""\n(?=(?:[ \t]*\n)*\1\S)')


def bundle(modules: dict[str, str]) -> str:
    """``modules`` (name: source, in order) as one source: each module's imports of the others, its
    docstrings and its comment lines (read here, not on a host: the srun command line carries the
    whole source) taken out, a comment line naming where each starts."""
    def shipped(text: str) -> str:
        text = _SIBLING_IMPORT.sub("", _DOCSTRING.sub("", text))
        return _BLOCK_DOCSTRING.sub(":\n", _COMMENT_LINE.sub("", text))

    return "\n\n".join(f"# -- {name}.py\n" + shipped(text) for name, text in modules.items())


@functools.cache
def agent_source() -> str:
    """The agent as one source, as it is shipped (built once per tflaunch process)."""
    return bundle(agent_modules())


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
    """(bytecode, source, magic number), the first two compressed: the bundle compiled once here,
    so that no host compiles it when its Python reads this one's bytecode."""
    import marshal
    from importlib.util import MAGIC_NUMBER

    source = agent_source()
    code = compile(source, "tflaunch-agent", "exec", optimize=2)  # no docstrings: a shorter command line
    # Level 6: the bytecode in 72 KB and the source in 26 KB as srun's command line carries them
    # (base64, two words: Linux takes up to 128 KiB each), where level 1 takes 79 and 31 KB; 23 ms
    # of CPU once per tflaunch process with remote hosts (level 1: 6 ms, level 9: 83 ms for 1 KB
    # less). A host unpacks either in under 1 ms.
    return zlib.compress(marshal.dumps(code), 6), zlib.compress(source.encode(), 6), MAGIC_NUMBER


@functools.lru_cache(maxsize=None)
def _agent_in_base64() -> tuple[str, str]:
    code, source, _ = _packed_agent()
    return base64.b64encode(code).decode("ascii"), base64.b64encode(source).decode("ascii")


SETUP_VARIABLE = "TFLAUNCH_SETUP"  # a setup line, in the environment of the shell that runs it, until it ran


def agent_spec(grace: float, keepalive: float, sample: float = SAMPLE, connect: str | None = None,
               setup_log: int | None = None, beat: float = HEARTBEAT) -> str:
    """The host agent's one argument (see :mod:`launcher.agent.loop`)."""
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
    from ..cluster.tfconfig import tf_config_parts  # loaded by then: the plan made the launch

    tf_config, env = tf_config_parts(launch.env)  # the link sends the cluster once per host
    if launch.setup and launch.setup != host_setup:
        argv, env = setup_in_front(argv), {**env, SETUP_VARIABLE: launch.setup}
    return {"name": launch.name, "argv": argv, "env": env, "tf_config": tf_config, "cwd": launch.workdir,
            "grace": repr(float(grace)),
            "release": launch.address.rsplit(":", 1)[1],  # a port the agent picked and holds for it
            **watch_fields(launch)}


def watch_fields(launch: TaskLaunch) -> dict[str, str | None]:
    """A task's fields for the straggler rule: ``watch``, the seconds between its agent's looks at
    its threads, and the ``gpus`` whose clocks it reads; none for a task not watched."""
    if not launch.watch_every:
        return {"watch": None, "gpus": None}
    return {"watch": repr(float(launch.watch_every)), "gpus": ",".join(map(str, launch.gpus)) or None}


def without_token(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` for an agent on this machine: without the rendezvous token, which its tasks must
    not inherit (it is tflaunch's, proven on the channel and never passed on)."""
    return {name: value for name, value in environ.items() if name != RDZV_TOKEN}
