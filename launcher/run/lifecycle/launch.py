"""The run layer's entry points: ``run``, ``dry_run`` and ``check`` for a launch request.

A request carries the cluster (a function from this machine's host names to a validated spec:
the CLI hands in a source's ``spec``, see :mod:`launcher.sources`) and the run options. Every plan
comes from one :class:`~.planner.Planner` (the spec, the ports, the placeholder plan, each
attempt's plan); this module runs its steps in the order that reaches the hosts while the rest
is set up (the agents, the preflight, the network namespace, the run folder), and then a
:class:`~.session.RunSession` runs the attempts. :func:`run` is the one way a cluster is
run, locally, over ssh or inside a Slurm allocation (:mod:`.slurmjob` passes how its
run folder is found and the signal it watches). Everything here reports through the
:class:`Console` it is given and returns results; it never prints on its own or exits.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Callable

from ...cluster.checks import missing_gpus_warning
from ...cluster.machine import gpu_count
from ...cluster.placement import checked_spec
from ...cluster.plan import Plan, RunContext, TaskLaunch
from ...cluster.spec import AUTO, ClusterSpec, Network, is_local
from ...errors import PreflightError
from ...options import given, python_caller
from ...records.folder import RunFolder
from ...records.trace import RunTrace, wanted
from ...transports import TransportSet
from ..checks.isolation import NetworkNamespace, RunNetwork
from .limits import check_open_files
from .planner import LaunchRequest, Planner, without_spares
from .signals import SIGNALS, Signals

if TYPE_CHECKING:
    from ..console.writer import Console
    from ..checks.preflight import CheckReport
    from .session import RunResult

# How long the start waits for the exposure check's lookups once everything else is ready.
EXPOSURE_HOLD = 0.2

__all__ = ["LaunchRequest", "check", "dry_run", "run"]

def dry_run(request: LaunchRequest) -> tuple[ClusterSpec, Plan]:
    """The plan a run would follow (:meth:`.planner.Planner.dry_run`): nothing is picked, held or locked."""
    return Planner(request).dry_run()


def check(request: LaunchRequest) -> CheckReport:
    """``tflaunch check``: probe every host of the cluster in parallel."""
    from ..checks.preflight import CheckItem, check_hosts

    planner = Planner(request)
    transports = TransportSet(request.options)
    try:
        with planner.reserve() as reservation:
            spec, refused = planner.with_agent_ports(planner.spec.with_ports(reservation.ports), transports)
            # No mesh probe with 'auto' ports on this machine, as in a run (see check_hosts).
            report = check_hosts(planner.placeholder(checked_spec(spec)).launches,
                                 with_mesh=not reservation.ports, transports=transports)
            report.items += [CheckItem(host, "ports", False, f"spare: {why}") for host, why in refused.items()]
            return report
    finally:
        transports.close()


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
        planner = Planner(request)
        local_hosts, spec = planner.local_hosts, planner.spec
        missing_gpus = missing_gpus_warning(spec, local_hosts, gpu_count())
        if missing_gpus:
            console.message(missing_gpus)  # the run goes on: TensorFlow falls back to what there is
        exposure = _ExposureCheck(spec, console)
        spare = check_open_files(spec, local_hosts)
        reservation = planner.reserve(hold=spare)
        # One agent per host for the whole run: the preflight's probes go through the same agents.
        transports = TransportSet(request.options)
        sealing = None
        # The trace holds what comes before the run folder (the hosts being reached) until it exists.
        trace = RunTrace.begin() if wanted(request.options.debug) else None
        try:
            spec = spec.with_ports(reservation.ports)
            # A sealed or isolated run's namespace is made while this machine's agent starts.
            sealing = RunNetwork.begin(spec, [int(task.port) for task in spec.slots if task.port != AUTO])
            spec, refused = planner.with_agent_ports(spec, transports)
            for host, why in refused.items():
                console.message(f"preflight: spare {host} not used: {why}")
            if spec.network is Network.OPEN:  # in a namespace of its own, the machine's ports do not matter
                planner.check_local_ports(spec, set(reservation.ports))
            remote = spec.transport is not None or not all(is_local(t.host, local_hosts) for t in spec.slots)
            # The preflight checks every task's plan, and every spare slot's; without it, each
            # host's first task is enough.
            checked = (planner.placeholder(checked_spec(spec)).launches
                       if not request.options.no_check and remote else None)
            # Every host's agent starts first (this machine's too): the name lookups, the preflight's
            # probes, the run folder and the session are set up while the hosts are being reached.
            transports.prepare(checked or planner.host_launches(checked_spec(spec)))
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
                planner.check_local_ports(spec, set(reservation.ports))
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
                return _entered(network, planner.attempt(context, cluster))

            # Its warning comes before any task's output when the names resolve at once; slow
            # lookups do not hold the start (their warning comes when they end).
            exposure.join(EXPOSURE_HOLD)
            session = RunSession(spec, request.options.over_file(spec.max_restarts, spec.restart_delay), folder,
                                 console, plan_attempt, signals, transports, refused_spares=refused,
                                 backup=request.keep_backup)
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


def _stop_if_signalled(signals: Signals) -> None:
    """A signal that came before any task started ends the launch here, with nothing to clean up."""
    from .signals import Interrupted

    if signals.first is not None:
        raise Interrupted(signals.first)


def _new_folder(spec: ClusterSpec) -> RunFolder:
    return RunFolder.create(spec.log_dir, spec.source)
