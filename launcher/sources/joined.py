"""``--nnodes N --node-rank 0 --rdzv-endpoint HOST:PORT`` as a cluster source: the nodes that join.

Membership is a step of its own here: the rendezvous (:class:`launcher.transports.joined.Rendezvous`)
yields the nodes that are there, by rank, and only then is the cluster placed, so the plan is made
from members, not from a list written in advance. Node rank 0 (this machine, at the endpoint's
address) comes first and every other node follows in rank order, not arrival order, so that
``TF_CONFIG`` is the same whichever node came first. Each node has ``--tasks-per-node`` slots, and
the roles are carved out of them by the rule ``-H`` uses (:mod:`launcher.cluster.roles`).

A joined node's host is named ``rank-R`` in the run (:func:`launcher.transports.joined.node_host`).

The token: ``TFLAUNCH_RDZV_TOKEN`` or ``--rdzv-token-file``; without one only an endpoint on a
loopback address is allowed (every node is this machine), and the token is then this user's own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..cluster.spec import AUTO, ClusterSpec, TaskSpec, is_local, is_loopback
from ..errors import ConfigError, LaunchError, OptionsError
from ..options import DEFAULT_REJOIN_WAIT
from ..options import label as options_label
from ..taskenv import RDZV_TOKEN
from . import RoleOptions
from .platforms import DEFAULT_TIMEOUT

if TYPE_CHECKING:
    from .hosts import HostSlots

TOKEN_VARIABLE = RDZV_TOKEN
MIN_TOKEN = 16  # characters: a token shorter than that is guessable


class RendezvousError(LaunchError):
    """The nodes did not all come: one line naming the missing ranks."""

    exit_code = 1


def parse_endpoint(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) as (host, port); OptionsError naming the value."""
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise OptionsError(f"--rdzv-endpoint: expected HOST:PORT with PORT 1-65535, got {text!r}")
    return host, int(port)


def read_token(token_file: str | None, host: str, environ: dict[str, str] | None = None) -> str:
    """The run's token: the file's first line, else the variable; this user's own for a loopback
    endpoint; OptionsError when there is none (or it is too short to be secret)."""
    environ = os.environ if environ is None else environ
    if token_file:
        try:
            lines = Path(token_file).read_text().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise OptionsError(f"--rdzv-token-file: cannot read {token_file}: {getattr(exc, 'strerror', exc)}") \
                from None
        token, where = (lines[0].strip() if lines else ""), f"--rdzv-token-file {token_file}"
    elif environ.get(TOKEN_VARIABLE):
        token, where = environ[TOKEN_VARIABLE].strip(), TOKEN_VARIABLE
    elif is_loopback(host):
        return f"tflaunch-this-machine-{os.getuid()}"
    else:
        raise OptionsError(f"--rdzv-endpoint {host}: a rendezvous across machines needs a token every node has: "
                           f"set {TOKEN_VARIABLE} or give --rdzv-token-file FILE (at least {MIN_TOKEN} characters)")
    if len(token) < MIN_TOKEN or not token.isprintable() or " " in token:
        raise OptionsError(f"{where}: expected a token of at least {MIN_TOKEN} printable characters without spaces")
    return token


@dataclass(frozen=True, kw_only=True)
class JoinedSource(RoleOptions):
    """The nodes that join the rendezvous this machine (node rank 0) holds at ``host:port``."""

    nnodes: int
    host: str
    port: int
    token: str = field(repr=False)
    timeout: float = DEFAULT_TIMEOUT
    tasks_per_node: int = 1
    spares: int = 0  # spare nodes: ranks nnodes .. nnodes + spares - 1
    minimum: int | None = None  # --nnodes MIN:MAX: MIN (nnodes is MAX); None: nnodes
    rejoin_wait: float = DEFAULT_REJOIN_WAIT  # for a lost node to join again before the next attempt

    @property
    def label(self) -> str:
        nnodes = self.nnodes if self.minimum is None else f"{self.minimum}:{self.nnodes}"
        return options_label([("nnodes", nnodes), ("node-rank", 0), ("rdzv-endpoint", f"{self.host}:{self.port}"),
                              *([("tasks-per-node", self.tasks_per_node)] if self.tasks_per_node != 1 else []),
                              *self.role_words(), *([("spares", self.spares)] if self.spares else [])])

    def rendezvous(self):
        from ..transports.joined import Rendezvous

        return Rendezvous(self.nnodes, self.token, self.host, self.port, self.timeout, spares=self.spares,
                          minimum=self.minimum, rejoin_wait=self.rejoin_wait)


