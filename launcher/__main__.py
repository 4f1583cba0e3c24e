"""Entry point of ``tflaunch`` and ``python -m launcher``: take over signals, then load the CLI.

Signals are installed before click and the rest of tflaunch are imported, so a Ctrl-C at any
moment of the start ends tflaunch quietly (see :mod:`launcher.run.signals`) instead of in a
KeyboardInterrupt traceback.
"""

import sys


def main() -> None:
    try:
        # Until the handlers are in place Python's own SIGINT handler raises KeyboardInterrupt:
        # importing the signal module alone takes a few milliseconds.
        from .run.signals import SIGNALS, Interrupted

        SIGNALS.install()
    except KeyboardInterrupt:
        sys.exit(130)
    try:
        from .cli import main as cli_main
    except Interrupted as interrupted:
        sys.exit(interrupted.exit_code)
    cli_main()


if __name__ == "__main__":
    main()
