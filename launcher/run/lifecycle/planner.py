"""A run's plan, made in one place: from a launch request to the plan each attempt runs.

A :class:`LaunchRequest` is what a front end asks for. A :class:`Planner` owns every step between
what a front end asked for and a task's launch, in this order:

1. the spec (made when the planner is): the cluster the request names, the run options over it
   (command, log_dir, threads, cooldown, min_workers, the network), its by-name values checked;
2. this machine's ``auto`` ports, reserved and locked within the open files the run can spare;
3. the other hosts' ``auto`` ports, picked and held by their agents (a spare whose agent cannot
   pick them is left out);
4. this machine's fixed ports checked free (for a run on the machine's own network);
5. the placeholder plan (a stand-in run id) that ``--dry-run`` shows, the preflight checks and every
   host's agent starts from, refused first where the whole plan would be (too large a TF_CONFIG,
   GPUs shared without leave);
6. each attempt's plan, for the run and the cluster the host pool chose.

Steps 2 to 5 are :meth:`Planner.plan_run`, which hands the run one finished :class:`RunPlan`: the
cluster with every port chosen and the launches that bring up its hosts' agents. The run
(:mod:`.launch`) starts the agents from it, leaves out the spares its preflight refuses
(:meth:`RunPlan.without`), and plans each attempt with :meth:`RunPlan.attempt`.
"""

from __future__ import annotations

import errno
import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping

from ...cluster.checks import floor_problem, missing_gpus_warning
from ...cluster.machine import cpu_count, gpu_count, local_host_names
from ...cluster.placement import checked_spec
from ...cluster.plan import Plan, RunContext, TaskLaunch, check_cluster_fits, plan_cluster
from ...cluster.ports import HELD_AT_MOST, PortReservation, port_is_free, reserve_ports
from ...cluster.spec import AUTO, ClusterSpec, Network, TaskSpec, check_launch_input, is_local
from ...errors import ConfigError, EnvironmentProblem, OptionsError, PortInUseError, UnknownTaskError
from ...options import RunOptions, given
from ...units import group_id
from ...options import name as option_name
from ...records.folder import DEFAULT_LOG_DIR, RUN_ID_PLACEHOLDER
from ...records.states import plural
from ..checks.isolation import choose_network
from .limits import check_open_files

if TYPE_CHECKING:
    from ...transports import TransportSet


SCRIPT_READ_AT_MOST = 1 << 20  # a script larger than this counts as one that may run Keras, unread


def script_text(path: str) -> str | None:
    """A Python script's text, for the Keras note; None when it cannot be read (it is then counted as
    one that may run Keras)."""
    try:
        with open(path, "rb") as script:
            data = script.read(SCRIPT_READ_AT_MOST + 1)
    except OSError:
        return None
    if len(data) > SCRIPT_READ_AT_MOST:
        return None
    return data.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class LaunchRequest:
    """What a front end asks for: the cluster, and the run options (their defaults and checks are
    :class:`~launcher.options.RunOptions`'), some of which win over the cluster file's settings."""

    cluster: Callable[[frozenset[str]], ClusterSpec]  # this machine's host names -> the validated cluster
    options: RunOptions = RunOptions()
    keep_backup: bool = False  # offer the tasks a backup folder even without restarts (a requeued job resumes)


