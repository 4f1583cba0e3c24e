"""The ``tflaunch`` click group: ``run`` is the default command and ``--`` marks the task command
(:class:`TaskCommand`, the class of the commands that take one)."""

from __future__ import annotations

import importlib
import os
import re
import shlex

import click

from .. import __version__
from ..errors import OptionsError
from ..masking import masked_argv

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
            ctx.meta[_IMPLIED] = True  # messages then show the command line as it was typed
        return super().parse_args(ctx, args)

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Unwrapped, as TaskCommand's: "[-- CMD...]" must not be split at its "--".
        formatter.write(f"Usage: {ctx.command_path} {RUN_SOURCES} [OPTIONS] [-- CMD...]\n"
                        f"   or: {ctx.command_path} COMMAND [ARGS]...\n")


_IMPLIED = "tflaunch.implied_run"
# How the commands that run a cluster are told which one, as their usage lines show it.
RUN_SOURCES = "(CLUSTER.yaml | --local N | -H HOSTS)"
# A first word that is a program rather than a cluster file: a Python script or an interpreter.
_PROGRAM = re.compile(r"(.*\.py|python[0-9.]*|.*/python[0-9.]*)")


class ClusterCommand(click.Command):
    """A command told which cluster by the cluster options; ``sources``: how its usage line names them."""

    def __init__(self, *args, sources: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.sources = sources

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write(f"Usage: {_typed(ctx)} [OPTIONS] {self.sources}\n")


class TaskCommand(ClusterCommand):
    """A command that takes a task command after ``--`` (kept apart from the options, in
    ``ctx.meta["tflaunch.command"]``). ``choosers``: its options that name a cluster without a
    file. A task command given without ``--`` is one line saying so, with the command line
    corrected; so is an option of the task command given before ``--``."""

    def __init__(self, *args, sources: str, choosers: tuple[str, ...], **kwargs):
        super().__init__(*args, sources=sources, **kwargs)
        self.choosers = choosers

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # One line, unwrapped: "[-- CMD...]" must not be split at its "--". The command as typed:
        # "tflaunch [OPTIONS] ..." where run was implied.
        formatter.write(f"Usage: {_typed(ctx)} [OPTIONS] {self.sources} [-- CMD...]\n")

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            cut = args.index("--")
            ctx.meta["tflaunch.command"] = tuple(args[cut + 1:])
            args = args[:cut]
        else:
            self._refuse_misplaced_command(ctx, args)
        given = list(args)  # click's parser consumes the list it is given
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as error:
            raise self._unknown_option(ctx, given, error.option_name) from None

    def _unknown_option(self, ctx: click.Context, args: list[str], option: str) -> OptionsError:
        """An option this command lacks: the one it looks like, else the task's option it most
        likely is, with the command line that passes it after ``--``."""
        params = self.get_params(ctx)
        like = close_options(option, params)
        if like:
            return OptionsError(f"{_typed(ctx)} has no option {option}; did you mean {' or '.join(like)}?")
        takes_value = _takes_value(params)
        # The command's own options stay before "--"; the unknown one, and what follows it, go after.
        kept, moved, index = [], [], 0
        while index < len(args):
            arg = args[index]
            name = arg.split("=", 1)[0]
            if name in takes_value:
                step = 2 if takes_value[name] and "=" not in arg else 1
                kept += args[index:index + step]
                index += step
            else:
                (moved if moved or arg == option or arg.startswith(option + "=") else kept).append(arg)
                index += 1
        command = ctx.meta.get("tflaunch.command")
        cluster_file = any(word.endswith((".yaml", ".yml")) for word in kept)
        if command is None:
            from ..cluster.plan import DEFAULT_COMMAND  # only on this error: the plan module is not light

            command = ("CMD",) if cluster_file else DEFAULT_COMMAND
        fixed = f"{_typed(ctx)} {shlex.join(masked_argv([*kept, '--', *command, *moved]))}"
        return OptionsError(f"{_typed(ctx)} has no option {option}; to pass it to the command, put it after --: "
                            f"{fixed}")

    def _refuse_misplaced_command(self, ctx: click.Context, args: list[str]) -> None:
        """OptionsError when ``args`` hold a task command without ``--``: a program where the cluster
        file goes (``tflaunch train.py``), or words after the cluster (``tflaunch --local 2 python
        train.py``, ``tflaunch c.yaml python train.py``)."""
        words = _positionals(args, self.get_params(ctx))
        if not words:
            return
        chosen = any(arg.split("=", 1)[0] in self.choosers for arg in args[:words[0]])
        first = args[words[0]]
        cluster_file = first.endswith((".yaml", ".yml")) or (not first.endswith(".py") and os.path.isfile(first))
        if cluster_file:
            start = words[1] if len(words) > 1 else None
        else:
            start = words[0] if chosen or len(words) > 1 or _PROGRAM.fullmatch(first) else None
        if start is None:
            return  # a cluster file, or a name the cluster reader answers for
        command = args[start:]
        if command[0].endswith(".py"):
            command = ["python", *command]
        choose = [] if chosen or cluster_file else ["--local", "N"]
        fixed = f"{_typed(ctx)} {shlex.join(masked_argv([*args[:start], *choose, '--', *command]))}"
        if start == words[0] and not chosen and first.endswith(".py"):
            raise OptionsError(f"{first} is a Python script, not a cluster file; the task command goes after '--': {fixed}")
        raise OptionsError(f"the task command goes after '--': {fixed}")


def _typed(ctx: click.Context) -> str:
    """The command as the user typed it: ``tflaunch`` alone where ``run`` was implied."""
    return ctx.find_root().command_path if ctx.meta.get(_IMPLIED) else ctx.command_path


def close_options(option: str, params: list[click.Parameter]) -> list[str]:
    """The options of ``params`` that ``option`` was most likely meant to be (a typo: ``--loacl`` for
    ``--local``), compared without their dashes so that the dashes alone never make two names alike."""
    long = option.startswith("--")
    names = {name.lstrip("-"): name for name in _takes_value(params) if name.startswith("--") == long}
    import difflib  # only for a mistyped option: not loaded at every start

    return [names[match] for match in difflib.get_close_matches(option.lstrip("-"), names, n=2, cutoff=_ALIKE)]


# How alike (difflib's ratio, 0 to 1) a mistyped option and a real one must be to suggest it:
# "loacl" and "local" are 0.8 alike, "epochs" and "ps" 0.5.
_ALIKE = 0.75


def _takes_value(params: list[click.Parameter]) -> dict[str, bool]:
    """Each option name of ``params`` and whether it takes a value."""
    return {name: not (param.is_flag or param.count) for param in params if isinstance(param, click.Option)
            for name in (*param.opts, *param.secondary_opts)}


def _positionals(args: list[str], params: list[click.Parameter]) -> list[int]:
    """Where the words of ``args`` that are no option nor an option's value are; empty at an unknown
    option before any word (click names it)."""
    takes_value = _takes_value(params)
    found, index = [], 0
    while index < len(args):
        arg = args[index]
        if arg.startswith("-") and arg != "-":
            name = arg.split("=", 1)[0] if arg.startswith("--") else arg[:2]
            if name not in takes_value:
                return found
            attached = "=" in arg if arg.startswith("--") else len(arg) > 2
            index += 2 if takes_value[name] and not attached else 1
            continue
        found.append(index)
        index += 1
    return found


@click.group(cls=_DefaultRunGroup, invoke_without_command=True,
             context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tflaunch")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """tflaunch: launch, supervise and inspect TensorFlow distributed training.

    \b
    tflaunch CLUSTER.yaml [OPTIONS] [-- CMD ARGS...]   run a cluster file
    tflaunch --local N [OPTIONS] [-- CMD ARGS...]      N workers on this machine
    tflaunch --local 2 -- python my_train.py           your own script on 2 workers
    See "tflaunch run --help" for the run options.
    """
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())
