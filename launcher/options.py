"""The run options as each front end names them: ``--local 2`` on the command line, ``local=2`` in launch().

A message that names an option (an error, a hint) is worded far below the front ends: in the
sources, the cluster checks, the run layer. Those places write ``name("no_check")`` or
``given("local", 2)``, and the words of the front end in effect come out: the command line's by
default, launch()'s keyword arguments inside a launch() call (:func:`python_words`).

Which front end is in effect is a context variable rather than a parameter, because a dozen
messages in five layers need it and nothing else there has to do with the front end; and it is
not a global, so a launch() in one thread never rewords another thread's messages.

:class:`RunOptions` holds the run options themselves: each one's default, its check and its help,
written once. The command line takes its flags' defaults and help from it and launch() its
keywords' defaults; both hand their values to it, and the run layer is built from it. Its checks
name the option in the words of the front end in effect.
"""

from __future__ import annotations

import math
import operator
import os
import shlex
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, fields, replace
from typing import Any

from .agent.protocol import GRACE as AGENT_GRACE
from .errors import OptionsError
from .masking import MASK, masked_argv, masked_text
from .taskenv import ENV_NAME
from .units import LOG_SIZE_RANGE, group_id, parse_size

# An option's identity is its keyword argument of launch(). The command line writes it as
# --identity-with-dashes, except for these:
_COMMAND_LINE = {"hosts": "-H", "cluster": "a cluster file", "command": "the command after --"}

_PYTHON = ContextVar("tflaunch_python_words", default=False)


def python_caller() -> bool:
    """Whether the words are launch()'s (else the command line's)."""
    return _PYTHON.get()


@contextmanager
def python_words() -> Iterator[None]:
    """Word messages for a caller of launch() until the block ends (in this thread or task only)."""
    token = _PYTHON.set(True)
    try:
        yield
    finally:
        _PYTHON.reset(token)


def name(option: str) -> str:
    """The option's name: ``--no-check`` on the command line, ``no_check`` in launch()."""
    if python_caller():
        return option
    return _COMMAND_LINE.get(option, "--" + option.replace("_", "-"))


def form(option: str, placeholder: str) -> str:
    """The option with a placeholder for its value: ``--local N``, ``local=N``."""
    return f"{option}={placeholder}" if python_caller() else f"{name(option)} {placeholder}"


def given(option: str, value: Any) -> str:
    """The option with the value it was given: ``--local 2``, ``--chief``, ``--gpus 0,1``; ``local=2``,
    ``chief=True``, ``gpus=[0, 1]``."""
    if python_caller():
        return f"{option}={list(value)!r}" if isinstance(value, tuple) else f"{option}={value!r}"
    if value is True:
        return name(option)
    text = ",".join(map(str, value)) if isinstance(value, (tuple, list)) else str(value)
    return f"{name(option)} {text}"


def label(options: Iterable[tuple[str, Any]]) -> str:
    """How runs list a cluster named by options: ``--local 2 --chief``, ``launch(local=2, chief=True)``."""
    words = [given(option, value) for option, value in options]
    return f"launch({', '.join(words)})" if python_caller() else " ".join(words)


# -- the run options ------------------------------------------------------------------------

