"""Entry point of ``tflaunch`` and ``python -m launcher``: take over signals, then load the CLI.

Signals are installed before click and the rest of tflaunch are imported, so a Ctrl-C at any
moment of the start ends tflaunch quietly (see :mod:`launcher.run.signals`) instead of in a
KeyboardInterrupt traceback.
"""

import sys


def main() -> None:
    from .run.signals import SIGNALS, Interrupted

    SIGNALS.install()
    try:
        from .cli import main as cli_main
    except Interrupted as interrupted:
        sys.exit(interrupted.exit_code)
    cli_main()


if __name__ == "__main__":
    main()
