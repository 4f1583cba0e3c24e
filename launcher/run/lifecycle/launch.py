"""The run layer's entry points: ``run``, ``dry_run`` and ``check`` for a launch request.

A request carries the cluster (a function from this machine's host names to a validated spec:
the CLI hands in a source's ``spec``, see :mod:`launcher.sources`) and the command-line
overrides. From it come the spec, reserved ports, the preflight, the run folder, and then a
:class:`~.session.RunSession` that runs the attempts. :func:`run` is the one way a cluster is
run, locally, over ssh or inside a Slurm allocation (:mod:`.slurmjob` passes how its
run folder is found and the signal it watches). Everything here reports through the
:class:`Console` it is given and returns results; it never prints on its own or exits.
"""

from __future__ import annotations

import errno
import os
import sys
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping

from ...cluster.checks import missing_gpus_warning
from ...cluster.machine import cpu_count, gpu_count, local_host_names
from ...cluster.placement import checked_spec
from ...cluster.plan import Plan, RunContext, TaskLaunch, check_cluster_fits, plan_cluster
from ...cluster.ports import HELD_AT_MOST, PortReservation, port_is_free, reserve_ports
from ...cluster.spec import AUTO, ClusterSpec, Network, TaskSpec, check_launch_input, is_local
from ...errors import EnvironmentProblem, OptionsError, PortInUseError, PreflightError, UnknownTaskError
from ...options import RunOptions, given, python_caller
from ...options import name as option_name
from ...records.folder import DEFAULT_LOG_DIR, RUN_ID_PLACEHOLDER, RunFolder
from ...records.states import plural
from ...records.trace import RunTrace, wanted
from ...transports import TransportSet
from ..checks.isolation import NetworkNamespace, RunNetwork, choose_network
from .limits import check_open_files
from .signals import SIGNALS, Signals

if TYPE_CHECKING:
    from ..console.writer import Console
    from ..checks.preflight import CheckReport
    from .session import RunResult, SessionOptions

# How long the start waits for the exposure check's lookups once everything else is ready.
EXPOSURE_HOLD = 0.2

__all__ = ["LaunchRequest", "build_spec", "check", "dry_run", "run"]

@dataclass(frozen=True)
class LaunchRequest:
    """What a front end asks for: the cluster, and the run options (their defaults and checks are
    :class:`~launcher.options.RunOptions`'), some of which win over the cluster file's settings."""

    cluster: Callable[[frozenset[str]], ClusterSpec]  # this machine's host names -> the validated cluster
    options: RunOptions = RunOptions()
    keep_backup: bool = False  # offer the tasks a backup folder even without restarts (a requeued job resumes)


def build_spec(request: LaunchRequest, local_hosts: frozenset[str]) -> ClusterSpec:
    """The validated cluster the request describes, with command-line overrides applied."""
    spec = request.cluster(local_hosts)
    options = request.options
    check_launch_input(spec, options.env, options.command, os.environ)  # by-name values exist, text is clean
    if options.command:
        spec = replace(spec, command=options.command)
    if options.log_dir:
        spec = replace(spec, log_dir=options.log_dir)
    if options.threads is not None:
        spec = replace(spec, threads=options.threads)
    if options.cooldown is not None:
        spec = replace(spec, cooldown=options.cooldown)
    if options.min_workers is not None:
        from ...cluster.checks import floor_problem

        problem = floor_problem(spec, options.min_workers)
        if problem:
            raise OptionsError(f"{option_name('min_workers')}: {problem}")
        spec = replace(spec, min_workers=options.min_workers)
    spec = replace(spec, network=choose_network(spec, options, local_hosts))
    known = [task.name for task in spec.tasks]
    unknown = [name for name in options.tasks if name not in known]
    if unknown:
        raise UnknownTaskError(spec.source, given("tasks", ",".join(options.tasks)), unknown, known)
    return spec


def plan_for(spec: ClusterSpec, context: RunContext, local_hosts: frozenset[str],
             request: LaunchRequest) -> Plan:
    return plan_cluster(spec, context, local_hosts=local_hosts, cores_by_host={"localhost": cpu_count()},
                        default_python=sys.executable, default_workdir=os.getcwd(),
                        inherited_env=dict(os.environ), override_env=request.options.env)


def session_options(request: LaunchRequest, spec: ClusterSpec) -> SessionOptions:
    """The run-wide choices: the run options, else the cluster file's."""
    from .session import SessionOptions
    from ..faults.watchdog import WatchdogSettings

    options = request.options
    return SessionOptions(
        grace=options.grace,
        max_restarts=spec.max_restarts if options.max_restarts is None else options.max_restarts,
        restart_delay=spec.restart_delay if options.restart_delay is None else options.restart_delay,
        evaluator_timeout=options.evaluator_timeout,
        watchdog=WatchdogSettings(start_timeout=options.start_timeout, hang_timeout=options.hang_timeout),
        backup=request.keep_backup, log_max_size=options.log_max_size,
        on_straggler=options.on_straggler, straggler_timeout=options.straggler_timeout)


