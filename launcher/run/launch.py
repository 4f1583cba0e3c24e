"""A whole run: options -> cluster spec -> ports -> plan -> supervised attempts -> run folder.

This is the library entry point the CLI calls. It reports through a :class:`Console` it is
given and returns results; it never prints on its own or exits the process.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..cluster.spec import AUTO, ClusterSpec, is_local
from ..errors import PortInUseError, PreflightError, UnknownTaskError
from ..records.folder import RunFolder, iso_time, new_run_id
from ..cluster.machine import cpu_count, local_host_names
from .console import Console
from .pump import OutputPump, tail_lines
from ..cluster.plan import Plan, RunContext, TaskLaunch, plan_cluster, tf_cluster
from ..cluster.ports import PortReservation, port_is_free, reserve_ports
from .resources import ResourceSampler
from .supervisor import AttemptResult, Outcome, Supervisor, SupervisorOptions, Task, TaskState
from ..sources import ClusterSource
from ..transports import create as create_transport
from ..transports.base import Transport
from .watchdog import Watchdog, WatchdogSettings, training_tasks

if TYPE_CHECKING:  # imported where used: a local run needs neither ssh, preflight nor diagnosis
    from .diagnose import Diagnosis
    from .preflight import CheckReport

DEFAULT_LOG_DIR = "logs"
TAIL_LINES = 20
DIAGNOSIS_LINES = 200


@dataclass(frozen=True)
class LaunchRequest:
    """What the user asked for on the command line."""

    source: ClusterSource  # where the run may run: a cluster file, --local N, ...
    command: tuple[str, ...] | None = None
    log_dir: str | None = None
    threads: int | str | None = None
    grace: float = 5.0
    max_restarts: int | None = None  # None: the cluster file's max_restarts
    restart_delay: float | None = None
    watchdog: WatchdogSettings = WatchdogSettings()
    preflight: bool = True  # run the host checks first when the cluster has remote hosts
    show_tasks: tuple[str, ...] = ()  # --tasks: the tasks the console shows (default: all)


@dataclass
class RunResult:
    run_id: str
    run_dir: Path
    exit_code: int
    attempts: list[AttemptResult]
    root_cause_tail: list[str] = field(default_factory=list)
    diagnosis: Diagnosis | None = None  # the known problem the root cause's output matches

    @property
    def final(self) -> AttemptResult:
        return self.attempts[-1]


def build_spec(request: LaunchRequest, local_hosts: frozenset[str]) -> ClusterSpec:
    """The validated cluster the request describes, with command-line overrides applied."""
    spec = request.source.spec(local_hosts)
    if request.command:
        spec = replace(spec, command=request.command)
    if request.log_dir:
        spec = replace(spec, log_dir=request.log_dir)
    if request.threads is not None:
        spec = replace(spec, threads=request.threads)
    known = [task.name for task in spec.tasks]
    unknown = [name for name in request.show_tasks if name not in known]
    if unknown:
        raise UnknownTaskError(spec.source, "--tasks", ",".join(request.show_tasks), unknown, known)
    return spec


def plan_for(spec: ClusterSpec, context: RunContext, local_hosts: frozenset[str]) -> Plan:
    return plan_cluster(spec, context, local_hosts=local_hosts, cores_by_host={"localhost": cpu_count()},
                        default_python=sys.executable, default_workdir=os.getcwd())


def dry_run(request: LaunchRequest) -> tuple[ClusterSpec, Plan]:
    """The plan a run would follow; ``auto`` ports are picked now and released again."""
    local_hosts = local_host_names()
    spec = build_spec(request, local_hosts)
    with _reserve_auto_ports(spec) as reservation:
        spec = spec.with_ports(reservation.ports)
    return spec, _placeholder_plan(spec, local_hosts)


def check(request: LaunchRequest) -> CheckReport:
    """``tflaunch check``: probe every host of the cluster in parallel."""
    from .preflight import check_hosts

    local_hosts = local_host_names()
    spec = build_spec(request, local_hosts)
    with _reserve_auto_ports(spec) as reservation:
        return check_hosts(_placeholder_plan(spec.with_ports(reservation.ports), local_hosts).launches)


def _reserve_auto_ports(spec: ClusterSpec) -> PortReservation:
    """Free, locked ports for the tasks whose port is ``auto``."""
    return reserve_ports([t.name for t in spec.tasks if t.port == AUTO])


def _placeholder_plan(spec: ClusterSpec, local_hosts: frozenset[str]) -> Plan:
    """The plan with a stand-in run id, for showing and checking before a run exists."""
    log_dir = Path(spec.log_dir or DEFAULT_LOG_DIR)
    context = RunContext(run_id="<run-id>", run_dir=str((log_dir / "<run-id>").resolve()))
    return plan_for(spec, context, local_hosts)


def run(request: LaunchRequest, console: Console) -> RunResult:
    """Start the cluster, supervise it to the end, and leave everything in its run folder."""
    local_hosts = local_host_names()
    spec = build_spec(request, local_hosts)
    reservation = _reserve_auto_ports(spec)
    try:
        spec = spec.with_ports(reservation.ports)
        check_local_ports(spec, local_hosts, set(reservation.ports))
        if request.preflight and not all(is_local(t.host, local_hosts) for t in spec.tasks):
            from .preflight import check_hosts

            report = check_hosts(_placeholder_plan(spec, local_hosts).launches)
            if not report.ok:
                problems = "; ".join(f"{i.host} {i.check}: {i.detail}" for i in report.failures)
                raise PreflightError(f"{spec.source}: preflight failed: {problems} "
                                     f"(see 'tflaunch check {spec.source}', or skip with --no-check)")
        folder = RunFolder.create(Path(spec.log_dir or DEFAULT_LOG_DIR), new_run_id())
        return _Run(spec, request, folder, console, local_hosts).execute()
    finally:
        reservation.release()


def check_local_ports(spec: ClusterSpec, local_hosts: frozenset[str], reserved: set[str]) -> None:
    """Refuse to start when a fixed port of a task on this machine is already taken."""
    for task in spec.tasks:
        if task.name in reserved or not is_local(task.host, local_hosts):
            continue
        if not port_is_free(int(task.port)):
            raise PortInUseError(f"{spec.source}: {task.key}.port: {task.host}:{task.port} is already in use "
                                 f"on this machine (task {task.name}); expected a free port or 'auto'")


class _Run:
    """The state of one run while it executes: its folder, manifest and attempts."""

    def __init__(self, spec: ClusterSpec, request: LaunchRequest, folder: RunFolder, console: Console,
                 local_hosts: frozenset[str]):
        self.spec = spec
        self.request = request
        self.folder = folder
        self.console = console
        self.local_hosts = local_hosts
        self.started_at = time.time()
        self.attempts: list[AttemptResult] = []
        self.attempt_records: list[dict[str, Any]] = []
        self.diagnoses: list[Diagnosis | None] = []  # one per attempt
        self.transports: dict[str, Transport] = {}

    def execute(self) -> RunResult:
        self.pump = OutputPump(self.folder.merged_path, self.folder.metrics_path, self.console).start()
        attempt, signatures, interrupted = 1, [], None
        try:
            plan = self._plan(1)
            for note in plan.notes:
                self.say(note)
            self.say(f"run {self.folder.run_id}: {len(plan.launches)} tasks from {self.spec.source}; "
                     f"logs in {self.folder.path}")
            self._write_manifest(plan, [], status="running")
            while True:
                self.pump.attempt = attempt
                if attempt > 1:
                    plan = self._plan(attempt)
                result = self._attempt(plan, attempt)
                self.attempts.append(result)
                if result.outcome is not Outcome.FAILED or attempt > self.max_restarts:
                    break
                signatures.append(self._failure_signature(result, attempt))
                if len(signatures) >= 2 and signatures[-1] == signatures[-2] and not signatures[-1][-1]:
                    self.say(f"attempt {attempt} failed exactly like attempt {attempt - 1} before any training "
                             f"progress ({result.reason}): not restarting again")
                    break
                self.say(f"attempt {attempt} failed ({result.reason}); restarting the whole cluster in "
                         f"{self.restart_delay:g} s (restart {attempt} of {self.max_restarts})")
                self._write_manifest(plan, result.tasks, status="running")
                interrupted = _interruptible_sleep(self.restart_delay)
                if interrupted:
                    self.say(f"received {signal.Signals(interrupted).name} between attempts: not restarting")
                    break
                attempt += 1
        finally:
            self.pump.close()
        tail = []
        if result.root_cause is not None:
            tail = tail_lines(Path(result.root_cause.log_path), TAIL_LINES)
        exit_code = 128 + interrupted if interrupted else result.exit_code
        status = "stopped" if interrupted else _status(result)
        diagnosis = self.diagnoses[-1] if self.diagnoses else None
        self._write_manifest(plan, result.tasks, status=status, result=result, tail=tail, exit_code=exit_code,
                             diagnosis=diagnosis)
        return RunResult(self.folder.run_id, self.folder.path, exit_code, self.attempts, tail, diagnosis)

    @property
    def max_restarts(self) -> int:
        return self.spec.max_restarts if self.request.max_restarts is None else self.request.max_restarts

    @property
    def restart_delay(self) -> float:
        return self.spec.restart_delay if self.request.restart_delay is None else self.request.restart_delay

    def _failure_signature(self, result: AttemptResult, attempt: int) -> tuple:
        """What makes two failures "the same": who, how, which error, and whether training progressed."""
        progressed = any(key[0] == attempt for key in self.pump.progress)
        if result.root_cause is None:
            return ("watchdog", result.reason.split(":", 1)[0], result.blamed, progressed)
        root = result.root_cause
        known = self.diagnoses[-1]
        cause = known.rule if known else error_class(tail_lines(Path(root.log_path), DIAGNOSIS_LINES))
        return (root.name, root.status.describe(), cause, progressed)

    def _diagnose(self, result: AttemptResult) -> Diagnosis | None:
        """Match the root cause's output against the known problems (launcher/diagnose.py)."""
        root = result.root_cause
        if root is None or root.status is None:
            return None
        from .diagnose import diagnose

        return diagnose(tail_lines(Path(root.log_path), DIAGNOSIS_LINES), signal=root.status.signal,
                        exit_code=root.status.code, task_names=[t.name for t in result.tasks])

    def say(self, text: str) -> None:
        self.console.message(text)
        self.pump.event(text)

    def _plan(self, attempt: int) -> Plan:
        run_dir = self.folder.path.resolve()
        # With restarts, the trainer backs up into the run folder so a restarted cluster resumes.
        backup = str(run_dir / "backup") if self.max_restarts > 0 else None
        context = RunContext(self.folder.run_id, str(run_dir), attempt, backup_dir=backup)
        return plan_for(self.spec, context, self.local_hosts)

    def _attempt(self, plan: Plan, attempt: int) -> AttemptResult:
        def open_output(launch: TaskLaunch) -> tuple[int, str]:
            fd = self.folder.open_task_log(launch.name, attempt)
            self.pump.follow(launch.name, self.folder.task_log(launch.name, attempt), attempt)
            return fd, str(self.folder.task_log(launch.name, attempt))

        watchdog = None
        if self.request.watchdog.enabled:
            trainers = training_tasks([(l.name, l.role) for l in plan.launches])
            watchdog = Watchdog(self.request.watchdog, self.pump, attempt, trainers,
                                self.folder.attempt_dir(attempt) / "stacks", self.say)
        supervisor = Supervisor(plan.launches, self._transport_for, open_output, self.say,
                                SupervisorOptions(grace=self.request.grace), watchdog=watchdog,
                                on_change=lambda tasks: self._write_manifest(plan, tasks, status="running"))
        started = time.time()
        sampler = ResourceSampler(lambda: {t.name: t.process.pid for t in supervisor.tasks
                                           if t.state is TaskState.RUNNING and t.launch.local and t.process
                                           and t.process.pid}, self.folder.path)
        sampler.start()
        try:
            result = supervisor.run()
        finally:
            sampler.stop()
        self.diagnoses.append(self._diagnose(result))
        known = self.diagnoses[-1]
        self.attempt_records.append({
            "attempt": attempt,
            "started_at": _iso(started),
            "ended_at": _iso(time.time()),
            "outcome": result.outcome.value,
            "exit_code": result.exit_code,
            "failed_task": result.root_cause.name if result.root_cause else None,
            "reason": result.reason,
            "blamed_tasks": list(result.blamed),
            "diagnosis": known.rule if known else None,
        })
        return result

    def _transport_for(self, launch: TaskLaunch) -> Transport:
        if launch.transport not in self.transports:
            self.transports[launch.transport] = create_transport(launch.transport, self.request.grace)
        return self.transports[launch.transport]

    def _write_manifest(self, plan: Plan, tasks: list[Task], status: str, result: AttemptResult | None = None,
                        tail: list[str] | None = None, exit_code: int | None = None,
                        diagnosis: Diagnosis | None = None) -> None:
        by_name = {t.name: t for t in tasks}
        ended = time.time() if result else None
        manifest: dict[str, Any] = {
            "tflaunch_version": __version__,
            "run_id": self.folder.run_id,
            "source": self.spec.source,
            "status": status,
            "exit_code": exit_code,
            "max_restarts": self.max_restarts,
            "started_at": _iso(self.started_at),
            "ended_at": _iso(ended) if ended else None,
            "duration_seconds": round(ended - self.started_at, 3) if ended else None,
            "launcher": {"pid": os.getpid(), "host": os.uname().nodename, "cwd": os.getcwd(),
                         "argv": [os.path.basename(sys.argv[0]), *sys.argv[1:]]},
            "cluster": tf_cluster(self.spec),
            "command": shlex.join(plan.launches[0].argv),
            "notes": list(plan.notes),
            "tasks": [_task_record(launch, by_name.get(launch.name)) for launch in plan.launches],
            "root_cause": None,
            "attempts": self.attempt_records,
        }
        if result and result.root_cause:
            root = result.root_cause
            manifest["root_cause"] = {"task": root.name, "host": root.launch.host, **_status_fields(root),
                                      "tail": tail or [],
                                      "diagnosis": asdict(diagnosis) if diagnosis else None}
        self.folder.write_manifest(manifest, final=result is not None)


