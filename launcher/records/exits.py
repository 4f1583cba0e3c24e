"""How a task ended, in words: the one wording of an exit that the console, the closing summary
and ``tflaunch status`` share (``exit code 1``, ``killed by SIGKILL``).

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


def exit_words(code: int | None, signal: int | None = None, error: str | None = None) -> str:
    """How a task ended: ``exit code 1``, ``killed by SIGKILL``, or what kept it from running (its host lost)."""
    if signal is not None:
        return f"killed by {signal_name(signal)}"
    if error is not None:
        return error
    return f"exit code {code}"
