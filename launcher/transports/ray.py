"""Ray as a carrier of the agents' channels: ``tflaunch --ray ADDRESS --nnodes N``.

tflaunch connects to the Ray cluster as a driver, reserves one ``STRICT_SPREAD`` placement group
(one bundle per node: ``--tasks-per-node`` CPUs and that many times ``--gpus-per-task`` GPUs), and
starts one actor per bundle (:class:`RayGroup`). Each actor runs the host agent, shipped as one
source as to an ssh host (nothing of tflaunch need be installed on the Ray nodes), and the agent
dials back to tflaunch the way a node that joins a run does (:class:`.joined.Rendezvous`, with no
rank of its own here): both ends prove the run's token on the channel's handshake. From then on a
bundle's agent is a link like any other (:class:`RayTransport`).

The agent is tied to its actor (it gets SIGTERM when the actor's process ends, however it ends,
and stops its tasks), and the actors and the group are the driver's: freed by
:meth:`RayGroup.close` at the end of the run, and by Ray itself when tflaunch is killed. A Ray
node that dies takes its actor and agent with it: a lost host. Ray is imported here only, when a
run names ``--ray``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..agent.protocol import EOF_GRACE, beat_for, encode_fields, sample_for
from ..cluster.spec import DEFAULT_KEEPALIVE_TIMEOUT
from ..cluster.plan import TaskLaunch
from ..errors import LaunchError, OptionsError
from .carriers import NodeCarrier
from .joined import JoinedTransport
from .shipping import remote_agent_argv

KIND = "ray"
EXTRA = "pip install 'tflaunch[ray]'"
NAMESPACE = "tflaunch"  # the Ray namespace of every run's actors and placement groups
POLL = 0.25  # seconds between looks at a group being placed, or actors starting
AUTH_VARIABLES = ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")  # Ray's own token: the tasks never see it


class Stopped(Exception):
    """A signal came while the group was being placed or its actors started."""


class RayStartError(LaunchError):
    """The Ray cluster could not give the run its nodes: one line saying what it lacks."""

    exit_code = 1


@dataclass(frozen=True)
class Bundle:
    """One bundle of the run's placement group: the Ray node it is on and the GPUs Ray gave it."""

    rank: int  # its index in the group
    node_id: str
    address: str  # the Ray node's address
    gpus: tuple[int, ...] = ()


class RayCarrier(NodeCarrier):
    """A bundle's agent, run by its actor on a Ray node; the host is the Ray node's id."""

    kind = KIND

    def __init__(self, host: str, address: str):
        super().__init__(host, f"Ray node {host}", address)
        self.address = address


def _agent_actor():
    """The actor class that runs one bundle's agent. Made here, not at module level, so that Ray
    ships it by value: a Ray node needs nothing of tflaunch, only a Python."""

    class TflaunchAgent:
        def where(self):
            """This actor's Ray node (id and address) and the GPUs Ray gave its bundle."""
            import ray

            return (ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(),
                    [int(gpu) for gpu in ray.get_gpu_ids()])

        def serve(self, argv, token, hidden):
            """Run the agent, under its tie, until it exits; its exit code."""
            import ctypes
            import os
            import signal
            import subprocess
            import sys

            # Ray SIGKILLs an actor's own children as the actor's process exits (as it does when its
            # driver, tflaunch, is gone): an agent killed so could not stop its tasks. So the actor's
            # child is a tie that takes that SIGKILL, and the agent, the tie's child, gets SIGTERM as
            # the tie ends (PR_SET_PDEATHSIG) and stops its tasks. The tie gets SIGTERM when the actor's
            # process ends without killing it (ray.kill, a crash). Each checks that its parent is still
            # the one it was started by: one that died before the prctl sends no signal.
            tie = ("import ctypes, os, signal, subprocess, sys\n"
                   "parent = os.getpid()\n"
                   "def tied():\n"
                   "    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))\n"
                   "    if os.getppid() != parent:\n"
                   "        os._exit(1)\n"
                   "code = subprocess.call(sys.argv[1:], preexec_fn=tied)\n"
                   "sys.exit(code if code >= 0 else 128 - code)\n")
            actor = os.getpid()

            def tied():
                ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))
                if os.getppid() != actor:
                    os._exit(1)

            env = {name: value for name, value in os.environ.items() if name not in hidden}
            agent = subprocess.Popen([sys.executable, "-c", tie, sys.executable, *argv], stdin=subprocess.PIPE,
                                     start_new_session=True, preexec_fn=tied, close_fds=True, env=env)
            try:
                agent.stdin.write(token.encode() + b"\n")  # read once; the token is in no command line
                agent.stdin.close()
            except OSError:
                pass
            return agent.wait()

    return TflaunchAgent


