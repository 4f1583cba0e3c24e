"""A node that joins a run (``--nnodes N --node-rank R`` with R > 0): this process becomes the
node's host agent.

The node's tflaunch parses its options, then replaces itself with the agent (``exec``): the node
runs one process, as an ssh host does, not a tflaunch that starts the agent as a second
interpreter and relays its output. The agent dials rank 0 (:mod:`.joined` holds that side),
proves the run's token, serves this node's tasks, echoes their lines on this process's stderr,
says in one line how the run ended for this node, and exits with the run's exit code. The token
reaches it on a pipe as its stdin, read once; it is in no environment and on no command line.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

from ..agent.protocol import EOF_GRACE, beat_for, encode_fields, sample_for
from ..options import DEFAULT_KEEPALIVE_TIMEOUT
from .shipping import AGENT_BOOT, without_token


def agent_argv(host: str, port: int, rank: int, within: float, grace: float, nnodes: int) -> list[str]:
    """The command line of the agent of node ``rank``, which joins the run at ``host:port``."""
    spec = encode_fields({"keepalive": DEFAULT_KEEPALIVE_TIMEOUT, "eof_grace": min(grace, EOF_GRACE),
                          "sample": sample_for(nnodes), "beat": beat_for(nnodes, DEFAULT_KEEPALIVE_TIMEOUT),
                          "connect": f"{host} {port}", "connect_within": within, "join": str(rank), "echo": "1"})
    return [sys.executable, "-I", "-S", "-c", AGENT_BOOT, spec]


def become_agent(host: str, port: int, rank: int, token: str, within: float, grace: float, nnodes: int) -> NoReturn:
    """Replace this process with node ``rank``'s agent (see the module docstring); OSError when
    the interpreter cannot be run."""
    argv = agent_argv(host, port, rank, within, grace, nnodes)
    read, write = os.pipe()
    os.write(write, token.encode() + b"\n")  # far below a pipe's buffer
    os.close(write)
    os.dup2(read, 0)  # inheritable: the agent's stdin, which it reads once and then points at /dev/null
    os.close(read)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os.execve(argv[0], argv, without_token(os.environ))