def dry_run(request: LaunchRequest) -> tuple[ClusterSpec, Plan]:
    """The plan a run would follow. No port is picked, held or locked: every ``auto`` port is shown
    as 0, with a note naming who picks it and when."""
    local_hosts = local_host_names()
    spec = build_spec(request, local_hosts)
    auto = [t for t in spec.tasks if t.port == AUTO]
    plan = _placeholder_plan(spec.with_ports({t.name: 0 for t in auto}), local_hosts, request)
    notes = []
    here = [t.name for t in auto if is_local(t.host, local_hosts)]
    if here:
        notes.append(f"port auto: {', '.join(here)} on this machine: tflaunch picks free ports when the run "
                     "starts and holds them until the tasks start (shown as port 0 here)")
    remote = _remote_auto(spec, local_hosts)
    if remote:
        by_host: dict[str, list[str]] = {}
        for task in remote:
            by_host.setdefault(task.host, []).append(task.name)
        where = "; ".join(f"{', '.join(names)} on {host}" for host, names in by_host.items())
        notes.append(f"port auto: {where}: each host's agent picks free ports there when the run starts and "
                     "holds them until its tasks start (shown as port 0 here)")
    return spec, replace(plan, notes=(*plan.notes, *notes))


def check(request: LaunchRequest) -> CheckReport:
    """``tflaunch check``: probe every host of the cluster in parallel."""
    from ..checks.preflight import CheckItem, check_hosts

    local_hosts = local_host_names()
    spec = build_spec(request, local_hosts)
    transports = TransportSet(request.options.grace)
    try:
        with _reserve_auto_ports(spec, local_hosts) as reservation:
            spec, refused = _agent_ports(spec.with_ports(reservation.ports), local_hosts, request, transports)
            # No mesh probe with 'auto' ports on this machine, as in a run (see check_hosts).
            report = check_hosts(_placeholder_plan(checked_spec(spec), local_hosts, request).launches,
                                 with_mesh=not reservation.ports, transports=transports)
            report.items += [CheckItem(host, "ports", False, f"spare: {why}") for host, why in refused.items()]
            return report
    finally:
        transports.close()


def _remote_auto(spec: ClusterSpec, local_hosts: frozenset[str]) -> list:
    """Tasks whose port is ``auto`` on another host (their host's agent picks it)."""
    return [t for t in spec.slots if t.port == AUTO and not is_local(t.host, local_hosts)]


def _agent_ports(spec: ClusterSpec, local_hosts: frozenset[str], request: LaunchRequest,
                 transports: TransportSet) -> tuple[ClusterSpec, dict[str, str]]:
    """The spec with every remote ``auto`` port filled in by that host's agent, which holds the
    port until the task that uses it starts (see :mod:`launcher.agent.ports`), and the spare
    hosts whose agent could not pick theirs, {host: why}: those spares are left out of the spec."""
    remote = _remote_auto(spec, local_hosts)
    if not remote:
        return spec, {}
    # Plan with stand-in ports only to bring the agents up; TF_CONFIG is written after they answer.
    launches = {l.host: l for l in _host_launches(checked_spec(spec.with_ports({t.name: 0 for t in remote})),
                                                  local_hosts, request)}
    transports.prepare(list(launches.values()))
    by_host: dict[str, list[str]] = {}
    for task in remote:
        by_host.setdefault(task.host, []).append(task.name)
    task_hosts = {task.host for task in spec.tasks}
    chosen: dict[str, int] = {}
    refused: dict[str, str] = {}
    for host, names in by_host.items():
        first = launches[host]
        try:
            link = transports.for_launch(first).link_for(first)
            timeout = first.connect_timeout + 20.0
            chosen.update(zip(names, link.pick_ports(len(names), timeout)))
        except OSError as exc:
            why = f"port auto: {exc.strerror or exc}"
            if host in task_hosts:
                raise EnvironmentProblem(f"{spec.source}: {why}") from None
            refused[host] = why  # a spare: the run goes on without it
    return without_spares(spec, refused).with_ports(chosen), refused


def _reserve_auto_ports(spec: ClusterSpec, local_hosts: frozenset[str], hold: int = HELD_AT_MOST) -> PortReservation:
    """Free, locked ports for the tasks on this machine whose port is ``auto``; at most ``hold``
    of them held as sockets (the descriptors the run can spare)."""
    try:
        return reserve_ports([t.name for t in spec.slots if t.port == AUTO and is_local(t.host, local_hosts)],
                             hold=hold)
    except OSError as exc:
        if exc.errno == errno.EMFILE:
            raise EnvironmentProblem(f"{spec.source}: cannot reserve ports for {plural(len(spec.tasks), 'task')}: "
                                     f"{exc.strerror} (raise the limit with 'ulimit -n')") from None
        raise EnvironmentProblem(f"{spec.source}: cannot reserve free ports for {plural(len(spec.tasks), 'task')} on this "
                                 f"machine: {exc.strerror or exc}") from None


