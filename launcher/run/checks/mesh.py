"""The all-pairs mesh probe: can every host reach every task at its TF_CONFIG address?

MultiWorkerMirroredStrategy waits forever at "Started server with target: grpc://..." when one
host cannot reach another task's port (a firewall, a route, a name that resolves differently on
each machine). This module proves the mesh before a run, and names the broken pair when a run
stalls at start.

Every host of the cluster runs :mod:`launcher.cluster.mesh_probe` through its host agent (on the
run's one connection to that host, or this machine's agent), all in parallel:

1. each host listens on its own tasks' ports (``listen=True``; a live cluster's tasks already hold
   them, so the live check only connects) and says so; each connection to a listener must be
   answered with the proof of the run's probe for the address and port dialled (a token made for
   this probe, passed to each host in the probe's environment), so neither another program on a
   port nor a relay to a probe elsewhere can make its pair pass;
2. once every host listens (or has failed), each gets ``go``: it resolves every other task's name
   itself, on that host, and connects to it, with the ssh connect timeout as the connect timeout;
3. when every host has answered, stdin is closed and the probes exit, so nothing stays behind.

A failure is one line naming the pair and the cause: ``node1 -> node2:2222 (worker-1): no route
to host``, or ``cannot resolve 'node2' on node1 (the address of worker-1 in TF_CONFIG)``.
"""

from __future__ import annotations

import contextlib
import json
import queue
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ...cluster import mesh_probe
from ...cluster.plan import TaskLaunch
from ...cluster.spec import DEFAULT_CONNECT_TIMEOUT
from ...options import RunOptions
from ...transports import TransportSet

# The mesh probe runs on each host as ``python -c SOURCE``: its source is shipped, read from the
# module the import found, so it goes wherever the package is installed.
MESH_SOURCE = Path(mesh_probe.__file__).read_text()
LISTENING_MARK, RESULT_MARK = mesh_probe.LISTENING_MARK, mesh_probe.RESULT_MARK
START_SLACK = 15.0  # seconds for a host's Python to start and listen once ssh is connected
ANSWER_SLACK = 5.0  # seconds for a host's results to arrive beyond its connect timeout
THIS_MACHINE = "localhost"  # the label of tflaunch's own machine, as in the host checks


@dataclass(frozen=True)
class Pair:
    """One connection to try: from a host to a task's address exactly as TF_CONFIG writes it."""

    source: str  # host label the connection starts from
    target: str  # task name, e.g. "worker-1"
    address: str  # "node2:2222" or "[::1]:2222"

    @property
    def name(self) -> str:
        host = self.address.rsplit(":", 1)[0]
        return host[1:-1] if host.startswith("[") and host.endswith("]") else host

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])


@dataclass(frozen=True)
class PairResult:
    pair: Pair
    ok: bool
    error: str | None = None  # "no route to host", "timed out after 3 s", "cannot resolve", ...
    resolved: str | None = None  # the address the name resolved to on the source host

    @property
    def unresolved(self) -> bool:
        return self.error == "cannot resolve"

    def message(self) -> str:
        pair = self.pair
        text = f"{pair.source} -> {pair.address} ({pair.target}): {self.error}"
        if self.resolved and self.resolved != pair.name:
            text += f" ({pair.name} is {self.resolved} on {pair.source})"
        return text


@dataclass
class MeshReport:
    pairs: list[PairResult] = field(default_factory=list)
    host_errors: dict[str, str] = field(default_factory=dict)  # host label -> why it gave no answer
    listen_errors: dict[str, list[str]] = field(default_factory=dict)  # host label -> lines
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems()

    def problems(self) -> list[str]:
        """One line per problem, in host order: unreachable hosts, listeners, names, then pairs."""
        return [line for lines in self.problems_by_host().values() for line in lines]

    def problems_by_host(self) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for host, error in self.host_errors.items():
            found.setdefault(host, []).append(error)
        for host, lines in self.listen_errors.items():
            found.setdefault(host, []).extend(lines)
        unresolved: dict[tuple[str, str], list[str]] = {}
        for result in self.pairs:
            if result.unresolved:
                unresolved.setdefault((result.pair.source, result.pair.name), []).append(result.pair.target)
        for (host, name), targets in unresolved.items():
            found.setdefault(host, []).append(
                f"cannot resolve {name!r} on {host} (the address of {', '.join(targets)} in TF_CONFIG)")
        for result in self.pairs:
            if not result.ok and not result.unresolved:
                found.setdefault(result.pair.source, []).append(result.message())
        return found

    def reached(self, host: str) -> int:
        return sum(1 for r in self.pairs if r.pair.source == host and r.ok)