def check_address(address: str) -> str:
    """``auto`` (RAY_ADDRESS, else the cluster on this machine), ``HOST:PORT`` or ``ray://HOST:PORT``;
    OptionsError naming the value otherwise."""
    if address == "auto":
        return address
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise OptionsError(f"--ray: expected auto, HOST:PORT or ray://HOST:PORT (PORT 1-65535), got {address!r}")
    return address


def _reachable(address: str, within: float = 5.0) -> None:
    """OptionsError when nothing listens at ``address`` (before Ray's own client retries for a minute)."""
    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=within).close()
    except OSError as exc:
        raise OptionsError(f"--ray {address}: no Ray cluster answers there: {exc.strerror or exc}") from None


@contextlib.contextmanager
def _held_stderr():
    """This process's stderr set aside while Ray connects: its core logs every retry of a refused
    connection (a missing or wrong token) there, and the one line of the error says what went wrong."""
    saved, said = os.dup(2), []
    try:
        with tempfile.TemporaryFile() as held:
            os.dup2(held.fileno(), 2)
            try:
                yield said
            finally:
                os.dup2(saved, 2)
                held.seek(0)
                said.append(held.read(1 << 20).decode(errors="replace"))
    finally:
        os.close(saved)


@contextlib.contextmanager
def _own_signals():
    """tflaunch's signal handlers kept through Ray's start: its core worker installs handlers of
    its own, under which a Ctrl-C while the group waits to be placed would go unheard."""
    import signal as signals

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    watched = (signals.SIGINT, signals.SIGTERM, signals.SIGHUP, signals.SIGQUIT)
    handlers = {signum: signals.getsignal(signum) for signum in watched}
    try:
        yield
    finally:
        for signum, handler in handlers.items():
            if handler is not None:
                signals.signal(signum, handler)