def _host_launches(spec: ClusterSpec, local_hosts: frozenset[str], request: LaunchRequest) -> tuple[TaskLaunch, ...]:
    """The placeholder launch of the first task on each host: what bringing up every host's agent
    needs (its connection, interpreter, workdir and setup come from a host's first task), planned
    without the other tasks, whose plans a run makes once, when it starts them."""
    check_cluster_fits(spec)  # what the whole plan would refuse is refused before any host is reached
    firsts: dict[str, TaskSpec] = {}
    for task in spec.tasks:
        firsts.setdefault(task.host, task)
    return _placeholder_plan(replace(spec, tasks=tuple(firsts.values())), local_hosts, request).launches


def _placeholder_plan(spec: ClusterSpec, local_hosts: frozenset[str], request: LaunchRequest) -> Plan:
    """The plan with a stand-in run id, for showing and checking before a run exists."""
    log_dir = Path(spec.log_dir or DEFAULT_LOG_DIR)
    context = RunContext(run_id=RUN_ID_PLACEHOLDER, run_dir=str((log_dir / RUN_ID_PLACEHOLDER).resolve()))
    return plan_for(spec, context, local_hosts, request)


def run(request: LaunchRequest, console: Console, signals: Signals = SIGNALS,
        on_folder: Callable[[RunFolder], None] | None = None, *,
        folder_for: Callable[[ClusterSpec], RunFolder] | None = None, watch: tuple[int, ...] = ()) -> RunResult:
    """Start the cluster, supervise it to the end, and leave everything in its run folder.

    Signals are armed for the whole call: none raises; each is seen by the next wait. ``watch``
    adds signals to that path (a batch scheduler's warning signal).
    ``folder_for`` gives the run folder for the spec (by default a new one in its log directory).
    ``on_folder`` is told the run folder once it exists, before any task starts (for what runs
    beside the run, such as TensorBoard; it must return at once).
    """
    with signals.armed_for_run():
        if watch:
            signals.watch(*watch)
        local_hosts = local_host_names()
        spec = build_spec(request, local_hosts)
        missing_gpus = missing_gpus_warning(spec, local_hosts, gpu_count())
        if missing_gpus:
            console.message(missing_gpus)  # the run goes on: TensorFlow falls back to what there is
        exposure = _ExposureCheck(spec, console)
        spare = check_open_files(spec, local_hosts)
        reservation = _reserve_auto_ports(spec, local_hosts, hold=spare)
        # One agent per host for the whole run: the preflight's probes go through the same agents.
        transports = TransportSet(request.options.grace)
        sealing = None
        # The trace holds what comes before the run folder (the hosts being reached) until it exists.
        trace = RunTrace.begin() if wanted(request.options.debug) else None
        try:
            spec = spec.with_ports(reservation.ports)
            # A sealed or isolated run's namespace is made while this machine's agent starts.
            sealing = RunNetwork.begin(spec, [int(task.port) for task in spec.slots if task.port != AUTO])
            spec, refused = _agent_ports(spec, local_hosts, request, transports)
            for host, why in refused.items():
                console.message(f"preflight: spare {host} not used: {why}")
            if spec.network is Network.OPEN:  # in a namespace of its own, the machine's ports do not matter
                check_local_ports(spec, local_hosts, set(reservation.ports))
            remote = spec.transport is not None or not all(is_local(t.host, local_hosts) for t in spec.slots)
            # The preflight checks every task's plan, and every spare slot's; without it, each
            # host's first task is enough.
            checked = (_placeholder_plan(checked_spec(spec), local_hosts, request).launches
                       if not request.options.no_check and remote else None)
            # Every host's agent starts first (this machine's too): the name lookups, the preflight's
            # probes, the run folder and the session are set up while the hosts are being reached.
            transports.prepare(checked or _host_launches(checked_spec(spec), local_hosts, request))
            exposure.start()
            if checked:
                failed = _preflight(checked, spec, console, with_mesh=not reservation.ports, transports=transports)
                spec, refused = without_spares(spec, failed), {**refused, **failed}
            # The session's modules load while the hosts are being reached, not before.
            from .session import RunSession

            _stop_if_signalled(signals)
            # The namespace comes before the run folder: where it cannot be made, nothing is left.
            network = sealing.held(console.message) if sealing else None  # None for an open run
            if network is None and spec.network is Network.SEALED:  # it could not be sealed after all
                check_local_ports(spec, local_hosts, set(reservation.ports))
            folder = (folder_for or _new_folder)(spec)
            if trace is not None:
                trace.open(folder.debug_log_path)
            if on_folder is not None:
                on_folder(folder)

            def plan_attempt(context: RunContext, cluster: ClusterSpec) -> Plan:
                # The first attempt's tasks start right after it is planned and bind their ports
                # themselves: the sockets that held them go now (the locks stay for the run).
                reservation.unhold()
                if sealing is not None:
                    sealing.ready(console.message)  # its outside network came up beside the run's start
                return _entered(network, plan_for(cluster, context, local_hosts, request))

            # Its warning comes before any task's output when the names resolve at once; slow
            # lookups do not hold the start (their warning comes when they end).
            exposure.join(EXPOSURE_HOLD)
            session = RunSession(spec, session_options(request, spec), folder, console, plan_attempt,
                                 signals, transports, refused_spares=refused)
            result = session.execute()
            if signals.first is None:  # a run stopped by a signal does not wait for its lookups
                exposure.join()  # a run's warning is shown, however late its lookups end
            return result
        finally:
            transports.close()  # after a refused preflight too: nothing is left on any host
            if sealing is not None:
                sealing.close()  # once every task has ended
            reservation.release()
            exposure.drop()  # a launch stopped before its run (a refusal, Ctrl-C) does not wait for it
            if trace is not None:
                trace.end()  # after the links closed: their ends are in it