def _task_record(launch: TaskLaunch, task: Task | None) -> dict[str, Any]:
    record: dict[str, Any] = {
        "name": launch.name, "role": launch.role, "index": launch.index, "host": launch.host,
        "address": launch.address, "local": launch.local, "argv": list(launch.argv), "workdir": launch.workdir,
        "gpus": None if launch.gpus is None else list(launch.gpus), "env": dict(launch.env),
    }
    if task is not None:
        record.update({"state": task.state.value, "pid": task.process.pid if task.process else None,
                       "started_at": _iso(task.started_at), "ended_at": _iso(task.ended_at),
                       **_status_fields(task)})
    else:
        record["state"] = "pending"
    return record


def _status_fields(task: Task) -> dict[str, Any]:
    status = task.status
    return {"exit_code": status.shell_code if status else None,
            "signal": status.signal if status else None,
            "error": status.error if status else None}


def _status(result: AttemptResult) -> str:
    return {Outcome.SUCCEEDED: "succeeded", Outcome.FAILED: "failed", Outcome.INTERRUPTED: "stopped"}[result.outcome]


def _iso(when: float | None) -> str | None:
    return None if when is None else iso_time(when)


_EXCEPTION = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception|Exit|Interrupt))\b")


def error_class(tail: list[str]) -> str | None:
    """The last Python exception named at the start of a line of output, if any."""
    for line in reversed(tail):
        match = _EXCEPTION.match(line.strip())
        if match:
            return match.group(1)
    return None


def _interruptible_sleep(seconds: float) -> int | None:
    """Sleep between attempts; the signal number if SIGINT or SIGTERM arrived meanwhile."""
    received: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: received.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        deadline = time.monotonic() + seconds
        while not received and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return received[0] if received else None
