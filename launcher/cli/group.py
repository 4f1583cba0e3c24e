"""The ``tflaunch`` click group: ``run`` is the default command and ``--`` marks the task command."""

from __future__ import annotations

import importlib

import click

from .. import __version__

# The module of this package that defines each command. A command's module is imported when that
# command is used (or listed by --help), so a run does not pay for loading every other command.
COMMAND_MODULES = {
    "run": "run", "check": "run",
    "runs": "inspect", "logs": "inspect", "status": "inspect", "report": "inspect", "compare": "inspect",
    "stacks": "inspect",
    "export": "export", "submit": "submit", "tensorboard": "tensorboard",
}


class _DefaultRunGroup(click.Group):
    """A group whose default command is ``run``, with ``--`` marking the task command; each
    command's module is loaded on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(self.commands) | COMMAND_MODULES.keys())

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMAND_MODULES:
            importlib.import_module(f"{__package__}.{COMMAND_MODULES[cmd_name]}")  # registers it on the group
        return self.commands.get(cmd_name)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        first = args[0] if args else None
        if (first is not None and first not in COMMAND_MODULES and first not in self.commands
                and first not in ("--help", "-h", "--version")):
            args = ["run", *args]
        if args and args[0] in ("run", "submit") and "--" in args:  # both take a task command
            cut = args.index("--")
            ctx.meta["tflaunch.command"] = tuple(args[cut + 1:])
            args = args[:cut]
        return super().parse_args(ctx, args)


@click.group(cls=_DefaultRunGroup, invoke_without_command=True,
             context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tflaunch")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """tflaunch: launch, supervise and inspect TensorFlow distributed training.

    \b
    tflaunch CLUSTER.yaml [OPTIONS] [-- CMD ARGS...]   run a cluster file
    tflaunch --local N [OPTIONS] [-- CMD ARGS...]      N workers on this machine
    See "tflaunch run --help" for the run options.
    """
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())
