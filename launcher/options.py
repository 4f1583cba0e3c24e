"""The run options as each front end names them: ``--local 2`` on the command line, ``local=2`` in launch().

A message that names an option (an error, a hint) is worded far below the front ends: in the
sources, the cluster checks, the run layer. Those places write ``name("no_check")`` or
``given("local", 2)``, and the words of the front end in effect come out: the command line's by
default, launch()'s keyword arguments inside a launch() call (:func:`python_words`).

Which front end is in effect is a context variable rather than a parameter, because a dozen
messages in five layers need it and nothing else there has to do with the front end; and it is
not a global, so a launch() in one thread never rewords another thread's messages.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

# An option's identity is its keyword argument of launch(). The command line writes it as
# --identity-with-dashes, except for these:
_COMMAND_LINE = {"hosts": "-H", "cluster": "a cluster file"}

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
