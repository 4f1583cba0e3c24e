"""Between two attempts: what a failed attempt is laid on, whether it failed like the one before,
and on which hosts the next one runs.

A :class:`Recovery` lives as long as the run's session and is asked once per failed attempt. It
diagnoses the attempt's root cause (:mod:`launcher.run.faults.diagnose`), tells a failure's
signature (who failed, how, with which error, and whether training progressed), names the host a
failure is laid on, checks the hosts the next attempt may use through the run's own agents, and
hands the answers to the :class:`~.hostpool.HostPool`, which decides. The session keeps the record
and says the decision's lines: this module writes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING

from ...cluster.placement import checked_spec
from ...cluster.plan import Plan, RunContext, TaskLaunch
from ...cluster.spec import ClusterSpec
from ...records.logview import tail_lines
from ...records.trace import tracer
from ...transports import TransportSet
from .hostpool import Decision, HostPool
from .task import AttemptResult

if TYPE_CHECKING:
    from ..faults.diagnose import Diagnosis

log = tracer("recovery")
DIAGNOSIS_LINES = 200  # lines of the root cause's log the known problems are matched against


class Recovery:
    """The judgements between a failed attempt and the next one (rules in the module docstring)."""

    def __init__(self, spec: ClusterSpec, pool: HostPool, transports: TransportSet,
                 plan_attempt: Callable[[RunContext, ClusterSpec], Plan], context: Callable[[], RunContext],
                 progressed: Callable[[int, Collection[str]], bool]) -> None:
        self.spec, self.pool, self.transports = spec, pool, transports
        self.plan_attempt, self.context, self.progressed = plan_attempt, context, progressed
        self.diagnoses: list[Diagnosis | None] = []  # one per attempt
        self.signatures: list[tuple] = []  # one per failed attempt
        self._culprits: list[str | None] = []  # the host each failed attempt was laid on
        self._launches_by_host: dict[str, TaskLaunch] | None = None

    @property
    def diagnosis(self) -> Diagnosis | None:
        """The last attempt's known problem, if its root cause's output matched one."""
        return self.diagnoses[-1] if self.diagnoses else None

    def diagnose(self, result: AttemptResult) -> Diagnosis | None:
        """Match the attempt's root cause's output against the known problems, and keep the answer."""
        root = result.root_cause
        found = None
        if root is not None and root.status is not None:
            from ..faults.diagnose import diagnose

            found = diagnose(tail_lines(Path(root.log_path), DIAGNOSIS_LINES), signal=root.status.signal,
                             exit_code=root.status.code, task_names=[t.name for t in result.tasks],
                             offline=root.launch.offline)
        self.diagnoses.append(found)
        return found

    def failed_alike(self, result: AttemptResult, attempt: int) -> bool:
        """Keep the failed attempt's signature; whether it failed exactly like the attempt before,
        with no training progress in either."""
        self.signatures.append(self._signature(result, attempt))
        log.debug("attempt %d: failure signature %s", attempt, self.signatures[-1])
        return len(self.signatures) >= 2 and self.signatures[-1] == self.signatures[-2] and not self.signatures[-1][-1]

    def _signature(self, result: AttemptResult, attempt: int) -> tuple:
        """What makes two failures "the same": who, how, which error, and whether training progressed."""
        progressed = self.progressed(attempt, [task.name for task in result.tasks])
        if result.root_cause is None:
            return ("watchdog", result.reason.split(":", 1)[0], result.blamed, progressed)
        root = result.root_cause
        known = self.diagnosis
        cause = known.rule if known else error_class(tail_lines(Path(root.log_path), DIAGNOSIS_LINES))
        return (root.name, root.status.describe(), cause, progressed)

    def next_cluster(self, plan: Plan, result: AttemptResult, attempt: int,
                     straggler: tuple[str, str] | None) -> Decision:
        """Before attempt ``attempt``: the hosts that are lost, failed the machine's way or were the
        culprit twice (and ``straggler``'s (host, why), when one ended the attempt), decided on by the pool."""
        from ..checks.preflight import unreachable_hosts  # only a restart needs it

        launches = self._host_launches()
        lost = unreachable_hosts([launches[host] for host in self.pool.to_check() if host in launches], self.transports)
        culprit = self._culprit_host(plan, result)
        self._culprits.append(culprit)
        repeated = [culprit] if culprit and self._culprits[-2:] == [culprit, culprit] else []
        machine = self._machine_fault(result)
        if straggler is not None:
            machine.setdefault(*straggler)
        decision = self.pool.decide(attempt, lost, machine=machine, culprits=repeated)
        log.debug("before attempt %d: lost %s, machine faults %s, culprit %s (repeated %s); left out %s, "
                  "rejoined %s, ends the run: %s", attempt, dict(lost), machine, culprit, repeated,
                  [(out.host, out.reason) for out in decision.left_out], list(decision.rejoined), decision.ends_run)
        return decision

    def _host_launches(self) -> dict[str, TaskLaunch]:
        """{host: a launch of a task or spare slot on it}: how the check before a restart reaches each host."""
        if self._launches_by_host is None:
            checked = self.plan_attempt(self.context(), checked_spec(self.spec))
            self._launches_by_host = {}
            for launch in checked.launches:
                self._launches_by_host.setdefault(launch.host, launch)
        return self._launches_by_host

    def _culprit_host(self, plan: Plan, result: AttemptResult) -> str | None:
        """The host of the task the attempt's failure is laid on (its root cause, or the task a hang
        watchdog named), unless the failure is a known mistake of the program
        (:data:`~launcher.run.faults.diagnose.PROGRAM_RULES`)."""
        from ..faults.diagnose import PROGRAM_RULES

        known = self.diagnosis
        if known is not None and known.rule in PROGRAM_RULES:
            return None
        name = result.root_cause.name if result.root_cause else (result.blamed[0] if len(result.blamed) == 1 else None)
        return next((launch.host for launch in plan.launches if launch.name == name and not launch.local), None)

    def _machine_fault(self, result: AttemptResult) -> dict[str, str]:
        """{host: why} when the attempt's root cause failed in a way that points at its machine."""
        from ..faults.diagnose import MACHINE_RULES

        known = self.diagnosis
        root = result.root_cause
        if known is None or root is None or known.rule not in MACHINE_RULES or root.launch.local:
            return {}
        return {root.launch.host: f"left out after {root.name} failed the machine's way ({known.rule}: {known.summary})"}


_EXCEPTION = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception|Exit|Interrupt))\b")


def error_class(tail: list[str]) -> str | None:
    """The last Python exception named at the start of a line of output, if any."""
    for line in reversed(tail):
        if match := _EXCEPTION.match(line.strip()):
            return match.group(1)
    return None


__all__ = ["DIAGNOSIS_LINES", "Recovery", "error_class"]