class RayGroup:
    """One run's share of a Ray cluster: the driver's connection, the placement group and one agent
    actor per bundle. :meth:`close` frees all of it, whatever was made."""

    def __init__(self, address: str, cpus: int, gpus: int, within: float,
                 stopped: Callable[[], bool] = lambda: False):
        self.address = address
        self.stopped = stopped  # whether a signal came: the waits below end early then
        self.cpus, self.gpus = cpus, gpus  # per bundle
        self.within = within
        self.tag = secrets.token_hex(4)  # names this run's group and actors in Ray
        self._ray = None
        self._group = None
        self._actors: list = []
        self._serving: list = []  # each actor's running call: kept, so that Ray keeps its result for us

    def open(self) -> None:
        """Connect to the cluster as a driver."""
        _reachable(self.address)
        try:
            import ray
        except ImportError:
            raise OptionsError(f"--ray: Ray is not installed with this tflaunch: {EXTRA}") from None
        said: list[str] = []
        try:
            with _held_stderr() as said, _own_signals():
                ray.init(address=self.address, namespace=NAMESPACE, log_to_driver=False,
                         logging_level=logging.ERROR, configure_logging=False)
        except Exception as exc:  # noqa: BLE001 - Ray's own kinds (ConnectionError, AuthenticationError, ...)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if any("InvalidAuthToken" in text for text in said):
                first += (" (it refused this machine's Ray token, or its lack of one: give the cluster's token "
                          "in RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH)")
            raise OptionsError(f"--ray {self.address}: cannot connect to the Ray cluster: {first}") from None
        self._ray = ray

    @property
    def bundle(self) -> dict[str, float]:
        return {"CPU": self.cpus, **({"GPU": self.gpus} if self.gpus else {})}

    def fitting_nodes(self) -> int:
        """The cluster's alive nodes whose resources can hold a bundle at all."""
        return sum(1 for node in self._ray.nodes() if node.get("Alive")
                   and all(node.get("Resources", {}).get(k, 0) >= v for k, v in self.bundle.items()))

    def reserve(self, count: int) -> list[Bundle]:
        """The placement group of ``count`` bundles, one per node, placed within the timeout; each
        bundle's node. RayStartError says what the cluster lacks."""
        from ray.util.placement_group import placement_group, placement_group_table

        self._group = placement_group([self.bundle] * count, strategy="STRICT_SPREAD", name=f"tflaunch-{self.tag}")
        deadline = time.monotonic() + self.within
        # In short waits: Ray's wait blocks in its core, where no signal handler of Python's runs.
        while not self._group.wait(timeout_seconds=max(0.0, min(POLL, deadline - time.monotonic()))):
            if self.stopped():
                raise Stopped()
            if time.monotonic() >= deadline:
                raise RayStartError(self.lacks(count))
        placed = placement_group_table(self._group)["bundles_to_node_id"]
        addresses = {node["NodeID"]: node["NodeManagerAddress"] for node in self._ray.nodes()}
        return [Bundle(rank, placed[rank], addresses.get(placed[rank], "?")) for rank in range(count)]

    def lacks(self, count: int) -> str:
        """What the cluster lacks for ``count`` bundles, in one line."""
        fitting = self.fitting_nodes()
        words = ", ".join(f"{v:g} {k}" for k, v in self.bundle.items())
        wanted = f"{count} nodes with {words} each (STRICT_SPREAD: one bundle per node)"
        if fitting < count:
            why = f"the cluster has {fitting} node{'s' if fitting != 1 else ''} with that much in all"
        else:
            why = f"{fitting} nodes could hold a bundle, but their {words} are taken by other work"
        return f"--ray {self.address}: the placement group could not be placed within {self.within:g} s: " \
               f"it needs {wanted}; {why}"

    def start_agents(self, bundles: list[Bundle], host: str, port: int, token: str, nnodes: int) -> list[Bundle]:
        """One actor per bundle, each running the agent that dials ``host:port``; the bundles with
        the GPUs Ray gave each."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        agent_class = self._ray.remote(_agent_actor())
        argv = remote_agent_argv("python")[1:]
        for bundle in bundles:
            strategy = PlacementGroupSchedulingStrategy(self._group, placement_group_bundle_index=bundle.rank)
            self._actors.append(agent_class.options(
                num_cpus=self.cpus, num_gpus=self.gpus, scheduling_strategy=strategy, max_restarts=0,
                name=f"tflaunch-{self.tag}-{bundle.rank}").remote())
        asked = [actor.where.remote() for actor in self._actors]
        deadline = time.monotonic() + self.within
        while self._ray.wait(asked, num_returns=len(asked), timeout=POLL)[1]:
            if self.stopped():
                raise Stopped()
            if time.monotonic() >= deadline:
                raise RayStartError(f"--ray {self.address}: the agents' actors did not start within {self.within:g} s")
        gpus = self._ray.get(asked)
        for bundle, actor in zip(bundles, self._actors):
            spec = encode_fields({"keepalive": DEFAULT_KEEPALIVE_TIMEOUT, "eof_grace": EOF_GRACE,
                                  "sample": sample_for(nnodes), "beat": beat_for(nnodes, DEFAULT_KEEPALIVE_TIMEOUT),
                                  "connect": f"{host} {port}", "connect_within": self.within,
                                  "join": str(bundle.rank)})
            self._serving.append(actor.serve.remote([*argv, spec], token, AUTH_VARIABLES))
        return [Bundle(b.rank, b.node_id, b.address, tuple(where[2])) for b, where in zip(bundles, gpus)]

    def driver_address(self) -> str:
        """This machine's address as the Ray cluster knows it: where the agents dial back."""
        return self._ray.util.get_node_ip_address()

    def close(self) -> None:
        """Every actor killed (its agent stops its tasks), the group removed, the driver disconnected."""
        ray = self._ray
        if ray is None:
            return
        from ray.util.placement_group import remove_placement_group

        for actor in self._actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # already gone with its node: nothing of it is left to free
                pass
        self._actors, self._serving = [], []
        if self._group is not None:
            try:
                remove_placement_group(self._group)
            except Exception:  # noqa: BLE001 - removed with its job already
                pass
            self._group = None
        ray.shutdown()
        self._ray = None


class RayTransport(JoinedTransport):
    """Starts tasks on the Ray nodes of the run's placement group, through the agent each actor runs."""

    kind = KIND

    def connect(self, launch: TaskLaunch):
        try:
            return super().connect(launch)
        except OSError:
            raise OSError(f"Ray node {launch.host} is not in the run (its actor or node is gone)") from None