def joined_spec(source: JoinedSource, rendezvous, local_hosts: frozenset[str]) -> ClusterSpec:
    """The cluster of the nodes that joined ``rendezvous``: rank 0 here, the others in rank order."""
    # Here, not at the top: a node that joins a run reads the endpoint and the token only.
    from ..cluster.checks import check_cluster
    from ..cluster.placement import SPARE_ROLE
    from ..transports.joined import KIND, RendezvousMissing, node_host
    from .hosts import HostSlots, place

    if not is_local(source.host, local_hosts):
        raise ConfigError(source.label, "--rdzv-endpoint", f"{source.host} is not an address of this machine; node "
                          "rank 0 runs where the endpoint is")
    try:
        members = rendezvous.gather()
    except RendezvousMissing as exc:
        raise RendezvousError(str(exc)) from None
    except OSError as exc:
        raise RendezvousError(f"--rdzv-endpoint {source.host}:{source.port}: cannot listen there: "
                              f"{exc.strerror or exc}") from None
    addresses = {source.host: source.host, **{node_host(m.rank): m.address for m in members}}
    nodes = [m for m in members if m.rank < source.nnodes]
    hosts = (HostSlots(source.host, source.tasks_per_node, "node rank 0"),
             *(HostSlots(node_host(m.rank), source.tasks_per_node, f"node rank {m.rank}") for m in nodes))
    tasks = place(hosts, chief=source.chief, ps=source.ps, evaluator=source.evaluator, gpus=source.gpus,
                  source=source.label)
    tasks = tuple(replace(task, address=addresses[task.host]) for task in tasks)
    spares = tuple(TaskSpec(SPARE_ROLE, slot, node_host(m.rank), AUTO, address=m.address, key=f"spares[{slot}]")
                   for slot, m in enumerate(m for m in members if m.rank >= source.nnodes
                                            for _ in range(source.tasks_per_node)))
    spec = with_floor(ClusterSpec(source=source.label, tasks=tasks, transport=KIND, spares=spares), hosts, source)
    check_cluster(spec, local_hosts)
    return spec


def with_floor(spec: ClusterSpec, hosts: tuple[HostSlots, ...], source) -> ClusterSpec:
    """``spec`` with ``--nnodes MIN:MAX``'s floor, the training tasks ``source.minimum`` nodes hold,
    as its ``min_workers`` (unchanged without a MIN)."""
    from .hosts import place  # here, as in joined_spec: a joining node never places a cluster

    if source.minimum is None:
        return spec
    floor = len(place(hosts[:source.minimum], chief=source.chief, ps=source.ps, evaluator=source.evaluator,
                      source=source.label))
    return replace(spec, min_workers=floor - source.ps - int(source.evaluator))


class JoinedNodes:
    """The owner's source, once per run: the rendezvous, then the spec from its members; the
    rendezvous ends with the run's exit code (:meth:`finish`)."""

    def __init__(self, source: JoinedSource):
        self.source = source
        self.label = source.label
        self._rendezvous = None

    def spec(self, local_hosts: frozenset[str]) -> ClusterSpec:
        if self._rendezvous is None:
            self._rendezvous = self.source.rendezvous()
        return joined_spec(self.source, self._rendezvous, local_hosts)

    def finish(self, code: int) -> None:
        if self._rendezvous is not None:
            self._rendezvous.finish(code)