def host_label(launch: TaskLaunch) -> str:
    return THIS_MACHINE if launch.local else launch.host


def applies(launches: Sequence[TaskLaunch]) -> bool:
    """Whether a cluster gets a mesh probe: only when some task runs on another host."""
    return any(not launch.local for launch in launches)


def plan_pairs(launches: Sequence[TaskLaunch]) -> list[Pair]:
    """Every (host, task) connection the cluster's tasks make.

    Each host dials every task, its own included (a second task there dials it by the same name),
    except that a task alone on its host never dials itself.
    """
    by_host: dict[str, list[str]] = {}
    for launch in launches:
        by_host.setdefault(host_label(launch), []).append(launch.name)
    return [Pair(host, target.name, target.address)
            for host, own in by_host.items() for target in launches if own != [target.name]]


@contextlib.contextmanager
def agents(transports: TransportSet | None) -> Iterator[TransportSet]:
    """The run's transports, or a set of its own for a probe outside a run (closed afterwards), with
    the default run options: a probe starts no task, so no option of a run applies to it."""
    if transports is not None:
        yield transports
        return
    own = TransportSet(RunOptions())
    try:
        yield own
    finally:
        own.close()


def probe_mesh(launches: Sequence[TaskLaunch], listen: bool = True, skip_hosts: frozenset[str] = frozenset(),
               skip_tasks: frozenset[str] = frozenset(), transports: TransportSet | None = None) -> MeshReport:
    """Run the probe on every host of ``launches`` and collect every pair's result.

    ``listen``: open short-lived listeners on each host's task ports first (before a run); a live
    cluster's tasks hold those ports, so then only connections are tried. ``skip_hosts`` (labels)
    and ``skip_tasks`` (names) leave out hosts and targets whose failures are already reported.
    """
    started = time.monotonic()
    report = MeshReport()
    targets_ok = [l for l in launches if host_label(l) not in skip_hosts and l.name not in skip_tasks]
    pairs = [p for p in plan_pairs(launches) if p.source not in skip_hosts and p.target in {l.name for l in targets_ok}]
    timeout = connect_timeout(launches)
    probes: dict[str, _HostProbe] = {}
    for launch in launches:
        label = host_label(launch)
        if label in skip_hosts or label in probes:
            continue
        ports = sorted({int(l.address.rsplit(":", 1)[1]) for l in targets_ok if host_label(l) == label}) if listen else []
        probes[label] = _HostProbe(label, launch, ports, [p for p in pairs if p.source == label], timeout, listen)
    events: queue.Queue = queue.Queue()
    token = secrets.token_hex(16)
    by_target = {l.name: l for l in launches}

    def listened(pair: Pair) -> bool:
        return not listen or probes[host_label(by_target[pair.target])].listened_on(pair.port)

    with agents(transports) as through:
        _run_probes(probes, events, timeout, through, token, listened)

    for label, probe in probes.items():
        if probe.listening is None or probe.results is None:
            report.host_errors[label] = probe.failure()
            continue
        busy = {int(port): error for port, error in probe.listening.items() if error}
        for port, error in sorted(busy.items()):
            names = [l.name for l in targets_ok if host_label(l) == label and l.address.endswith(f":{port}")]
            report.listen_errors.setdefault(label, []).append(
                f"cannot listen on {label}:{port} ({', '.join(names)}) for the mesh probe: {error}")
        answers = {answer.get("id"): answer for answer in probe.results if isinstance(answer, dict)}
        for number, pair in enumerate(probe.pairs):
            if not listened(pair):
                continue  # nothing of ours listened there, so it was not dialled; that host's own line says why
            answer = answers.get(number, {"ok": False, "error": "no answer from the probe"})
            report.pairs.append(PairResult(pair, bool(answer.get("ok")), answer.get("error"), answer.get("resolved")))
    report.seconds = time.monotonic() - started
    return report


def _run_probes(probes: dict[str, "_HostProbe"], events: queue.Queue, timeout: float,
                transports: TransportSet, token: str, listened: Callable[[Pair], bool]) -> None:
    """Every probe listens, then dials every pair ``listened`` holds for: a port no probe listens on
    would only keep its prober waiting its whole connect timeout."""
    try:
        for probe in probes.values():
            probe.start(events, transports, token)
        _wait(probes, events, lambda p: p.listening is not None, timeout + START_SLACK)
        for probe in probes.values():
            if probe.listening is not None:
                probe.go([number for number, pair in enumerate(probe.pairs) if not listened(pair)])
        _wait(probes, events, lambda p: p.listening is None or p.results is not None, timeout + ANSWER_SLACK)
    finally:
        for probe in probes.values():
            probe.close()