# Seconds between SIGTERM and SIGKILL when tasks are stopped: the agent's own default, one number for both
# (the agent is shipped as standalone source and imports nothing of tflaunch's).
GRACE = AGENT_GRACE
EVALUATOR_TIMEOUT = 300.0  # seconds an evaluator may go on after training succeeded
STRAGGLER_TIMEOUT = 600.0  # seconds a straggler lasts before --on-straggler exclude leaves its host out
STRAGGLER_WARM_UP = 60.0  # seconds of an attempt in which no straggler is named (start-up, graph building, caches)
# Seconds of readings each judgement of the straggler rule weighs, and the least it takes: the
# agents look at the threads ten times a window, so a shorter one costs them more looks.
STRAGGLER_WINDOW = 20.0
STRAGGLER_WINDOW_AT_LEAST = 5.0
STRAGGLER_ACTIONS = ("warn", "exclude", "off")
# A cluster file's max_restarts and restart_delay, when it does not set them (the options win over the file).
MAX_RESTARTS = 0
RESTART_DELAY = 1.0
# Each task log's size limit (merged.log's is MERGED_SHARE times it: launcher/records/boundedlog.py), and
# the sizes --log-max-size takes: a log keeps a head and a tail of it, so not less than a few lines' worth.
LOG_MAX_SIZE = 1 << 30
# Seconds of silence before a host is lost: a Slurm node's unless --keepalive-timeout says, an ssh host's unless
# its cluster file's ssh.keepalive_timeout says.
DEFAULT_KEEPALIVE_TIMEOUT = 15.0
# Seconds rank 0 waits for a lost node to join again (it may be restarting) before the next attempt (--nnodes).
DEFAULT_REJOIN_WAIT = 10.0
DEFAULT_LOG_DIR = "logs"  # where run folders go when neither --log-dir nor a cluster file's log_dir says
DEBUG_VARIABLE = "TFLAUNCH_DEBUG"  # in tflaunch's environment: --debug for every run (launcher/records/trace.py)

ENV_HELP = ("Set a variable in every task (repeatable): KEY=VALUE, or KEY alone to pass tflaunch's own KEY by "
            "name, its value on no command line and in no file. Wins over every 'env' of the cluster file. "
            "Values of variables passed by name, or whose name contains TOKEN, SECRET, PASSWORD, API_KEY and "
            "the like, are shown and recorded as <hidden>.")


def _option(default: Any = None, help: str = "", metavar: str | None = None, parse: type | None = None,
            factory: Any = None) -> Any:
    """A field of :class:`RunOptions` with what the command line shows of it: ``help``, ``metavar``
    and ``parse``, the type its text is parsed as (the field's check does the rest)."""
    metadata = {"help": help, "metavar": metavar, "parse": parse}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True, repr=False)
