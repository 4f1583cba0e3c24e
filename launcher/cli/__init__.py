"""Command line: click commands and the single error boundary. Everything else lives below.

``tflaunch CLUSTER.yaml [-- CMD ...]`` and ``tflaunch --local N [-- CMD ...]`` run a cluster
(``run``, the default command of the group in :mod:`.group`, is in :mod:`.run` with ``check``);
:mod:`.inspect` holds the commands that read run folders, and :mod:`.export`, :mod:`.submit` and
:mod:`.tensorboard` one command each; :mod:`.options` defines the options that choose a cluster once
for ``run``, ``check`` and ``export``, and :mod:`.joining` the options of a run every node starts
itself (``--nnodes``, ``--node-rank``, ``--rdzv-endpoint``). :func:`main` is the one place errors become messages and exit
codes, all in one format.
"""

from __future__ import annotations

import sys

import click

from ..errors import LaunchError
from ..run.lifecycle.signals import Interrupted
from .group import cli, close_options  # each command's module registers it on the group when it is first used

__all__ = ["cli", "main"]


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: the one place domain errors become messages and exit codes."""
    try:
        # Without standalone mode click returns what ctx.exit() was given instead of exiting, and
        # still ends the process with 1 itself on a broken pipe.
        code = cli.main(args=argv, prog_name="tflaunch", standalone_mode=False)
        sys.exit(code if isinstance(code, int) else 0)
    except click.NoSuchOption as error:  # the commands that take a task command say more (TaskCommand)
        like = close_options(error.option_name, error.ctx.command.get_params(error.ctx)) if error.ctx else []
        hint = f"; did you mean {' or '.join(like)}?" if like else f"; see '{error.ctx.command_path} --help'" \
            if error.ctx else ""
        where = error.ctx.command_path if error.ctx else "tflaunch"
        _fail(f"{where} has no option {error.option_name}{hint}", error.exit_code)
    except click.UsageError as error:
        # click's usage errors (an unknown option, a bad value) take the one format too; the usage
        # line and the pointer to --help stay above it.
        if error.ctx is not None:
            click.echo(f"{error.ctx.get_usage()}\nTry '{error.ctx.command_path} --help' for help.", err=True)
        _fail(error.format_message(), error.exit_code)
    except click.ClickException as error:
        _fail(error.format_message(), error.exit_code)
    except click.Abort:
        sys.exit(130)
    except Interrupted as interrupted:  # a signal before any task started, or after the run ended
        sys.exit(interrupted.exit_code)
    except LaunchError as error:
        _fail(str(error), error.exit_code)


def _fail(message: str, exit_code: int) -> None:
    """The one format of every user error: ``tflaunch: error: <message>`` on stderr, then the exit; an
    error of several lines (every mistake of a cluster file) has that form on each of them."""
    for line in message.splitlines() or [message]:
        click.echo(f"tflaunch: error: {line}", err=True)
    sys.exit(exit_code)
