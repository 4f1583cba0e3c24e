"""The run record: what ``run.json`` holds, as typed dataclasses written and read by the same code.

A run writes its :class:`RunRecord` when it starts, whenever a task changes state, and once more
when it ends (on every path: normal end, failure, signal, environment error). ``runs``,
``status``, ``logs``, ``report`` and ``compare`` read it back through :func:`RunRecord.from_json`,
which checks every value against its field's type: a file that is JSON but holds, say, a string
where a number belongs raises :class:`RecordError` naming the key path (``tasks[1].exit_code``).

``format_version`` 2 is written now. Version 1 files (no ``format_version``; written before the
record was typed) read the same way: every field they lack takes its default, and the attempt
number that version 1 only kept in each task's environment is recovered from there.
"""

from __future__ import annotations

import enum
import math
import types
import typing
from datetime import datetime
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from typing import Any, Callable, Mapping

from ..errors import shown
from ..taskenv import ATTEMPT
from .states import Outcome, RunStatus, TaskState, clock_text

FORMAT_VERSION = 2


class RecordError(ValueError):
    """run.json is JSON but not a run record: the key path of the first bad value, and what it is."""


def _read(cls: type, data: Any, key: str, defaults: Mapping[str, Any] | None = None) -> Any:
    """An instance of the record dataclass ``cls`` from ``data``, every value checked against its field's type.

    Keys ``cls`` does not have are left out (a newer or older file may have others); fields ``data``
    lacks take ``defaults``, else the field's own default. RecordError names the first bad value.
    """
    if not isinstance(data, Mapping):
        raise RecordError(f"{key}: expected an object, got {_shown(data)}")
    values = dict(defaults or {})
    for name, hint in _hints(cls).items():
        if name in data:
            values[name] = _value(data[name], hint, f"{key}.{name}" if key else name)
    missing = [f.name for f in fields(cls) if f.name not in values and f.default is MISSING
               and f.default_factory is MISSING]
    if missing:
        raise RecordError(f"{key}.{missing[0]}: missing" if key else f"{missing[0]}: missing")
    record = cls(**values)
    if getattr(record, "pid", None) is not None and not 0 < record.pid < 2**31:
        raise RecordError(f"{key}.pid: expected a process id, got {record.pid}")  # status asks the system about it
    return record


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    """The resolved field types of a record dataclass (its annotations are strings in this module)."""
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _value(value: Any, hint: Any, key: str) -> Any:
    """``value`` when it has the type ``hint`` says (enums parsed, nested records read); else RecordError."""
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:  # "X | None" only
        if value is None:
            return None
        hint = next(a for a in args if a is not type(None))
        args = typing.get_args(hint)
    origin = typing.get_origin(hint)
    if hint is Any:
        return value
    if is_dataclass(hint):
        return hint.from_json(value, key)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        if value is not None and not isinstance(value, str):  # an unknown word reads as failed, a number does not
            raise RecordError(f"{key}: expected a word such as 'failed', got {_shown(value)}")
        return hint.parse(value)
    if origin is list:
        if not isinstance(value, list):
            raise RecordError(f"{key}: expected a list, got {_shown(value)}")
        return [_value(item, args[0], f"{key}[{i}]") for i, item in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise RecordError(f"{key}: expected an object, got {_shown(value)}")
        return {name: _value(item, args[1], f"{key}.{name}") for name, item in value.items()}
    if not _SCALARS[hint](value):
        raise RecordError(f"{key}: expected {_SCALAR_WORDS[hint]}, got {_shown(value)}")
    return value


# bool is an int to Python and NaN a float to json.loads; neither is what these fields hold.
_SCALARS = {
    str: lambda v: isinstance(v, str),
    bool: lambda v: isinstance(v, bool),
    int: lambda v: isinstance(v, int) and not isinstance(v, bool),
    float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
}
_SCALAR_WORDS = {str: "a string", bool: "true or false", int: "an integer", float: "a finite number"}


def _shown(value: Any) -> str:
    """A bad value of run.json in a one-line message, in JSON's words."""
    return shown(value, limit=40, mapping="an object", none="null")


@dataclass
class TaskRecord:
    """One task of the latest attempt: where and how it ran and how it ended."""

    name: str
    role: str
    index: int
    host: str
    address: str = ""
    local: bool = True
    argv: list[str] = field(default_factory=list)
    workdir: str = ""
    gpus: list[int] | None = None
    env: dict[str, str] = field(default_factory=dict)
    state: TaskState = TaskState.PENDING
    pid: int | None = None
    started_at: str | None = None
    ended_at: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    error: str | None = None
    attempt: int = 1
    restarts: int = 0  # times this task alone was restarted in place during the attempt
    leftovers: list[str] = field(default_factory=list)  # processes it left behind that had to be stopped

    @classmethod
    def from_json(cls, data: Any, key: str = "task") -> "TaskRecord":
        record = _read(cls, data, key, {"role": "?", "index": 0, "host": "?"})
        if "attempt" not in data:  # format 1 kept it in the environment only
            try:
                record.attempt = int(record.env.get(ATTEMPT, 1))
            except ValueError:
                record.attempt = 1
        return record


@dataclass
class AttemptRecord:
    attempt: int
    started_at: str | None = None
    ended_at: str | None = None
    outcome: Outcome = Outcome.FAILED
    exit_code: int | None = None
    failed_task: str | None = None
    reason: str = ""
    blamed_tasks: list[str] = field(default_factory=list)
    diagnosis: str | None = None  # the rule name of the matching diagnosis
    hosts: dict[str, str] = field(default_factory=dict)  # where each task of the attempt ran

    @classmethod
    def from_json(cls, data: Any, key: str = "attempt") -> "AttemptRecord":
        return _read(cls, data, key, {"attempt": 0})


@dataclass
class ExcludedHost:
    """A host left out of the run from an attempt on, and why: lost (it did not answer before a
    restart), its task failed the machine's way, named as the culprit twice, or a spare the preflight refused."""

    host: str
    reason: str
    attempt: int  # the first attempt it was left out of
    rejoined: int | None = None  # the attempt it rejoined at, after its cooldown

    def line(self) -> str:
        """The host and why, as ``status`` and ``report`` show it."""
        back = f" (rejoined at attempt {self.rejoined})" if self.rejoined else ""
        return f"{self.host} left out of attempt {self.attempt}: {self.reason}{back}"

    @classmethod
    def from_json(cls, data: Any, key: str = "excluded") -> "ExcludedHost":
        return _read(cls, data, key, {"host": "?", "reason": "", "attempt": 0, "rejoined": None})


@dataclass
class StragglerRecord:
    """A training task the others kept waiting for (launcher/run/faults/stragglers.py): from ``since`` to
    ``until`` (None while it still is one), ``share`` of each step on average, and why."""

    task: str
    host: str
    since: str  # ISO time it began, as far as the rule can tell (the start of the evidence)
    until: str | None = None
    share: float = 0.0  # the fraction of step time the others spent waiting for it
    attempt: int = 1
    cause: str = ""  # what its threads did meanwhile

    def line(self) -> str:
        """The straggler in one line, as ``status`` and ``report`` show it."""
        when = (f"from {clock_text(self.since)} to {clock_text(self.until)}" if self.until
                else f"since {clock_text(self.since)}")
        return (f"{self.task} on {self.host} held the others back {when} (attempt {self.attempt}): they waited "
                f"for it about {self.share:.0%} of each step; {self.cause}")

    @classmethod
    def from_json(cls, data: Any, key: str = "stragglers") -> "StragglerRecord":
        return _read(cls, data, key, {"task": "?", "host": "?", "since": "?", "until": None, "share": 0.0,
                                      "attempt": 1, "cause": ""})


@dataclass
class RootCause:
    task: str
    host: str
    exit_code: int | None = None
    signal: int | None = None
    error: str | None = None
    tail: list[str] = field(default_factory=list)
    diagnosis: dict[str, Any] | None = None

    @classmethod
    def from_json(cls, data: Any, key: str = "root_cause") -> "RootCause":
        return _read(cls, data, key, {"task": "?", "host": "?"})

    def line(self) -> str:
        """The root cause in one line: the task, and what its diagnosis (a hang's verdict) says."""
        said = (self.diagnosis or {}).get("summary") or self.error or (
            f"exit code {self.exit_code}" if self.exit_code is not None else None)
        return f"{self.task} on {self.host}" + (f": {said}" if said else "")


@dataclass
class LauncherRecord:
    pid: int | None = None
    host: str = ""
    cwd: str = ""
    argv: list[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: Any, key: str = "launcher") -> "LauncherRecord":
        return _read(cls, data, key)


@dataclass
class RunRecord:
    """Everything ``run.json`` says about one run."""

    run_id: str
    source: str
    status: RunStatus = RunStatus.RUNNING
    format_version: int = FORMAT_VERSION
    tflaunch_version: str = ""
    exit_code: int | None = None
    max_restarts: int = 0
    started_at: str | None = None
    ended_at: str | None = None
    duration_seconds: float | None = None
    launcher: LauncherRecord = field(default_factory=LauncherRecord)
    cluster: dict[str, list[str]] = field(default_factory=dict)
    command: str = ""
    notes: list[str] = field(default_factory=list)
    tasks: list[TaskRecord] = field(default_factory=list)
    root_cause: RootCause | None = None
    attempts: list[AttemptRecord] = field(default_factory=list)
    excluded: list[ExcludedHost] = field(default_factory=list)  # hosts left out of an attempt
    stragglers: list[StragglerRecord] = field(default_factory=list)  # tasks the others kept waiting for
    error: str | None = None  # what ended the run from outside the tasks (a full disk, a vanished folder)
    sealed: bool = False  # every task in a network namespace of the run's own (docs/security.md)
    unsealed_because: str | None = None  # why a run that was to be sealed was not (the console's line)

    def to_json(self) -> dict[str, Any]:
        return _plain(self)

    @classmethod
    def from_json(cls, data: Any, source: str = "the record") -> "RunRecord":
        """The record run.json holds; RecordError (a ValueError) names the first value of the wrong
        type, or ``source`` (the file's name, which the folder gives) when ``data`` is no object."""
        if not isinstance(data, Mapping):
            raise RecordError(f"{source}: expected an object, got {_shown(data)}")
        # Format 1 had no format_version, and a record without a status did not succeed.
        return _read(cls, data, "", {"run_id": "?", "source": "?", "format_version": 1,
                                     "status": RunStatus.parse(None)})

    def seconds(self, now: float | None = None) -> float | None:
        """How long the run took, the one figure the closing summary, ``runs``, ``status`` and
        ``report`` show: the recorded duration once it ended (its launcher's start to its end,
        every attempt and the pauses between them); with ``now`` for a run still going, its start to now."""
        if self.duration_seconds is not None or now is None or not self.started_at:
            return self.duration_seconds
        try:
            return round(now - datetime.fromisoformat(self.started_at).timestamp(), 3)
        except ValueError:
            return None

    @property
    def attempt(self) -> int:
        """The latest attempt: recorded ones, or the one the tasks were started for."""
        numbers = [a.attempt for a in self.attempts] + [t.attempt for t in self.tasks]
        return max(numbers, default=1)

    def task(self, name: str) -> TaskRecord | None:
        return next((t for t in self.tasks if t.name == name and t.state is not TaskState.LEFT_OUT), None)

    def excluded_lines(self) -> list[str]:
        """Each host left out, why (:meth:`ExcludedHost.line`), and the tasks of it the latest attempt
        runs without, as ``status`` and ``report`` show them."""
        without: dict[str, list[str]] = {}
        for task in self.tasks:
            if task.state is TaskState.LEFT_OUT:
                without.setdefault(task.host, []).append(task.name)
        return [host.line() + (f"; attempt {self.attempt} runs without {', '.join(without[host.host])}"
                               if host.rejoined is None and host.host in without else "")
                for host in self.excluded]


_SCALAR_TYPES = frozenset((str, int, float, bool, type(None)))


def _plain(value: Any) -> Any:
    """A record as JSON-ready values: dataclasses to dicts, enums to their values.

    Written out rather than ``dataclasses.asdict``, which deep-copies every value: the live record
    of a run of a thousand tasks is rewritten while the run goes on, and must stay cheap. So each
    type's conversion is worked out once, and a scalar (most values) is passed over without a call."""
    kind = type(value)
    if kind in _SCALAR_TYPES:
        return value
    convert = _CONVERTERS.get(kind)
    if convert is None:
        convert = _CONVERTERS[kind] = _converter(kind)
    return convert(value)


def _converter(kind: type) -> Callable[[Any], Any]:
    scalar = _SCALAR_TYPES
    if is_dataclass(kind):
        names = tuple(f.name for f in fields(kind))
        return lambda value: {name: item if type(item) in scalar else _plain(item)
                              for name in names for item in (getattr(value, name),)}
    if issubclass(kind, enum.Enum):
        return lambda value: value.value
    if issubclass(kind, (list, tuple)):
        return lambda value: [item if type(item) in scalar else _plain(item) for item in value]
    if issubclass(kind, dict):
        return lambda value: {key: item if type(item) in scalar else _plain(item) for key, item in value.items()}
    return lambda value: value


_CONVERTERS: dict[type, Callable[[Any], Any]] = {}