class Planner:
    """The plans of one launch request (the steps in the module docstring)."""

    def __init__(self, request: LaunchRequest, local_hosts: frozenset[str] | None = None):
        self.request = request
        self.options = request.options
        self.local_hosts = local_host_names() if local_hosts is None else local_hosts
        self.spec = self._build()

    def _build(self) -> ClusterSpec:
        """The validated cluster the request describes, with the run options over it."""
        options = self.options
        spec = self.request.cluster(self.local_hosts)
        check_launch_input(spec, options.env, options.command, os.environ)  # by-name values exist, text is clean
        if options.command:
            spec = replace(spec, command=options.command)
        if options.log_dir:
            spec = replace(spec, log_dir=options.log_dir)
        if options.log_group:
            spec = replace(spec, log_group=options.log_group)  # checked by RunOptions
        elif spec.log_group:
            check_log_group(spec)
        if options.threads is not None:
            spec = replace(spec, threads=options.threads)
        if options.cooldown is not None:
            spec = replace(spec, cooldown=options.cooldown)
        if options.min_workers is not None:
            problem = floor_problem(spec, options.min_workers)
            if problem:
                raise OptionsError(f"{option_name('min_workers')}: {problem}")
            spec = replace(spec, min_workers=options.min_workers)
        self._refuse_what_cannot_act(spec)
        spec = replace(spec, network=choose_network(spec, options, self.local_hosts))
        known = [task.name for task in spec.tasks]
        unknown = [name for name in options.tasks if name not in known]
        if unknown:
            raise UnknownTaskError(spec.source, given("tasks", ",".join(options.tasks)), unknown, known)
        return spec

    def _refuse_what_cannot_act(self, spec: ClusterSpec) -> None:
        """OptionsError for an option that leaves a host out when every task runs on this machine,
        which is never left out: accepted, it would look like protection the run does not have."""
        if spec.transport is not None or not all(is_local(t.host, self.local_hosts) for t in spec.slots):
            return
        why = "every task runs on this machine, which a run never leaves out"
        if self.options.min_workers is not None:
            raise OptionsError(f"{given('min_workers', self.options.min_workers)}: {why}, so no host is lost and "
                               "nothing shrinks; it applies to runs over ssh or in a Slurm allocation")
        if self.options.on_straggler == "exclude":
            raise OptionsError(f"{given('on_straggler', 'exclude')}: {why}, so a straggler's host cannot be left "
                               f"out; {given('on_straggler', 'warn')} (the default) names it, exclude applies to runs "
                               "over ssh or in a Slurm allocation with a spare or a minimum of workers")

    def notes(self) -> list[str]:
        """What the user should hear before the run starts and that does not stop it: tasks given
        GPUs this machine does not have (TensorFlow falls back to what there is)."""
        warning = missing_gpus_warning(self.spec, self.local_hosts, gpu_count())
        return [warning] if warning else []

    def plan_run(self, transports: TransportSet, *, checking: bool = False,
                 stopped: Callable[[], bool] = lambda: False) -> RunPlan:
        """Steps 2 to 5: the run's finished plan before its first attempt. Remote ``auto`` ports are
        picked through ``transports`` (the run's agents, which start here when the cluster has any).

        ``checking`` plans for ``tflaunch check``: every slot's launch for its probes, at most the
        usual ports held, and a fixed port in use left for the probes to report. ``stopped()`` says
        when the run was stopped meanwhile: an agent's ports are then no longer waited for."""
        hold = HELD_AT_MOST if checking else check_open_files(self.spec, self.local_hosts)
        reservation = self.reserve(hold)
        try:
            spec, refused = self.with_agent_ports(self.spec.with_ports(reservation.ports), transports, stopped)
            if not checking and spec.network is Network.OPEN:  # in a namespace of its own, the machine's ports do not matter
                self.check_local_ports(spec, set(reservation.ports))
            remote = spec.transport is not None or not all(is_local(t.host, self.local_hosts) for t in spec.slots)
            # The preflight checks every task's plan, and every spare slot's; without it, each host's
            # first task is enough to bring up its agent.
            preflight = checking or (remote and not self.options.no_check)
            launches = (self.placeholder(checked_spec(spec)).launches if preflight
                        else self.host_launches(checked_spec(spec)))
        except BaseException:
            reservation.release()
            raise
        return RunPlan(self, spec, reservation, launches, preflight, refused)

    # -- ports -------------------------------------------------------------------------------

    def reserve(self, hold: int = HELD_AT_MOST) -> PortReservation:
        """Free, locked ports for the tasks on this machine whose port is ``auto``; at most ``hold``
        of them held as sockets (the descriptors the run can spare)."""
        spec = self.spec
        try:
            return reserve_ports([t.name for t in spec.slots if t.port == AUTO and is_local(t.host, self.local_hosts)],
                                 hold=hold)
        except OSError as exc:
            if exc.errno == errno.EMFILE:
                raise EnvironmentProblem(f"{spec.source}: cannot reserve ports for {plural(len(spec.tasks), 'task')}: "
                                         f"{exc.strerror} (raise the limit with 'ulimit -n')") from None
            raise EnvironmentProblem(f"{spec.source}: cannot reserve free ports for {plural(len(spec.tasks), 'task')} "
                                     f"on this machine: {exc.strerror or exc}") from None

    def check_local_ports(self, spec: ClusterSpec, reserved: set[str]) -> None:
        """Refuse to start when a fixed port of a task on this machine is already taken."""
        for task in spec.slots:
            if task.name in reserved or not is_local(task.host, self.local_hosts):
                continue
            if not port_is_free(int(task.port)):
                raise PortInUseError(f"{spec.source}: {task.key}.port: {task.host}:{task.port} is already in use "
                                     f"on this machine (task {task.name}); expected a free port or 'auto'")

    def remote_auto(self, spec: ClusterSpec) -> list[TaskSpec]:
        """Tasks whose port is ``auto`` on another host (their host's agent picks it)."""
        return [t for t in spec.slots if t.port == AUTO and not is_local(t.host, self.local_hosts)]

    def with_agent_ports(self, spec: ClusterSpec, transports: TransportSet,
                         stopped: Callable[[], bool] = lambda: False) -> tuple[ClusterSpec, dict[str, str]]:
        """The spec with every remote ``auto`` port filled in by that host's agent, which holds the
        port until the task that uses it starts (see :mod:`launcher.agent.ports`), and the spare
        hosts whose agent could not pick theirs, {host: why}: those spares are left out of the spec."""
        remote = self.remote_auto(spec)
        if not remote:
            return spec, {}
        # Plan with stand-in ports only to bring the agents up; TF_CONFIG is written after they answer.
        launches = {l.host: l for l in self.host_launches(checked_spec(spec.with_ports({t.name: 0 for t in remote})))}
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
                chosen.update(zip(names, link.pick_ports(len(names), timeout, stopped)))
            except OSError as exc:
                why = f"port auto: {exc.strerror or exc}"
                if host in task_hosts:
                    raise EnvironmentProblem(f"{spec.source}: {why}") from None
                refused[host] = why  # a spare: the run goes on without it
        return without_spares(spec, refused).with_ports(chosen), refused

    # -- plans -------------------------------------------------------------------------------

    def attempt(self, context: RunContext, cluster: ClusterSpec) -> Plan:
        """The plan of ``cluster`` (the whole one, or the one the run's hosts allow) for the run ``context``."""
        return plan_cluster(cluster, context, local_hosts=self.local_hosts, cores_by_host={"localhost": cpu_count()},
                            default_python=sys.executable, default_workdir=os.getcwd(),
                            inherited_env=dict(os.environ), override_env=self.options.env, script_text=script_text)

    def placeholder(self, spec: ClusterSpec) -> Plan:
        """The plan with a stand-in run id, for showing and checking before a run exists."""
        log_dir = Path(spec.log_dir or DEFAULT_LOG_DIR)
        context = RunContext(run_id=RUN_ID_PLACEHOLDER, run_dir=str((log_dir / RUN_ID_PLACEHOLDER).resolve()))
        return self.attempt(context, spec)

    def host_launches(self, spec: ClusterSpec) -> tuple[TaskLaunch, ...]:
        """The placeholder launch of the first task on each host: what bringing up every host's agent
        needs (its connection, interpreter, workdir and setup come from a host's first task), planned
        without the other tasks, whose plans a run makes once, when it starts them."""
        check_cluster_fits(spec)  # what the whole plan would refuse is refused before any host is reached
        firsts: dict[str, TaskSpec] = {}
        for task in spec.tasks:
            firsts.setdefault(task.host, task)
        return self.placeholder(replace(spec, tasks=tuple(firsts.values()))).launches

    def dry_run(self) -> tuple[ClusterSpec, Plan]:
        """The plan a run would follow. No port is picked, held or locked: every ``auto`` port is shown
        as 0, with a note naming who picks it and when."""
        spec = self.spec
        auto = [t for t in spec.tasks if t.port == AUTO]
        plan = self.placeholder(spec.with_ports({t.name: 0 for t in auto}))
        notes = []
        here = [t.name for t in auto if is_local(t.host, self.local_hosts)]
        if here:
            notes.append(f"port auto: {', '.join(here)} on this machine: tflaunch picks free ports when the run "
                         "starts and holds them until the tasks start (shown as port 0 here)")
        remote = self.remote_auto(spec)
        if remote:
            by_host: dict[str, list[str]] = {}
            for task in remote:
                by_host.setdefault(task.host, []).append(task.name)
            where = "; ".join(f"{', '.join(names)} on {host}" for host, names in by_host.items())
            notes.append(f"port auto: {where}: each host's agent picks free ports there when the run starts and "
                         "holds them until its tasks start (shown as port 0 here)")
        return spec, replace(plan, notes=(*plan.notes, *notes))


