"""``--ray ADDRESS --nnodes N`` as a cluster source: the Ray nodes of one placement group.

Membership is a step of its own, as for nodes that join: the run's placement group is reserved
(:class:`launcher.transports.ray.RayGroup`), one agent per bundle joins the run, and only then is
the cluster placed on the bundles, in bundle order. A bundle's host is its Ray node's id and its
tasks' address the Ray node's address, so that ``run.json`` names each task's Ray node. Each bundle
has ``--tasks-per-node`` slots, carved into roles as ``-H`` carves a host's, and each task gets
``--gpus-per-task`` of the GPUs Ray gave its bundle (its ``CUDA_VISIBLE_DEVICES``).

``--nnodes MIN:MAX``: the group has as many bundles as the cluster's nodes can hold, from MIN to
MAX; the run's floor is what MIN nodes hold. ``--spares K``: K more bundles, whose nodes take a
lost node's tasks at the next attempt. The group, the actors and the driver's connection are freed
by :meth:`RayNodes.finish`.
"""

from __future__ import annotations

import secrets
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..cluster.checks import check_cluster
from ..cluster.placement import SPARE_ROLE
from ..cluster.spec import AUTO, ClusterSpec, TaskSpec
from ..errors import OptionsError
from ..options import count as whole, name
from ..options import label as options_label
from . import RoleOptions
from .hosts import HostSlots, place
from .joined import RendezvousError, with_floor
from .platforms import DEFAULT_TIMEOUT


@dataclass(frozen=True, kw_only=True)
class RaySource(RoleOptions):
    """The Ray cluster at ``address`` and the nodes the run asks of it."""

    address: str
    nnodes: int
    minimum: int | None = None  # --nnodes MIN:MAX: MIN (nnodes is MAX); None: nnodes
    spares: int = 0
    tasks_per_node: int = 1
    gpus_per_task: int = 0
    timeout: float | None = None  # --start-timeout: how long the group may take to be placed

    @property
    def label(self) -> str:
        nnodes = self.nnodes if self.minimum is None else f"{self.minimum}:{self.nnodes}"
        return options_label([("ray", self.address), ("nnodes", nnodes),
                              *([("tasks-per-node", self.tasks_per_node)] if self.tasks_per_node != 1 else []),
                              *([("gpus-per-task", self.gpus_per_task)] if self.gpus_per_task else []),
                              *self.role_words(), *([("spares", self.spares)] if self.spares else [])])

    @property
    def within(self) -> float:
        return DEFAULT_TIMEOUT if self.timeout is None else self.timeout


def node_count(value: int | str) -> tuple[int, int | None]:
    """``N`` or ``MIN:MAX`` (an int, or text) as (MAX, MIN or None); OptionsError naming the value."""
    if isinstance(value, int) and not isinstance(value, bool):
        return whole("nnodes", value, 1), None
    low, sep, high = str(value).partition(":")
    words = [low, high] if sep else [low]
    if not all(w.strip().isascii() and w.strip().isdigit() and int(w) >= 1 for w in words) or \
            (sep and int(low) > int(high)):
        raise OptionsError(f"{name('nnodes')}: expected N or MIN:MAX (whole numbers, 1 <= MIN <= MAX), got {value!r}")
    return int(words[-1]), (int(low) if sep else None)


def ray_nodes(choice, address: str | None, nnodes: int | str | None, *, tasks_per_node: int = 1,
              gpus_per_task: int = 0, spares: int = 0, start_timeout: float | None = None) -> "RayNodes":
    """The Ray source the options name, every front end's: ``choice`` (a
    :class:`~.choose.ClusterChoice`) names no other cluster and its roles only; OptionsError otherwise."""
    from ..transports.ray import check_address

    if any(value is not None for value in (choice.cluster, choice.local, choice.hosts, choice.hostfile)):
        raise OptionsError(f"{name('ray')} takes its hosts from the Ray cluster; drop the cluster file, "
                           f"{name('local')}, {name('hosts')}, {name('hostfile')} and --slurm")
    if nnodes is None:
        raise OptionsError(f"{name('ray')} needs {name('nnodes')} N (or MIN:MAX): the Ray nodes to run on")
    if choice.gpus:
        raise OptionsError(f"{name('ray')} takes each task's GPUs from its bundle: give {name('gpus_per_task')} G, "
                           f"not {name('gpus')}")
    most, least = node_count(nnodes)
    return RayNodes(RaySource(address=check_address(address or "auto"), nnodes=most, minimum=least, spares=spares,
                              tasks_per_node=whole("tasks_per_node", tasks_per_node, 1),
                              gpus_per_task=whole("gpus_per_task", gpus_per_task, 0), timeout=start_timeout,
                              chief=choice.chief, ps=choice.ps, evaluator=choice.evaluator))


RAY_KEYS = ("address", "nnodes", "tasks_per_node", "gpus_per_task", "spares", "start_timeout", "chief", "ps",
            "evaluator")