class RunOptions:
    """The options of one run, checked: what ``tflaunch run``'s options and launch()'s keyword
    arguments of the same names ask for (``--max-restarts 2`` is ``max_restarts=2``).

    Each value is checked and put in one form when the object is made (``tasks='a,b'`` becomes
    ``('a', 'b')``, ``grace=2`` becomes ``2.0``); a bad one raises :class:`OptionsError` naming the
    option in the words of the front end in effect. None for ``max_restarts``, ``restart_delay``
    and ``threads`` means the cluster file's setting; for the timeouts, no timeout.
    """

    command: tuple[str, ...] | None = _option()  # the task command; None: the cluster file's, else the trainer
    env: Mapping[str, str | None] = _option(factory=dict, metavar="KEY[=VALUE]", help=ENV_HELP)
    log_dir: str | None = _option(
        metavar="DIR", help=f"Where run folders go (default: the file's log_dir, else ./{DEFAULT_LOG_DIR}).")
    log_group: str | None = _option(
        metavar="GROUP", parse=str,
        help="Share the run folder with GROUP (a group you are in): made with that group, set-group-ID, 2750, "
             "its files 0640; the group must be able to enter the log directory (default: the file's log_group, "
             "else the run is yours alone, unless the log directory is shared with its group).")
    threads: int | str | None = _option(metavar="N|auto|off",
                                        help="Thread limit per task (default auto: cores shared among a host's tasks).")
    grace: float = _option(GRACE, metavar="S", parse=float, help="Seconds between SIGTERM and SIGKILL when stopping tasks.")
    max_restarts: int | None = _option(
        metavar="N", parse=int,
        help=f"Restart the whole cluster up to N times when a task fails (default: the file's max_restarts, "
             f"else {MAX_RESTARTS}).")
    restart_delay: float | None = _option(
        metavar="S", parse=float,
        help=f"Seconds to wait before a restart (default: the file's restart_delay, else {RESTART_DELAY:g}).")
    start_timeout: float | None = _option(
        metavar="S", parse=float,
        help="Fail the attempt when some training task shows no progress within S seconds: progress is a metric "
             "line (the built-in trainer's, or an epoch line Keras prints), or over 10% of a core used or waited for "
             "over the last S/2 seconds (the first half, where TensorFlow starts up, does not count).")
    hang_timeout: float | None = _option(
        metavar="S", parse=float,
        help="When no chief or worker makes progress for S seconds (no new metric line, under 10% of a core used or waited for; "
             "output does not count): sample every task's stacks, name the task that differs, fail the attempt.")
    keepalive_timeout: float | None = _option(
        metavar="S", parse=float,
        help=f"Inside a Slurm allocation: seconds without a word from a node's agent before the node is lost "
             f"(default {DEFAULT_KEEPALIVE_TIMEOUT:g}; over ssh, the cluster file's ssh.keepalive_timeout says).")
    min_workers: int | None = _option(
        metavar="N", parse=int,
        help="When a host is lost for good and no spare is left, restart with the training tasks (chief and workers) "
             "that remain, down to N; below N the run ends (default: the file's min_workers, else no shrinking).")
    cooldown: float | None = _option(
        metavar="S", parse=float,
        help="Seconds a host left out of the run waits before it may rejoin at a restart, once it answers again "
             "(default: the file's cooldown, else 300).")
    on_straggler: str = _option(
        "warn", metavar="warn|exclude|off", parse=str,
        help="What to do about a training task the others keep waiting for, step after step (named on the console, "
             "by 'tflaunch status' and in the run record, never in an attempt's --straggler-warm-up): warn; exclude, which also restarts the "
             "cluster from its backup without that task's host once it was the straggler for --straggler-timeout "
             "seconds, where a spare or --min-workers allows; or off (its threads are not watched).")
    straggler_timeout: float = _option(
        STRAGGLER_TIMEOUT, metavar="S", parse=float,
        help="With --on-straggler exclude: seconds a task stays the straggler before its host is left out.")
    straggler_warm_up: float = _option(
        STRAGGLER_WARM_UP, metavar="S", parse=float,
        help="Seconds at the start of each attempt in which no straggler is named (TensorFlow starts up, builds its "
             "graphs and fills its caches then).")
    straggler_window: float = _option(
        STRAGGLER_WINDOW, metavar="S", parse=float,
        help="Seconds of readings the straggler rule weighs at each judgement: a task is named once it stood out for "
             "three quarters of it, and its end said once it was calm for half of it; the agents look at the tasks' "
             f"threads ten times a window, so a shorter one names sooner and costs more (at least {STRAGGLER_WINDOW_AT_LEAST:g}).")
    evaluator_timeout: float = _option(
        EVALUATOR_TIMEOUT, metavar="S", parse=float,
        help="After training succeeds, seconds a running evaluator may take to finish its last evaluation "
             "before it is stopped.")
    isolate_network: bool = _option(
        False, help="Seal the run as by default, and give its tasks no outside network either (no downloads); "
                    "refuse to start where no network namespace can be made (tasks on this machine only).")
    no_seal: bool = _option(
        False, help="Do not seal a run whose tasks are all on this machine: they use this machine's network, and "
                    "other users of it can reach their ports. By default such a run's tasks share a network "
                    "namespace of their own, with outside network through slirp4netns or pasta.")
    no_check: bool = _option(False, help="Skip the host checks that run before launching on remote hosts.")
    tasks: tuple[str, ...] = _option((), metavar="NAMES",
                                     help="Show only these tasks on the console, e.g. worker-0,chief-0.")
    quiet: bool = _option(False, help="Show only tflaunch's own messages on the console.")
    verbose: bool = _option(
        False, help="Show every task line as written: TensorFlow's start-up chatter and raw metric lines too.")
    tensorboard: bool = _option(
        False, help="Start TensorBoard on the run's folder beside the run (127.0.0.1, from port 6006 up) and stop it "
                    "with the run (needs the 'tensorboard' extra).")
    debug: bool = _option(
        False, help="Write tflaunch's own trace into the run folder, for a bug report: connections, frames per "
                    "host, task state changes, attempts, restarts and timers (no variable's value). "
                    f"{DEBUG_VARIABLE}=1 does the same.")
    log_max_size: int | str = _option(
        LOG_MAX_SIZE, metavar="SIZE", parse=str,
        help="Keep each task's log and tflaunch's trace (--debug) within SIZE (512M, 2G, 100k; default 1G), the merged log within "
             "4 x SIZE and the metrics file within SIZE or 64M, whichever is less: past it a log keeps its first quarter and its "
             "latest output, with a line between them saying how many bytes were left out. The console written to "
             "a file keeps its task lines' first quarter of SIZE and their last 1M.")

    def __post_init__(self) -> None:
        put = object.__setattr__  # the one place a frozen RunOptions is written: its values' checked forms
        put(self, "command", _command(self.command))
        put(self, "env", _env(self.env))
        put(self, "log_dir", _path("log_dir", self.log_dir))
        put(self, "log_group", _log_group(self.log_group))
        put(self, "threads", _threads(self.threads))
        put(self, "grace", seconds("grace", self.grace))
        put(self, "max_restarts", None if self.max_restarts is None else count("max_restarts", self.max_restarts, 0))
        put(self, "min_workers", None if self.min_workers is None else count("min_workers", self.min_workers, 1))
        put(self, "cooldown", None if self.cooldown is None else seconds("cooldown", self.cooldown))
        for option in ("restart_delay", "start_timeout", "hang_timeout", "keepalive_timeout"):
            value = getattr(self, option)
            put(self, option, None if value is None else seconds(option, value, positive=option != "restart_delay"))
        put(self, "evaluator_timeout", seconds("evaluator_timeout", self.evaluator_timeout))
        if self.on_straggler not in STRAGGLER_ACTIONS:
            raise bad("on_straggler", " or ".join(STRAGGLER_ACTIONS), self.on_straggler)
        put(self, "straggler_timeout", seconds("straggler_timeout", self.straggler_timeout, positive=True))
        put(self, "straggler_warm_up", seconds("straggler_warm_up", self.straggler_warm_up))
        put(self, "straggler_window", seconds("straggler_window", self.straggler_window, at_least=STRAGGLER_WINDOW_AT_LEAST))
        put(self, "tasks", _names(self.tasks))
        put(self, "log_max_size", size("log_max_size", self.log_max_size))
        for flag in ("isolate_network", "no_seal", "no_check", "quiet", "verbose", "tensorboard", "debug"):
            put(self, flag, bool(getattr(self, flag)))
        caller = "launch(): " if python_caller() else ""
        for one, other in (("quiet", "verbose"), ("isolate_network", "no_seal")):
            if getattr(self, one) and getattr(self, other):
                raise OptionsError(f"{caller}{given(one, True)} and {given(other, True)} cannot be combined")


    def __repr__(self) -> str:
        """Every option, but no value of ``env`` (its names only) and the command masked: the object
        goes down whole, and a trace or an error that shows it must not write a secret down."""
        shown = {f.name: getattr(self, f.name) for f in fields(self)}
        shown["env"] = {key: MASK for key in self.env}
        if self.command is not None:
            shown["command"] = tuple(masked_argv(self.command))
        return f"RunOptions({', '.join(f'{key}={value!r}' for key, value in shown.items())})"

    def over_file(self, max_restarts: int, restart_delay: float) -> "RunOptions":
        """These options with the cluster file's ``max_restarts`` and ``restart_delay`` where they leave
        them to it: the object a run passes whole to its session, supervisor and transports."""
        return replace(self, max_restarts=max_restarts if self.max_restarts is None else self.max_restarts,
                       restart_delay=restart_delay if self.restart_delay is None else self.restart_delay)