class _ExposureCheck(threading.Thread):
    """Resolves the cluster's names while the hosts are being reached, and warns when any of them is
    public. It ends within RESOLVE_TIMEOUT (a resolver that does not answer is given up on)."""

    def __init__(self, spec: ClusterSpec, console: Console):
        super().__init__(name="tflaunch-exposure", daemon=True)
        self.spec, self.console = spec, console
        self._lock = threading.Lock()
        self._dropped = False

    def run(self) -> None:
        from ...cluster.exposure import exposure_warning

        warning = exposure_warning(self.spec)
        with self._lock:
            if warning and not self._dropped:
                self.console.message(warning)

    def drop(self) -> None:
        """A launch that ended before any run: a warning that comes later is not shown (nor waited for)."""
        with self._lock:
            self._dropped = True


def _entered(network: NetworkNamespace | None, plan: Plan) -> Plan:
    """The plan with its tasks started inside the run's network namespace, when it has one."""
    return network.enter(plan) if network else plan


def _preflight(launches: tuple[TaskLaunch, ...], spec: ClusterSpec, console: Console, with_mesh: bool,
               transports: TransportSet) -> dict[str, str]:
    """Check every host; raise PreflightError when a host of the run fails. Returns the spare hosts
    that failed, {host: why}: they are not used (one console line each)."""
    from ..checks.preflight import check_hosts, refused_spares

    report = check_hosts(launches, with_mesh=with_mesh, transports=transports)
    refused = refused_spares(report, launches)
    failures = [item for item in report.failures if item.host not in refused]
    for host, why in refused.items():
        console.message(f"preflight: spare {host} not used: {why}")
    if failures:
        problems = "; ".join(i.line for i in failures)
        see = "" if python_caller() else f"see 'tflaunch check {spec.source}', or "  # a launch() call is no CLI source
        raise PreflightError(f"{spec.source}: preflight failed: {problems} "
                             f"({see}skip with {given('no_check', True)})")
    for item in report.items:
        if item.check == "versions" and item.warning:  # hosts that differ in patch releases only: the run goes on
            console.message(f"preflight: {item.detail}")
    return refused


def without_spares(spec: ClusterSpec, hosts: Mapping[str, str]) -> ClusterSpec:
    """The cluster without the spare slots on ``hosts``."""
    return replace(spec, spares=tuple(slot for slot in spec.spares if slot.host not in hosts)) if hosts else spec


def _stop_if_signalled(signals: Signals) -> None:
    """A signal that came before any task started ends the launch here, with nothing to clean up."""
    from .signals import Interrupted

    if signals.first is not None:
        raise Interrupted(signals.first)


def _new_folder(spec: ClusterSpec) -> RunFolder:
    return RunFolder.create(spec.log_dir, spec.source)


def check_local_ports(spec: ClusterSpec, local_hosts: frozenset[str], reserved: set[str]) -> None:
    """Refuse to start when a fixed port of a task on this machine is already taken."""
    for task in spec.slots:
        if task.name in reserved or not is_local(task.host, local_hosts):
            continue
        if not port_is_free(int(task.port)):
            raise PortInUseError(f"{spec.source}: {task.key}.port: {task.host}:{task.port} is already in use "
                                 f"on this machine (task {task.name}); expected a free port or 'auto'")
