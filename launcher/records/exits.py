"""How a task ended, in words: the one wording of an exit that the console, the closing summary
and ``tflaunch status`` share (``exit code 1``, ``killed by SIGKILL``, ``SIGTERM from tflaunch``).

Apart from :mod:`.states` because it needs the ``signal`` module, which the cluster's pure modules
(which read the states) must not load.
"""

from __future__ import annotations

import signal as signal_module


def signal_name(number: int) -> str:
    """``SIGKILL`` for 9; ``signal 99`` for a number that names none."""
    try:
        return signal_module.Signals(number).name
    except ValueError:
        return f"signal {number}"


def exit_words(code: int | None, signal: int | None = None, error: str | None = None, stopped: bool = False) -> str:
    """How a task ended: ``exit code 1``, ``killed by SIGKILL``, or what kept it from running (its
    host lost). A task tflaunch ``stopped`` (its state is ``stopped``: the run ended, or another
    task failed) and that ended of tflaunch's signal says ``SIGTERM from tflaunch``: no one killed it."""
    if signal is not None:
        return f"{signal_name(signal)} from tflaunch" if stopped else f"killed by {signal_name(signal)}"
    if error is not None:
        return error
    return f"exit code {code}"
