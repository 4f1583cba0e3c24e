"""The options that choose a cluster, written once for ``run``, ``check`` and ``export``, and the
run options as flags.

:func:`cluster_options` gives a command CLUSTER.yaml, ``--local``, ``-H``/``--hosts``, ``--hostfile``,
``--chief``, ``--ps`` and ``--evaluator`` (and ``--gpus`` where the command places GPUs), each with
one help text, and hands the command their values as one
:class:`~launcher.sources.choose.ClusterChoice`, whose ``source()`` is the source they name (the
rule, and the check of every count, is that class's, which launch() uses too: the flags here only
parse their text).

:func:`run_option` makes the flag of one of :class:`~launcher.options.RunOptions`' fields, with
that field's default, help and metavar; its type only parses the text, and RunOptions checks the value.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import MISSING, fields
from typing import Any

import click

from ..options import STRAGGLER_ACTIONS, RunOptions, gpu_indices
from ..options import name as option_name
from ..sources.choose import ClusterChoice

def _parse_gpus(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, ...]:
    return gpu_indices("gpus", value)


# Outermost first, as they show in --help: each parameter's declarations and settings. The role
# options say nothing of --slurm, which only run has: its own help names the role options it takes.
_OPTIONS: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "cluster": (("cluster",), {"required": False, "metavar": "CLUSTER.yaml"}),
    "local": (("--local", "local"), {"type": int, "metavar": "N", "help": "Run N workers on this machine."}),
    "hosts": (("-H", "--hosts"), {"metavar": "HOST:SLOTS,...",
                                  "help": "One task per slot on these hosts, e.g. node1:4,node2:4 (localhost: this "
                                          "machine; others over ssh); free ports on every host."}),
    "hostfile": (("--hostfile",), {"metavar": "FILE",
                                   "help": "Like -H, from an MPI/DeepSpeed hostfile: one 'HOST slots=N' per line."}),
    "chief": (("--chief",), {"is_flag": True, "help": "With --local: add a chief task. With -H/--hostfile: the "
                                                      "first slot runs the chief."}),
    "ps": (("--ps",), {"type": int, "default": 0, "metavar": "K",
                       "help": "With --local: add K parameter-server tasks; with -H/--hostfile: the K slots after the "
                               "chief's (implies --chief)."}),
    "evaluator": (("--evaluator",), {"is_flag": True, "help": "With -H/--hostfile: the last slot runs an evaluator."}),
    "spares": (("--spares",), {"metavar": "HOST[:SLOTS],...",
                               "help": "With -H/--hostfile: spare hosts; a lost host's tasks move to a spare slot at "
                                       "the next restart."}),
}
# What --spares means besides, in a command that has --slurm.
_SLURM_SPARES = {"metavar": "HOST[:SLOTS],...|K", "help": _OPTIONS["spares"][1]["help"] + " With --slurm: hold the "
                 "allocation's last K nodes back as spares."}
_GPUS = click.option("--gpus", callback=_parse_gpus, metavar="LIST",
                     help="With --local: GPU indices (e.g. 0,1) dealt round-robin to chief and workers; with "
                          "-H/--hostfile: each host's GPUs, dealt to that host's chief and workers.")


_GIVEN = tuple(f.name for f in fields(ClusterChoice) if not f.name.startswith("takes_"))


def cluster_options(*, gpus: bool, slurm: bool = False,
                    words: dict[str, str] | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add the cluster options to a command (placed right under ``@cli.command``); the command receives
    their values as ``choice``, a :class:`ClusterChoice`, instead of one parameter each. ``gpus``: the
    command has ``--gpus``; ``slurm``: it has ``--slurm`` too (its messages may name it); ``words``:
    the help of the options whose meaning differs for this command, by option (``local``)."""
    words = {**(words or {}), **({"spares": _SLURM_SPARES["help"]} if slurm else {})}
    options = [click.argument(*names, **settings) if name == "cluster"
               else click.option(*names, **{**settings, **({"help": words[name]} if name in words else {}),
                                            **({"metavar": _SLURM_SPARES["metavar"]} if slurm and name == "spares"
                                               else {})})
               for name, (names, settings) in _OPTIONS.items()]

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(command)
        def with_choice(*args: Any, **kwargs: Any) -> Any:
            given = {name: kwargs.pop(name) for name in _GIVEN if name in kwargs}
            return command(*args, choice=ClusterChoice(**given, takes_gpus=gpus, takes_slurm=slurm), **kwargs)

        for option in reversed([*options, *((_GPUS,) if gpus else ())]):
            with_choice = option(with_choice)
        return with_choice

    return decorate


def _parse_env(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, str | None]:
    """``--env``'s items as a mapping; :func:`launcher.cluster.fields.env_items` owns their syntax."""
    from ..cluster.fields import env_items

    try:
        return env_items(values)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _parse_threads(ctx: click.Context, param: click.Parameter, value: str | None) -> int | str | None:
    """A count as a number; any other word is left for RunOptions to take or refuse."""
    return int(value) if value is not None and value.isascii() and value.isdigit() else value


def _parse_names(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[str, ...]:
    return tuple(name.strip() for name in (value or "").split(",") if name.strip())


_RUN_OPTIONS = {option.name: option for option in fields(RunOptions) if option.name != "command"}  # after --
# How the text of a run option's flag becomes a value, where its field's ``parse`` type does not say.
_PARSERS: dict[str, dict[str, Any]] = {"env": {"callback": _parse_env, "multiple": True},
                                       "threads": {"callback": _parse_threads},
                                       "tasks": {"callback": _parse_names},
                                       "on_straggler": {"type": click.Choice(STRAGGLER_ACTIONS)}}


def run_option(option: str, *short: str, **settings: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The flag of the run option ``option`` (``--grace`` for ``grace``, with ``short`` forms before
    it), passing its value as ``option``; ``settings`` add to or override click's (``default=None``
    where a command passes the option on only when it is given)."""
    spec = _RUN_OPTIONS[option]
    default = spec.default_factory() if spec.default_factory is not MISSING else spec.default
    shown: dict[str, Any] = {"help": spec.metadata["help"], "metavar": spec.metadata["metavar"]}
    if default is False:
        shown["is_flag"] = True
    elif default in (None, (), {}):
        shown["type"] = spec.metadata["parse"]  # None: the help says what applies ("the file's ..., else ...")
    else:
        shown.update(type=spec.metadata["parse"], default=default, show_default=True)
    shown.update(_PARSERS.get(option, {}), **settings)
    return click.option(*short, option_name(option), option, **shown)


def run_options(values: dict[str, Any], command: tuple[str, ...] | None = None) -> RunOptions:
    """The checked :class:`RunOptions` of a command's run option flags (those it has) and task command."""
    return RunOptions(command=command, **{name: values[name] for name in _RUN_OPTIONS if name in values})
