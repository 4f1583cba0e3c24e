"""The run layer's entry points: ``run``, ``dry_run`` and ``check`` for a launch request.

A request carries the cluster (a function from this machine's host names to a validated spec:
the CLI hands in a source's ``spec``, see :mod:`launcher.sources`) and the run options. One
:class:`~.planner.Planner` hands this module the run's finished plan (the cluster with every
port chosen, and the launches that bring up its hosts' agents); this module runs it: it starts
the agents, and while the hosts are being reached it sets up the rest (the preflight, the
network namespace, the run folder); then a :class:`~.session.RunSession` runs the attempts,
each planned by the same plan. :func:`run` is the one way a cluster is
run, locally, over ssh or inside a Slurm allocation (:mod:`.slurmjob` passes how its
run folder is found and the signal it watches). Everything here reports through the
:class:`Console` it is given and returns results; it never prints on its own or exits.
"""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, Callable

from ...cluster.plan import THIS_MACHINE, Plan, RunContext
from ...cluster.spec import ClusterSpec, Network
from ...errors import EnvironmentProblem, PreflightError
from ...options import given, python_caller
from ...records.folder import RunFolder
from ...records.trace import RunTrace, wanted
from ...transports import TransportSet
from ..checks.isolation import NetworkNamespace, RunNetwork
from .planner import LaunchRequest, Planner, RunPlan
from .signals import SIGNALS, Signals

if TYPE_CHECKING:
    from ..console.writer import Console
    from ..checks.preflight import CheckReport
    from .session import RunResult

# How long the start waits for the exposure check's lookups once everything else is ready.
EXPOSURE_HOLD = 0.2

__all__ = ["LaunchRequest", "check", "dry_run", "run"]


def dry_run(request: LaunchRequest) -> tuple[ClusterSpec, Plan]:
    """The plan a run would follow (:meth:`.planner.Planner.dry_run`): nothing is picked, held or locked.
    A sealed or isolated run's notes say where its tasks' dials lead and what they have of the outside."""
    from dataclasses import replace

    from ..checks.inside import plan_notes

    spec, plan = Planner(request).dry_run()
    return spec, replace(plan, notes=(*plan.notes, *plan_notes(spec)))


def check(request: LaunchRequest) -> CheckReport:
    """``tflaunch check``: probe every host of the cluster in parallel."""
    from ..checks.preflight import CheckItem, check_hosts

    transports = TransportSet(request.options)
    plan = None
    with contextlib.ExitStack() as cleanups:  # last first: the agents closed, then the ports released
        cleanups.callback(lambda: plan is not None and plan.release())
        cleanups.callback(transports.close)
        plan = Planner(request).plan_run(transports, checking=True)
        # No mesh probe with 'auto' ports on this machine, as in a run (see check_hosts).
        report = check_hosts(plan.agent_launches, with_mesh=plan.mesh_probe, transports=transports)
        report.items += [CheckItem(host, "ports", False, f"spare: {why}") for host, why in plan.refused.items()]
        if plan.spec.network in (Network.SEALED, Network.ISOLATED):
            from ..checks.isolation import check_network

            # What a sealed run would lack is a warning (it goes on, and may never need it); an isolated
            # run without its namespace does not start.
            sealed = plan.spec.network is Network.SEALED
            report.items += [CheckItem(THIS_MACHINE, kind, ok, detail, warning=sealed)
                             for kind, ok, detail in check_network(plan.spec, plan.fixed_ports)]
        return report


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
        for note in planner.notes():
            console.message(note)  # the run goes on
        exposure = _ExposureCheck(planner.spec, console)
        # One agent per host for the whole run: the preflight's probes go through the same agents.
        transports = TransportSet(request.options)
        plan = sealing = None
        # The trace holds what comes before the run folder (the hosts being reached) until it exists.
        trace = RunTrace.begin() if wanted(request.options.debug) else None
        # The launch's cleanups run last first, each whatever the ones before it raised.
        cleanups = contextlib.ExitStack()
        if trace is not None:
            cleanups.callback(trace.end)  # after the links closed: their ends are in it
        cleanups.callback(exposure.drop)  # a launch stopped before its run (a refusal, Ctrl-C) does not wait for it
        cleanups.callback(lambda: plan is not None and plan.release())
        cleanups.callback(lambda: sealing is not None and sealing.close())  # once every task has ended
        cleanups.callback(transports.close)  # after a refused preflight too: nothing is left on any host
        try:
            try:
                plan = planner.plan_run(transports, stopped=lambda: signals.first is not None)
            except EnvironmentProblem:
                _stop_if_signalled(signals)  # a signal cut the wait for an agent short: the signal's exit
                raise
            for host, why in plan.refused.items():
                console.message(f"preflight: spare {host} not used: {why}")
            # A sealed or isolated run's namespace is made while this machine's agent starts.
            sealing = RunNetwork.begin(plan.spec, plan.fixed_ports)
            # Every host's agent starts first (this machine's too): the name lookups, the preflight's
            # probes, the run folder and the session are set up while the hosts are being reached.
            transports.prepare(plan.agent_launches)
            exposure.start()
            if plan.preflight:
                plan = plan.without(_preflight(plan, console, transports))
            # The session's modules load while the hosts are being reached, not before.
            from .session import RunSession

            _stop_if_signalled(signals)
            # The namespace comes before the run folder: where it cannot be made, nothing is left.
            unsealed: list[str] = []

            def say_unsealed(line: str) -> None:
                unsealed.append(line)  # why a run to be sealed is not: run.json says it too
                console.message(line)

            network = sealing.held(say_unsealed) if sealing else None  # None for an open run
            if network is None and plan.spec.network is Network.SEALED:  # it could not be sealed after all
                plan.check_local_ports()
            folder = (folder_for or _new_folder)(plan.spec)
            if trace is not None and trace.open(folder.debug_log_path, request.options.log_max_size):
                console.message(f"tflaunch's own trace of this run: {folder.debug_log_path}")
            if on_folder is not None:
                on_folder(folder)

            def plan_attempt(context: RunContext, cluster: ClusterSpec) -> Plan:
                if sealing is not None:
                    sealing.ready()  # its outside network came up beside the run's start
                # A host may have come back at another address (a node that joined again): plan it there.
                return _entered(network, plan.attempt(context, cluster.at_addresses(transports.addresses())))

            # Its warning comes before any task's output when the names resolve at once; slow
            # lookups do not hold the start (their warning comes when they end).
            exposure.join(EXPOSURE_HOLD)
            spec = plan.spec
            session = RunSession(spec, request.options.over_file(spec.max_restarts, spec.restart_delay), folder,
                                 console, plan_attempt, signals, transports, refused_spares=plan.refused,
                                 backup=request.keep_backup)
            session.record.sealed, session.record.unsealed_because = network is not None, next(iter(unsealed), None)
            result = session.execute()
            if signals.first is None:  # a run stopped by a signal does not wait for its lookups
                exposure.join()  # a run's warning is shown, however late its lookups end
            return result
        finally:
            cleanups.close()


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


def _preflight(plan: RunPlan, console: Console, transports: TransportSet) -> dict[str, str]:
    """Check every host; raise PreflightError when a host of the run fails. Returns the spare hosts
    that failed, {host: why}: they are not used (one console line each)."""
    from ..checks.preflight import check_hosts, refused_spares

    spec, launches = plan.spec, plan.agent_launches
    report = check_hosts(launches, with_mesh=plan.mesh_probe, transports=transports)
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
    return RunFolder.create(spec.log_dir, spec.source, group=spec.log_group)
