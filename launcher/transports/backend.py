"""The one base class of every backend: a backend's one job is to connect a host's agent.

Everything else a transport does is the same whatever carries the agent's channel (this machine's
pipe, an ssh connection, a Slurm step's connection back): one link per host, made on first use and
made again once lost; a task started through its host's link, its output appended to its log; a
task that cannot even be sent a :class:`~.base.FailedStart`; the links' status changes noted on the
one hub; and at the end every channel closed first, then every carrier given one shared deadline.
A backend writes :meth:`AgentBackend.connect` (the link to one host's agent) and, where it differs
from the default, :meth:`~AgentBackend.host_key`, :meth:`~AgentBackend.fields`,
:meth:`~AgentBackend.cannot_connect`, :meth:`~AgentBackend.prepare`,
:meth:`~AgentBackend.leave_out`, :meth:`~AgentBackend.addresses` and :meth:`~AgentBackend.close_carriers`.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Collection, Hashable, Mapping, Sequence
from typing import TYPE_CHECKING

from ..agent.protocol import EOF_GRACE
from ..cluster.plan import TaskLaunch
from ..options import RunOptions
from .base import FailedStart
from .hostlink import AgentLink
from .linkhub import HUB
from .proxies import AgentTask, LogWriter
from .shipping import task_fields

if TYPE_CHECKING:
    from .linkhub import Changes

CLOSE_SLACK = 2.0  # beyond the agents' own EOF grace, for their carriers to end


class AgentBackend(ABC):
    """Starts tasks of one kind through one agent per host, whatever carries the agents' channels."""

    kind = "agent"  # the launches (their ``transport``) this backend starts

    def __init__(self, options: RunOptions):
        self.grace = options.grace
        self.links: dict[Hashable, AgentLink] = {}
        self.setups: dict[Hashable, str | None] = {}  # each host's setup line, run in front of its agent
        self.logs = LogWriter()

    # -- what a backend writes ---------------------------------------------------------------

    @abstractmethod
    def connect(self, launch: TaskLaunch) -> AgentLink:
        """The link to a new agent on ``launch``'s host (OSError when it cannot even be started)."""

    def host_key(self, launch: TaskLaunch) -> Hashable:
        """Launches with one key share one agent."""
        return launch.host

    def fields(self, launch: TaskLaunch) -> dict[str, object]:
        """What the agent needs to start ``launch``."""
        return task_fields(launch, self.grace, self.setups.get(self.host_key(launch)))

    def cannot_connect(self, exc: OSError) -> str:
        """Why a task could not start when its agent could not be (re-raises what is not this
        backend's to word)."""
        raise exc

    def close_carriers(self, links: Sequence[AgentLink], deadline: float) -> None:
        """After every channel closed: end each link's carrier by ``deadline`` (time.monotonic)."""
        for link in links:
            link.carrier.close(max(0.0, deadline - time.monotonic()))

    # -- the same for every backend ----------------------------------------------------------

    @property
    def changes(self) -> Changes:
        """The processes whose status changed: every backend's agents are served by one hub."""
        return HUB.changes

    def leave_out(self, hosts: Collection[str], back: Collection[str] = ()) -> None:
        """The run left ``hosts`` out and took ``back`` in again; a backend that asks a scheduler
        for its hosts keeps the left-out ones out of what it asks for."""

    def addresses(self) -> Mapping[str, str]:
        """{host: address} for hosts whose address changed during the run: none, but for nodes
        that join the run themselves."""
        return {}

    def mine(self, launches: Sequence[TaskLaunch]) -> list[TaskLaunch]:
        return [launch for launch in launches if launch.transport == self.kind]

    def prepare(self, launches: Sequence[TaskLaunch]) -> None:
        """Bring up every host's agent at once, so they come up in parallel; one that cannot even
        start is reported by its tasks' own starts."""
        for launch in self.mine(launches):
            if self.host_key(launch) not in self.links:
                try:
                    self.link_for(launch)
                except OSError:
                    pass

    def link_for(self, launch: TaskLaunch) -> AgentLink:
        """The link to ``launch``'s host agent, connected on first use and again once lost."""
        key = self.host_key(launch)
        link = self.links.get(key)
        if link is None or link.gone:
            link = self.links[key] = self.connect(launch)
            self.setups[key] = launch.setup if launch is not None else None  # None: this machine's, asked by no task
        return link

    def start(self, launch: TaskLaunch, log_path: str) -> AgentTask | FailedStart:
        """Start ``launch`` through its host's agent, its output appended to ``log_path``."""
        try:
            link = self.link_for(launch)
        except OSError as exc:
            return FailedStart(self.cannot_connect(exc))
        task = AgentTask(link, launch.name, log_path, self.logs)
        try:
            link.start(task, self.fields(launch))
        except ValueError as exc:  # a NUL, or more than one command line carries: nothing was sent
            return FailedStart(f"cannot start: {exc}")
        return task

    def close(self) -> None:
        """End of the run: every channel closes (each agent stops whatever is left and exits),
        then every carrier ends, within one deadline for all hosts, not one each."""
        links, self.links = list(self.links.values()), {}
        for link in links:
            link.close_channel()
        self.close_carriers(links, time.monotonic() + EOF_GRACE + CLOSE_SLACK)
        self.logs.close()
