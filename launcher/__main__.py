"""Entry point of ``tflaunch`` and ``python -m launcher``: take over signals, then load the CLI.

The package's first statements have already taken over the watched signals (see :mod:`launcher`);
:func:`main` does it again for any other way in. Until a run starts, a signal ends tflaunch at
once and quietly with 128+N; a run hands the signals to :mod:`launcher.run.signals`.
"""

import sys

from . import take_over_signals_early


def main() -> None:
    try:
        take_over_signals_early()  # again: the package does it only for the names it knows
    except KeyboardInterrupt:  # a Ctrl-C from before it, raised when the handler changes
        sys.exit(130)
    from .cli import main as cli_main
    from .run.signals import Interrupted

    try:
        cli_main()
    except Interrupted as interrupted:  # after a run, one that came outside the CLI's boundary
        sys.exit(interrupted.exit_code)


if __name__ == "__main__":
    main()