def stall_problems(launches: Sequence[TaskLaunch], transports: TransportSet | None = None) -> list[str]:
    """The broken pairs of a live cluster whose tasks hold their ports (connections only)."""
    if not applies(launches):
        return []
    return probe_mesh(launches, listen=False, transports=transports).problems()


def connect_timeout(launches: Sequence[TaskLaunch]) -> float:
    """The cluster's ssh connect timeout, used for each probe connection too."""
    values = [l.ssh.connect_timeout for l in launches if l.ssh and l.ssh.connect_timeout]
    return max(values) if values else DEFAULT_CONNECT_TIMEOUT


def _wait(probes: dict[str, _HostProbe], events: queue.Queue, done, seconds: float) -> None:
    """Handle probe output until ``done`` holds for every probe that is still running, or time is up."""
    deadline = time.monotonic() + seconds
    while not all(done(p) or p.ended for p in probes.values()):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        try:
            label, line = events.get(timeout=remaining)
        except queue.Empty:
            return
        probes[label].handle(line)


class _HostProbe:
    """One host's probe, a helper of its host agent: its stdin carries ``go`` and then EOF, its
    output the answers."""

    def __init__(self, label: str, launch: TaskLaunch, ports: list[int], pairs: list[Pair], timeout: float,
                 prove: bool):
        self.label = label
        self.launch = launch
        self.pairs = pairs
        self.request = {"listen": ports, "timeout": timeout, "prove": prove,
                        "targets": [{"id": i, "host": p.name, "port": p.port} for i, p in enumerate(pairs)],
                        # The probe ends itself after this even if its stdin never closes.
                        "lifetime": 2 * timeout + START_SLACK + ANSWER_SLACK}
        self.listening: dict[str, str | None] | None = None
        self.results: list[dict] | None = None
        self.ended = False
        self.other: list[str] = []  # what it printed besides its answers (Python's errors)
        self.helper = None
        self.start_error: str | None = None

    def start(self, events: queue.Queue, transports: TransportSet, token: str) -> None:
        try:
            self.helper = transports.helper(self.launch, MESH_SOURCE, self.request,
                                            lambda line: events.put((self.label, line)),
                                            env={mesh_probe.TOKEN_VARIABLE: token})
        except OSError as exc:
            self.start_error, self.ended = f"cannot run {exc.filename or exc.strerror or exc}", True

    def handle(self, line: str | None) -> None:
        if line is None:
            self.ended = True
        elif line.startswith(LISTENING_MARK):
            self.listening = json.loads(line[len(LISTENING_MARK):])
        elif line.startswith(RESULT_MARK):
            self.results = json.loads(line[len(RESULT_MARK):])
        elif line.strip():
            self.other.append(line.rstrip())

    def listened_on(self, port: int) -> bool:
        return self.listening is not None and str(port) in self.listening and not self.listening[str(port)]

    def go(self, undialled: list[int]) -> None:
        """Dial every target but those numbered in ``undialled``."""
        if self.helper is not None:
            self.helper.write(f"go {json.dumps(undialled)}\n".encode())

    def close(self) -> None:
        """EOF on its stdin (the probe exits on it); stop it if it lingers."""
        if self.helper is None:
            return
        self.helper.close_stdin()
        deadline = time.monotonic() + 5.0
        while self.helper.status is None and time.monotonic() < deadline:
            time.sleep(0.01)
        if self.helper.status is None:
            self.helper.stop()

    def failure(self) -> str:
        """Why this host gave no answer, in one line."""
        if self.start_error:
            return f"mesh probe on {self.label}: {self.start_error}"
        status = self.helper.status if self.helper is not None else None
        if status is not None and status.error:
            return f"mesh probe: {status.error}"
        last = self.other[-1] if self.other else None
        if status is not None and status.code == 127:  # the shell in front of it found no such program
            return f"mesh probe on {self.label}: cannot run {self.launch.python}"
        if self.ended:
            code = status.describe() if status is not None else "no exit status"
            return f"mesh probe on {self.label}: {self.launch.python} ended early ({last or code})"
        stage = "listening" if self.listening is None else "its results"
        return f"mesh probe on {self.label}: no answer ({stage}) in time"