def ray_section(path: str, section: Mapping[str, Any]) -> "RayNodes":
    """The Ray source a cluster file's ``ray:`` section names; ConfigError naming the file, the key
    and the value."""
    from ..cluster.fields import FieldReader
    from ..transports.ray import check_address

    fields = FieldReader(path)
    fields.check_keys(section, RAY_KEYS, "ray")
    address = fields.expect_str(section.get("address", "auto"), "ray.address")
    if section.get("nnodes") is None:
        raise fields.fail("ray.nnodes", "expected the Ray nodes to run on: N or 'MIN:MAX'")
    try:
        check_address(address)
        most, least = node_count(section["nnodes"])
    except OptionsError as exc:
        key = "ray.address" if str(exc).startswith("--ray") else "ray.nnodes"
        raise fields.fail(key, str(exc).split(": ", 1)[1]) from None
    timeout = section.get("start_timeout")
    return RayNodes(RaySource(
        address=address, nnodes=most, minimum=least,
        spares=fields.read_count(section.get("spares", 0), "ray.spares"),
        tasks_per_node=fields.read_count(section.get("tasks_per_node", 1), "ray.tasks_per_node", least=1),
        gpus_per_task=fields.read_count(section.get("gpus_per_task", 0), "ray.gpus_per_task"),
        timeout=None if timeout is None else fields.read_seconds(timeout, "ray.start_timeout"),
        chief=fields.read_bool(section.get("chief", False), "ray.chief"),
        ps=fields.read_count(section.get("ps", 0), "ray.ps"),
        evaluator=fields.read_bool(section.get("evaluator", False), "ray.evaluator")), label=path)


class RayNodes:
    """The run's source, once per run: the group reserved, its agents joined, then the spec; every
    Ray resource of the run freed by :meth:`finish`."""

    def __init__(self, source: RaySource, label: str | None = None):
        self.source = source
        self.label = label or source.label
        self._group = None
        self._rendezvous = None
        self._spec: ClusterSpec | None = None
        # The first signal received, or None: a Ctrl-C cuts the waits for Ray short. The command
        # line's is the process-wide one; launch() sets the call's own.
        self.signalled: Callable[[], int | None] = _first_signal

    def spec(self, local_hosts: frozenset[str]) -> ClusterSpec:
        if self._spec is None:
            self._spec = self._gather(local_hosts)
        return self._spec

    def _gather(self, local_hosts: frozenset[str]) -> ClusterSpec:
        from ..run.lifecycle.signals import Interrupted
        from ..transports.ray import Stopped

        try:
            return self._placed(local_hosts)
        except Stopped:
            raise Interrupted(self.signalled() or signal.SIGINT) from None

    def _placed(self, local_hosts: frozenset[str]) -> ClusterSpec:
        from ..transports.joined import Rendezvous, RendezvousMissing
        from ..transports.ray import KIND, RayCarrier, RayGroup

        source = self.source
        self._group = group = RayGroup(source.address, source.tasks_per_node,
                                       source.tasks_per_node * source.gpus_per_task, source.within,
                                       stopped=lambda: self.signalled() is not None)
        group.open()
        count = source.nnodes + source.spares
        if source.minimum is not None:
            count = max(source.minimum, min(count, group.fitting_nodes()))
        bundles = group.reserve(count)
        nnodes = min(count, source.nnodes)
        token = secrets.token_hex(32)  # this run's own: the actors get it, the channel proves it both ways
        self._rendezvous = rendezvous = Rendezvous(
            nnodes, token, group.driver_address(), 0, source.within, spares=count - nnodes,
            minimum=source.minimum, rejoin_wait=0.0,  # an actor that is gone never joins again
            first=0, names=lambda rank: bundles[rank].node_id,
            carrier=lambda address, rank: RayCarrier(bundles[rank].node_id, bundles[rank].address))
        port = rendezvous.listen()
        bundles = group.start_agents(bundles, rendezvous.host, port, token, count)
        try:
            members = rendezvous.gather()
        except RendezvousMissing as exc:
            raise RendezvousError(f"--ray {source.address}: the agent{'s' if len(exc.ranks) > 1 else ''} of bundle"
                                  f"{'s' if len(exc.ranks) > 1 else ''} {', '.join(map(str, exc.ranks))} did not "
                                  f"connect back within {exc.within:g} s") from None
        joined = [bundles[m.rank] for m in members]
        nodes = [b for b in joined if b.rank < nnodes]
        hosts = tuple(HostSlots(b.node_id, source.tasks_per_node, f"Ray node {b.node_id} ({b.address})")
                      for b in nodes)
        tasks = place(hosts, chief=source.chief, ps=source.ps, evaluator=source.evaluator, source=source.label)
        tasks = _on_bundles(tasks, {b.node_id: b for b in joined}, source.gpus_per_task)
        spare_slots = tuple(TaskSpec(SPARE_ROLE, slot, b.node_id, AUTO, address=b.address, key=f"spares[{slot}]")
                            for slot, b in enumerate(b for b in joined if b.rank >= nnodes
                                                     for _ in range(source.tasks_per_node)))
        spares = _on_bundles(spare_slots, {b.node_id: b for b in joined}, source.gpus_per_task)
        spec = with_floor(ClusterSpec(source=source.label, tasks=tasks, transport=KIND, spares=spares), hosts, source)
        check_cluster(spec, local_hosts)
        return spec

    def finish(self, code: int) -> None:
        """The agents told the run's exit code, then every actor and the group freed."""
        try:
            if self._rendezvous is not None:
                self._rendezvous.finish(code)
        finally:
            if self._group is not None:
                self._group.close()


def _first_signal() -> int | None:
    from ..run.lifecycle.signals import SIGNALS

    return SIGNALS.first


def _on_bundles(tasks, bundles, per_task: int) -> tuple[TaskSpec, ...]:
    """``tasks`` at their bundle's address, each with its ``per_task`` of the GPUs Ray gave the
    bundle, in slot order (none: CPU only)."""
    placed, used = [], {}
    for task in tasks:
        bundle = bundles[task.host]
        first = used.get(task.host, 0)
        used[task.host] = first + per_task
        placed.append(replace(task, address=bundle.address, gpus=tuple(bundle.gpus[first:first + per_task])))
    return tuple(placed)