# -- the checks, each naming the option as the front end in effect does -----------------------

def bad(option: str, expected: str, value: Any) -> OptionsError:
    """``--grace: expected a number of seconds >= 0, got -1.0`` (``grace: ...`` from launch())."""
    return OptionsError(f"{name(option)}: expected {expected}, got {masked_text(repr(value))}")


def count(option: str, value: Any, least: int) -> int:
    """A whole number >= ``least`` (a bool or a float is refused, never truncated)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise bad(option, f"a whole number >= {least}", value)
    return value


def seconds(option: str, value: Any, positive: bool = False, at_least: float = 0.0) -> float:
    """A finite number of seconds, >= ``at_least`` (0 unless given) or (``positive``) > 0."""
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or value < at_least or (positive and value == 0)):
        raise bad(option, "a number of seconds " + ("> 0" if positive else f">= {at_least:g}"), value)
    return float(value)


GPU_FORM = "GPU indices (whole numbers) such as 0,1"


def gpu_indices(option: str, value: Any) -> tuple[int, ...]:
    """GPU indices from ``0,1`` text or a sequence of whole numbers (None and "" are none), the
    one reading of both front ends' GPU lists: a float or a bool is refused, never truncated.
    Whether they are distinct and >= 0 is the sources' check, as for a cluster file's."""
    if value is None or value == "":
        return ()
    try:
        items = value.split(",") if isinstance(value, str) else list(value)
        return tuple(_gpu_index(item) for item in items)
    except (TypeError, ValueError):
        raise bad(option, GPU_FORM, value) from None


def _gpu_index(item: Any) -> int:
    if isinstance(item, str):
        text = item.strip()
        if text.isascii() and text.isdecimal():
            return int(text)
        raise ValueError(item)
    if isinstance(item, bool):
        raise TypeError(item)
    return operator.index(item)  # an int or a numpy integer; a float raises TypeError


def size(option: str, value: Any) -> int:
    """A size: a number of bytes, or text such as '512M' (:func:`parse_size`)."""
    if isinstance(value, int) and not isinstance(value, bool) and LOG_SIZE_RANGE[0] <= value <= LOG_SIZE_RANGE[1]:
        return value
    if isinstance(value, str):
        try:
            return parse_size(value)
        except ValueError as exc:
            raise OptionsError(f"{name(option)}: {exc}") from None
    raise bad(option, "a size such as '512M' or '2G', or a number of bytes from 65536", value)


def _threads(value: Any) -> int | str | None:
    if value is None or value in ("auto", "off"):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise bad("threads", "'auto', 'off' or a thread count >= 1", value)


def _command(value: Any) -> tuple[str, ...] | None:
    """A list of words, or a string split as a shell would."""
    if value is None:
        return None
    if isinstance(value, str):
        value = shlex.split(value)
    if isinstance(value, (list, tuple)) and value and all(isinstance(word, str) for word in value):
        return tuple(value)
    raise bad("command", "a non-empty list of strings, or a string", value)


def _env(value: Any) -> dict[str, str | None]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise bad("env", "a mapping of variable names to strings, or to None (passed by name)", value)
    env = dict(value)
    for key, item in env.items():
        # The value is never shown: it may be a secret.
        if not isinstance(key, str) or not ENV_NAME.fullmatch(key):
            raise bad("env", "variable names mapped to strings, or to None (passed by name)", key)
        if not (item is None or isinstance(item, str)):
            raise bad(f"env[{key!r}]", "a string, or None to pass this process's own value by name", type(item).__name__)
    return env


def _path(option: str, value: Any) -> str | None:
    if value is None:
        return None
    try:
        return os.fspath(value)
    except TypeError:
        raise bad(option, "a path", value) from None


def _log_group(value: Any) -> str | None:
    if value is None:
        return None
    try:
        group_id(value)
    except ValueError as exc:
        raise OptionsError(f"{name('log_group')}: {exc}") from None
    return str(value).strip()


def _names(value: Any) -> tuple[str, ...]:
    """Task names from 'a,b' or from a list of names."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value) if isinstance(value, Iterable) else None
    if items is None or not all(isinstance(item, str) for item in items):
        raise bad("tasks", "task names such as 'worker-0,chief-0' or ['worker-0', 'chief-0']", value)
    return tuple(item.strip() for item in items if item.strip())
