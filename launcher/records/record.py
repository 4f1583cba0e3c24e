"""The run record: what ``run.json`` holds, as typed dataclasses written and read by the same code.

A run writes its :class:`RunRecord` when it starts, whenever a task changes state, and once more
when it ends (on every path: normal end, failure, signal, environment error). ``runs``,
``status``, ``logs``, ``report`` and ``compare`` read it back through :func:`RunRecord.from_json`.

``format_version`` 2 is written now. Version 1 files (no ``format_version``; written before the
record was typed) read the same way: every field they lack takes its default, and the attempt
number that version 1 only kept in each task's environment is recovered from there.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Mapping

from .states import Outcome, RunStatus, TaskState

FORMAT_VERSION = 2


def _known(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of ``data`` that are fields of ``cls`` (newer or older files may have others)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


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
    def from_json(cls, data: Mapping[str, Any]) -> "TaskRecord":
        record = cls(**_known(cls, {"role": "?", "index": 0, "host": "?", **data}))
        record.state = TaskState.parse(data.get("state", "pending"))
        if "attempt" not in data:  # format 1 kept it in the environment only
            try:
                record.attempt = int(record.env.get("TFLAUNCH_ATTEMPT", 1))
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

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "AttemptRecord":
        record = cls(**_known(cls, {"attempt": 0, **data}))
        record.outcome = Outcome.parse(data.get("outcome"))
        return record


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
    def from_json(cls, data: Mapping[str, Any]) -> "RootCause":
        return cls(**_known(cls, {"task": "?", "host": "?", **data}))


@dataclass
class LauncherRecord:
    pid: int | None = None
    host: str = ""
    cwd: str = ""
    argv: list[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> "LauncherRecord":
        return cls(**_known(cls, data or {}))


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
    error: str | None = None  # what ended the run from outside the tasks (a full disk, a vanished folder)

    def to_json(self) -> dict[str, Any]:
        return _plain(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "RunRecord":
        if not isinstance(data, Mapping):
            raise ValueError("expected a JSON object")
        values = _known(cls, data)
        values.setdefault("run_id", "?")
        values.setdefault("source", "?")
        values["format_version"] = int(data.get("format_version", 1))
        values["status"] = RunStatus.parse(data.get("status"))
        values["launcher"] = LauncherRecord.from_json(data.get("launcher"))
        values["tasks"] = [TaskRecord.from_json(t) for t in data.get("tasks") or [] if isinstance(t, Mapping)]
        values["attempts"] = [AttemptRecord.from_json(a) for a in data.get("attempts") or [] if isinstance(a, Mapping)]
        root = data.get("root_cause")
        values["root_cause"] = RootCause.from_json(root) if isinstance(root, Mapping) else None
        if not isinstance(values.get("cluster"), Mapping):
            values.pop("cluster", None)
        for name in ("notes",):
            if not isinstance(values.get(name), list):
                values.pop(name, None)
        return cls(**values)

    @property
    def attempt(self) -> int:
        """The latest attempt: recorded ones, or the one the tasks were started for."""
        numbers = [a.attempt for a in self.attempts] + [t.attempt for t in self.tasks]
        return max(numbers, default=1)

    def task(self, name: str) -> TaskRecord | None:
        return next((t for t in self.tasks if t.name == name), None)


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _plain(value: Any) -> Any:
    """A record as JSON-ready values: dataclasses to dicts, enums to their values.

    Written out rather than ``dataclasses.asdict``, which deep-copies every value: the live record
    of a run of a thousand tasks is rewritten while the run goes on, and must stay cheap."""
    if is_dataclass(value):
        names = _FIELD_NAMES.get(type(value))
        if names is None:
            names = _FIELD_NAMES[type(value)] = tuple(f.name for f in fields(value))
        return {name: _plain(getattr(value, name)) for name in names}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value
