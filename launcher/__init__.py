"""tflaunch: launch, supervise and inspect TensorFlow distributed training clusters.

When this process is the ``tflaunch`` command (its console script, or ``python -m launcher``), the
package's first statements take over SIGINT, SIGTERM, SIGHUP and SIGQUIT: until a run starts and
hands them to :mod:`launcher.run.lifecycle.signals`, such a signal ends the process at once with 128+N, as
nothing exists yet that must be stopped or recorded. A program that imports the package gets no
handler from it: the Python API takes SIGINT only inside ``launch()``.

Its packages and modules, top to bottom, each importing only those below it (``.importlinter``):
__main__.py (``python -m launcher``), cli/ (the command line and its one error boundary), api.py
(``launch()``, ``runs()`` and ``run_record()`` for Python), export/, inspect/ and tensorboard.py
(manifests and shell commands, the read side, TensorBoard on a run folder), sources/ (where a run
may run), run/ (a run started, watched and recorded), slurm/ and transports/ (Slurm's commands, how
a task is started where it runs), cluster/ (what a cluster is and how each of its tasks starts),
records/ (run folders and the run record), options.py (the run options as each front end names
them), errors.py, taskenv.py and units.py (the domain errors; the ``TFLAUNCH_*`` variables of every
task; sizes and groups as this machine reads them), masking.py and agent/ (secrets masked wherever shown; the host agent, standard library only).
"""

import os
import sys

import _signal  # loaded by every interpreter at start; the signal module would first build its enums

WATCHED_SIGNALS = (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP, _signal.SIGQUIT)


def _end_now(signum: int, frame: object) -> None:
    # os._exit, not an exception: raised from a handler, an exception can land in an import's
    # callback, where Python prints and drops it, or be wrapped in another error. Before a run
    # nothing needs an orderly stop: a host check's agents end when tflaunch's pipes close, and
    # the kernel drops its port locks.
    os._exit(128 + signum)


def take_over_signals_early() -> None:
    """Until a run starts, a watched signal ends the process at once with 128+N (main thread only)."""
    for signum in WATCHED_SIGNALS:
        _signal.signal(signum, _end_now)


def _started_as_command() -> bool:
    """Whether this process is the tflaunch command rather than a program importing the package."""
    argv = getattr(sys, "argv", None) or [""]
    if argv[0] == "-m":
        # runpy imports the package before it sets sys.argv[0]. sys.orig_argv ends with the
        # command's own arguments; before them stands the module, alone ("-m launcher") or joined
        # to its option ("-mlauncher", "-Imlauncher").
        orig = getattr(sys, "orig_argv", [])
        named = orig[len(orig) - len(argv)] if len(orig) > len(argv) else ""
        module = named[1:].partition("m")[2] if named.startswith("-") else named
        return module in ("launcher", "launcher.__main__")
    return os.path.basename(argv[0]) == "tflaunch"  # the console script, before it rewrites argv[0]


if _started_as_command():
    try:
        take_over_signals_early()
    except KeyboardInterrupt:  # a Ctrl-C during Python's start, raised when the handler changes
        os._exit(128 + _signal.SIGINT)

__version__ = "0.1.0"

__all__ = ["LaunchFailed", "LaunchInterrupted", "LaunchResult", "__version__", "launch", "run_record", "runs"]
_API = ("LaunchFailed", "LaunchInterrupted", "LaunchResult", "launch", "run_record", "runs")


def __getattr__(name: str):
    # The Python API (launcher/api.py) loads on first use, so "import launcher" stays cheap.
    if name in _API:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'launcher' has no attribute {name!r}")
