"""A task as a run sees it while it goes on, and what an attempt comes to.

:class:`Task` is one task's live record; :meth:`Task.to` is the only place its state changes (the
states and their transition graph: :class:`~launcher.records.states.TaskState`). :class:`Trip` is a
watchdog's verdict that stops an attempt, :class:`AttemptResult` how an attempt ended. The
supervisor (:mod:`.supervisor`) changes them; the wakeups, the watchdogs, the straggler rule, the
live record and the summary read them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ...cluster.plan import TaskLaunch
from ...records.states import Outcome, TaskState
from ...records.trace import tracer
from ...transports.base import ExitStatus, TaskProcess

log = tracer("supervisor")  # a task's transitions are traced as the supervisor's, which makes them


@dataclass
class Task:
    """One task's live record: its launch, its process, its state and its history."""

    launch: TaskLaunch
    log_path: str = ""
    state: TaskState = TaskState.PENDING
    process: TaskProcess | None = None
    status: ExitStatus | None = None
    started_at: float | None = None
    ended_at: float | None = None
    stop_requested: bool = False
    restarts: int = 0
    known_pid: int | None = None  # the process's pid as last shown to listeners (agents report it after the start)
    leftovers: tuple[str, ...] = ()
    history: list[tuple[str, float]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.launch.name

    @property
    def role(self) -> str:
        return self.launch.role

    def to(self, state: TaskState, when: float) -> None:
        if not self.state.can_become(state):
            raise RuntimeError(f"{self.name}: illegal transition {self.state.value} -> {state.value}")
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s: %s -> %s%s", self.launch.name, self.state, state,
                      " (" + self.status.describe() + ")" if self.status else "")
        self.state = state
        self.history.append((state.value, when))
        if state is TaskState.RUNNING and self.started_at is None:
            self.started_at = when
        elif state.ended:
            self.ended_at = when


@dataclass(frozen=True)
class Trip:
    """A watchdog's verdict: stop the attempt, blaming these tasks. Its reason says what tripped,
    then, after ``"; "``, the details (a hang's verdict): :func:`reason_head` is the first part."""

    reason: str
    tasks: tuple[str, ...] = ()
    exit_code: int = 124  # as timeout(1) reports a command it had to stop


def reason_head(reason: str) -> str:
    """What ended an attempt without its details (``hang timeout: no training progress for 6 s``):
    what a message says where the whole reason is said once elsewhere (the closing summary)."""
    return reason.split("; ", 1)[0]


@dataclass
class AttemptResult:
    outcome: Outcome
    exit_code: int
    tasks: list[Task]
    root_cause: Task | None = None
    signal: int | None = None  # the signal that interrupted tflaunch
    reason: str = ""
    blamed: tuple[str, ...] = ()  # tasks a watchdog stopped the attempt for
    notes: list[str] = field(default_factory=list)  # what happened on the way (evaluator, restarts)