def check_log_group(spec: ClusterSpec) -> None:
    """ConfigError naming the file, ``log_group`` and its value when this user cannot give a run
    folder that group (no such group here, or not one of the user's)."""
    try:
        group_id(spec.log_group)
    except ValueError as exc:
        raise ConfigError(spec.source, "log_group", str(exc)) from None


def without_spares(spec: ClusterSpec, hosts: Mapping[str, str]) -> ClusterSpec:
    """The cluster without the spare slots on ``hosts``."""
    return replace(spec, spares=tuple(slot for slot in spec.spares if slot.host not in hosts)) if hosts else spec


@dataclass(frozen=True)
class RunPlan:
    """A run's finished plan before its first attempt (:meth:`Planner.plan_run`)."""

    planner: Planner
    spec: ClusterSpec  # every task's and spare's port chosen
    reservation: PortReservation  # this machine's ``auto`` ports, locked for the run
    agent_launches: tuple[TaskLaunch, ...]  # what brings up each host's agent (every slot's, with a preflight)
    preflight: bool  # the agent launches are every slot's, for the preflight to check
    refused: dict[str, str] = field(default_factory=dict)  # spares left out, {host: why}

    @property
    def fixed_ports(self) -> list[int]:
        """Every port the plan has chosen (a sealed run's namespace reserves them inside)."""
        return [int(task.port) for task in self.spec.slots if task.port != AUTO]

    @property
    def mesh_probe(self) -> bool:
        """Whether the preflight may dial the tasks' ports between hosts: not while this machine
        holds picked ports (a probe would have to listen on them)."""
        return not self.reservation.ports

    def without(self, failed: Mapping[str, str]) -> RunPlan:
        """The plan without the spares that failed the preflight, {host: why}."""
        if not failed:
            return self
        return replace(self, spec=without_spares(self.spec, failed), refused={**self.refused, **failed})

    def check_local_ports(self) -> None:
        """Refuse the run when a fixed port on this machine is taken (a run that was to be sealed
        in a namespace of its own and meets the machine's network after all)."""
        self.planner.check_local_ports(self.spec, set(self.reservation.ports))

    def attempt(self, context: RunContext, cluster: ClusterSpec) -> Plan:
        """Step 6: the plan of one attempt. Its tasks start right after it is made and bind their
        ports themselves: the sockets that held them go now (the locks stay for the run)."""
        self.reservation.unhold()
        return self.planner.attempt(context, cluster)

    def release(self) -> None:
        """Let go of this machine's ports, once the run has ended."""
        self.reservation.release()
