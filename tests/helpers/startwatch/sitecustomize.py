"""Instrumentation for tests/cli/test_early_signals.py, loaded by Python's site through PYTHONPATH.

It watches one process, the tflaunch the test started (its parent is the test, named in
``STARTWATCH_PARENT``), through an audit hook, which sees every import, open and exec without
changing what runs. At the first audited action after tflaunch's own code began (the exec of
``launcher/__init__.py``), it writes one line to the descriptor ``STARTWATCH_FD``: whether
tflaunch's handlers for the four watched signals were in place then.

The line tells the test two things. Whether the handlers were taken before tflaunch did anything
else, and, when the line was there before the test sent its signal, that the signal landed
after tflaunch's first statements: from then on the signal must end tflaunch with 128+N.
"""

import os
import sys

import _signal  # loaded by every interpreter at start; the public signal module would add imports

_WATCHED = (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP, _signal.SIGQUIT)
_PYTHON_DEFAULTS = (_signal.SIG_DFL, _signal.default_int_handler)
_INIT = os.path.join("launcher", "__init__.py")

_fd = -1
_state = "waiting"  # -> "started" (tflaunch's first statement runs) -> "reported"


def _hook(event, args):
    global _state
    if _state == "reported":
        return
    if _state == "waiting":
        if event == "exec" and getattr(args[0], "co_filename", "").endswith(_INIT):
            _state = "started"
        return
    _state = "reported"
    taken = all(_signal.getsignal(signum) not in _PYTHON_DEFAULTS for signum in _WATCHED)
    os.write(_fd, b"handlers taken\n" if taken else b"handlers default\n")


if os.environ.get("STARTWATCH_PARENT") == str(os.getppid()) and os.environ.get("STARTWATCH_FD"):
    # Only the process the test started: tflaunch's own children inherit the environment, not the descriptor.
    _fd = int(os.environ["STARTWATCH_FD"])
    sys.addaudithook(_hook)
