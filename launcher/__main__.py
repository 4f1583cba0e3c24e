"""Entry point of ``tflaunch`` and ``python -m launcher``: take over signals, then load the CLI.

The package's first statements have already taken over the watched signals (see :mod:`launcher`);
:func:`main` does it again for any other way in. Until a run starts, a signal ends tflaunch at
once and quietly with 128+N; a run hands the signals to :mod:`launcher.run.lifecycle.signals`.
"""

import os
import sys

from . import take_over_signals_early


def main() -> None:
    try:
        take_over_signals_early()  # again: the package does it only for the names it knows
    except KeyboardInterrupt:  # a Ctrl-C from before it, raised when the handler changes
        sys.exit(130)
    from .cli import main as cli_main
    from .run.lifecycle.signals import Interrupted

    try:
        cli_main()
    except Interrupted as interrupted:  # after a run, one that came outside the CLI's boundary
        _end(interrupted.exit_code)
    except SystemExit as done:
        _end(done.code)
    _end(0)


def _end(code: int | None) -> None:
    """End the process once the command is done, without tearing the interpreter down.

    Every file of a run is closed and every process tflaunch started is waited for by then; what
    Python's own exit would add is freeing each of the 230-odd modules the CLI loaded, which takes
    20 ms and more after every command. Only the standard streams may still hold output. The CLI's
    boundary exits with a number only (:func:`launcher.cli.main`)."""
    code = code or 0
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # nobody reads any more (a closed pipe), or the stream is closed
            code = code or 1  # as Python's exit after a failed flush: 1, not the command's 0
    os._exit(code)


if __name__ == "__main__":
    main()
