"""Preflight checks of every host of a planned cluster, run in parallel (``tflaunch check``).

Per host, through that host's agent (one ssh connection per remote host, which the run then
keeps using): reachable, the task's Python runs, TensorFlow is installed, each task's port is
free, each working directory exists, and requested GPU indices exist where ``nvidia-smi`` is
present. Across hosts: the versions of Python, TensorFlow, tf_keras and Keras the tasks would
import (see :mod:`launcher.run.checks.versions`). Then, for clusters that span hosts, the mesh: every
host reaches every task's TF_CONFIG address (see :mod:`launcher.run.checks.mesh`).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ...cluster.exposure import exposure_text, unique_names
from ...cluster import probe
from ...cluster.placement import SPARE_ROLE
from ...cluster.plan import TaskLaunch
from ...transports import TransportSet
from . import mesh
from .versions import PACKAGES, compare_versions, version_lines
from ...records.states import Role

# The probe runs on each host as ``python -c SOURCE``: its source is shipped, read from the
# module the import found, so it goes wherever the package is installed.
PROBE_SOURCE = Path(probe.__file__).read_text()
PROBE_MARK = probe.MARK
PROBE_SLACK = 30.0  # seconds a probe may take once connected (nvidia-smi can be slow)
# Checks whose detail names its hosts itself (their host column is "*" or one host of several).
NAMING_CHECKS = ("mesh", "versions")


@dataclass(frozen=True)
class CheckItem:
    host: str
    check: str
    ok: bool
    detail: str
    warning: bool = False  # shown, but does not fail the check

    @property
    def line(self) -> str:
        """The item as one line of text; mesh and versions lines already name their hosts."""
        return self.detail if self.check in NAMING_CHECKS else f"{self.host} {self.check}: {self.detail}"


@dataclass
class CheckReport:
    items: list[CheckItem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(item.ok or item.warning for item in self.items)

    @property
    def failures(self) -> list[CheckItem]:
        return [item for item in self.items if not item.ok and not item.warning]

    def table(self) -> list[str]:
        width = max([len(i.host) for i in self.items] + [4])
        check_width = max([len(i.check) for i in self.items] + [5])
        lines = [f"{'HOST'.ljust(width)}  {'CHECK'.ljust(check_width)}  RESULT"]
        for item in self.items:
            mark = "ok" if item.ok else ("WARN" if item.warning else "FAIL")
            lines.append(f"{item.host.ljust(width)}  {item.check.ljust(check_width)}  {mark}  {item.detail}")
        return lines


def check_hosts(launches: Sequence[TaskLaunch], with_mesh: bool = True,
                transports: TransportSet | None = None) -> CheckReport:
    """Probe every host of ``launches`` in parallel and judge the answers.

    ``with_mesh``: also probe the mesh when the cluster spans hosts (not with ``auto`` ports on this
    machine, which are picked and held only when the run starts). ``transports``: the run's, whose agents
    then carry the run too; without it the probes bring up agents of their own and stop them.
    """
    with mesh.agents(transports) as through:
        return _check(launches, with_mesh, through)


def _check(launches: Sequence[TaskLaunch], with_mesh: bool, transports: TransportSet) -> CheckReport:
    by_host: dict[str, list[TaskLaunch]] = {}
    for launch in launches:
        by_host.setdefault("localhost" if launch.local else launch.host, []).append(launch)
    transports.prepare([tasks[0] for tasks in by_host.values()])  # every connection opens at once
    probes = [_HostCheck(host, tasks, transports) for host, tasks in by_host.items()]
    answers = [probe.answer() for probe in probes]
    report = CheckReport()
    for (host, tasks), (answer, connect_error, elapsed) in zip(by_host.items(), answers):
        report.items += _judge(host, tasks, answer, connect_error, elapsed)
    versions = {host: probed_versions(answer) for host, (answer, _, _) in zip(by_host, answers)
                if answer is not None and "python" in answer}
    spares = spare_hosts(by_host)
    chief = next((host for host, tasks in by_host.items() if any(t.role == Role.CHIEF for t in tasks)), None)
    findings = compare_versions({h: v for h, v in versions.items() if h not in spares},
                                candidates={h: v for h, v in versions.items() if h in spares}, chief=chief)
    for text, fails in version_lines([f for f in findings if not f.candidate]):
        report.items.append(CheckItem("*", "versions", False, text, warning=not fails))
    for finding in (f for f in findings if f.candidate):  # one line each: each spare is refused on its own
        text, fails = version_lines([finding])[0]
        report.items.append(CheckItem(finding.host, "versions", False, text, warning=not fails))
    if with_mesh and mesh.applies(launches):
        report.items += _check_mesh(launches, report, transports)
    exposed = exposure_text(unique_names(n for l in launches for n in (l.host, l.address.rsplit(":", 1)[0])))
    if exposed:
        report.items.append(CheckItem("*", "exposure", False, exposed, warning=True))
    return report


def spare_hosts(by_host: Mapping[str, Sequence[TaskLaunch]]) -> set[str]:
    """The hosts that hold only spare slots (:func:`~launcher.cluster.placement.checked_spec`)."""
    return {host for host, tasks in by_host.items() if all(t.role == SPARE_ROLE for t in tasks)}


def refused_spares(report: CheckReport, launches: Sequence[TaskLaunch]) -> dict[str, str]:
    """{spare host: the first failed check's line}: spares that cannot stand in for a host. A spare
    that fails is not used; the run's own hosts must pass."""
    by_host: dict[str, list[TaskLaunch]] = {}
    for launch in launches:
        by_host.setdefault("localhost" if launch.local else launch.host, []).append(launch)
    spares = spare_hosts(by_host)
    refused: dict[str, str] = {}
    for item in report.failures:
        if item.host in spares:
            refused.setdefault(item.host, item.line)
    return refused


def _check_mesh(launches: Sequence[TaskLaunch], hosts: CheckReport, transports: TransportSet) -> list[CheckItem]:
    """The mesh between the hosts that passed: a host or port that failed above is not probed again."""
    broken = frozenset(i.host for i in hosts.failures if i.check in ("ssh", "python"))
    busy = frozenset(t.name for t in launches for i in hosts.failures
                     if i.check == f"port {t.address.rsplit(':', 1)[1]}" and i.host == mesh.host_label(t))
    result = mesh.probe_mesh(launches, skip_hosts=broken, skip_tasks=busy, transports=transports)
    items = []
    problems = result.problems_by_host()
    for label in dict.fromkeys(mesh.host_label(l) for l in launches):
        if label in broken:
            continue
        for line in problems.get(label, []):
            items.append(CheckItem(label, "mesh", False, line))
        if label not in problems:
            reached = result.reached(label)
            items.append(CheckItem(label, "mesh", True,
                                   f"reaches all {reached} task address{'es' if reached != 1 else ''} it dials "
                                   f"({result.seconds:.2f} s)" if reached else
                                   "nothing to dial once the failures above are left out"))
    return items


def probe_env(launch: TaskLaunch) -> dict[str, str]:
    """The variables of the task's environment that change what its Python imports (PYTHONPATH,
    PYTHONHOME, PYTHONNOUSERSITE...): with them the probe finds the packages the task would."""
    return {name: value for name, value in launch.env.items() if name.startswith("PYTHON")}


def probed_versions(answer: dict) -> dict[str, str | None]:
    """A probe's answer as :func:`~.versions.compare_versions` takes it: what could not be told
    (no importlib.metadata, or a module with no distribution found) is left out."""
    found = {"python": answer["python"], **answer["versions"]}
    return {package: found[package] for package in PACKAGES if package in found and found[package] != "unknown"}


class _HostCheck:
    """One host's probe, a helper of its agent, started at once; :meth:`answer` waits for it."""

    def __init__(self, host: str, tasks: list[TaskLaunch], transports: TransportSet, source: str = PROBE_SOURCE,
                 slack: float = PROBE_SLACK):
        self.host, self.tasks = host, tasks
        first = tasks[0]
        request = {"ports": sorted({int(t.address.rsplit(":", 1)[1]) for t in tasks}),
                   "workdirs": sorted({t.workdir for t in tasks}), "gpus": []}
        self.timeout = first.connect_timeout + slack
        self.lines: list[str] = []
        self.done = threading.Event()
        self.started = time.monotonic()
        self.start_error: str | None = None
        try:
            self.helper = transports.helper(first, source, request, self._line, env=probe_env(first))
        except OSError as exc:
            self.helper, self.start_error = None, f"cannot run {exc.filename or exc.strerror or exc}"
            self.done.set()

    def _line(self, line: str | None) -> None:
        if line is None:
            self.done.set()
        else:
            self.lines.append(line)

    def answer(self) -> tuple[dict | None, str | None, float]:
        """(the probe's answer, why the host could not be reached, seconds it took)."""
        if self.start_error:
            return None, self.start_error, 0.0
        first = self.tasks[0]
        if not self.done.wait(max(0.0, self.timeout - (time.monotonic() - self.started))):
            self.helper.stop()
            return None, f"no answer within {self.timeout:g} s", self.timeout
        elapsed = time.monotonic() - self.started
        for line in self.lines:
            if line.startswith(PROBE_MARK):
                return json.loads(line[len(PROBE_MARK):]), None, elapsed
        status = self.helper.status
        if status is not None and status.error:  # the host (or its agent) could not be reached
            return None, status.error, elapsed
        message = [line.strip() for line in self.lines if line.strip()]
        detail = message[-1] if message else (status.describe() if status else "no answer")
        return {"python_error": f"{first.python} did not run the probe: {detail}"}, None, elapsed


def _judge(host: str, tasks: list[TaskLaunch], answer: dict | None, connect_error: str | None,
           elapsed: float) -> list[CheckItem]:
    first = tasks[0]
    items = []
    if not first.local:
        if connect_error:
            reason = connect_error if connect_error.startswith("cannot reach") else f"cannot reach {host}: {connect_error}"
            return [CheckItem(host, "ssh", False, reason)]
        items.append(CheckItem(host, "ssh", True, f"reachable ({elapsed:.2f} s)"))
    elif connect_error:
        return [CheckItem(host, "python", False, connect_error)]
    assert answer is not None
    if "python_error" in answer:
        return items + [CheckItem(host, "python", False, answer["python_error"])]
    items.append(CheckItem(host, "python", True, f"{answer['python']} ({answer['executable']}) on {answer['hostname']}"))
    versions = answer["versions"]
    if answer["tensorflow_error"]:
        items.append(CheckItem(host, "tensorflow", False, answer["tensorflow_error"]))
    else:
        items.append(CheckItem(host, "tensorflow", True, f"{versions['tensorflow']} installed"))
    if versions:
        items.append(CheckItem(host, "keras", True, ", ".join(f"{name} {versions[name] or 'not installed'}"
                                                             for name in ("tf_keras", "keras"))))
    for task in tasks:
        port = task.address.rsplit(":", 1)[1]
        free = answer["ports"].get(port, True)
        items.append(CheckItem(host, f"port {port}", free,
                               f"free ({task.name})" if free else f"already in use on {host} (task {task.name})"))
    for workdir, exists in answer["workdirs"].items():
        items.append(CheckItem(host, "workdir", exists, workdir if exists else f"{workdir} does not exist on {host}"))
    for task in tasks:
        if not task.gpus:
            continue
        if answer["gpus"] is None:
            items.append(CheckItem(host, "gpus", False, f"{task.name}: not checked (no nvidia-smi on {host})", warning=True))
            continue
        missing = [g for g in task.gpus if g >= answer["gpus"]]
        items.append(CheckItem(host, "gpus", not missing,
                               f"{task.name}: GPU {','.join(map(str, task.gpus))} of {answer['gpus']}" if not missing
                               else f"{task.name}: GPU {','.join(map(str, missing))} missing ({host} has {answer['gpus']})"))
    return items


# Before a restart, a host has its connect timeout and this much more to run an empty script.
ANSWER_SLACK = 5.0


def unreachable_hosts(launches: Sequence[TaskLaunch], transports: TransportSet) -> dict[str, str]:
    """The hosts of ``launches`` that cannot run the next attempt, each with why: checked in
    parallel before a restart, so that no attempt is spent dialling a dead host.

    An ssh host or a Slurm node that does not run an empty script through the run's own agent
    within its connect timeout (and :data:`ANSWER_SLACK`) is lost; a host whose agent was lost is
    dialled again (a node gets a job step of its own). A node of this Slurm job (``SLURM_JOB_ID``)
    is lost without being dialled when Slurm says it is down, drained,
    failed or not responding, or no longer in the job (:mod:`launcher.slurm.nodes`); the lost
    nodes are then kept out of every later job step (srun's ``--exclude``). This machine's tasks
    are not checked."""
    first_by_host: dict[str, TaskLaunch] = {}
    for launch in launches:
        if not launch.local:  # a host reached through an agent of its own (ssh, srun, a joined node)
            first_by_host.setdefault(launch.host, launch)
    nodes = [host for host, launch in first_by_host.items() if launch.transport == "srun"]
    lost: dict[str, str] = {}
    if nodes:
        from ...slurm.nodes import unusable_nodes  # only a restart inside a Slurm job needs it

        lost = unusable_nodes(nodes, os.environ.get("SLURM_JOB_ID"))
        transports.leave_out(lost)
    dial = [launch for host, launch in first_by_host.items() if host not in lost]
    if not dial:
        return lost
    transports.prepare(dial)
    # The host check's own wait and its reading of a lost link, with an empty script for a probe.
    checks = [_HostCheck(launch.host, [launch], transports, source="pass", slack=ANSWER_SLACK) for launch in dial]
    for check in checks:
        error = check.answer()[1]
        if error is not None:
            lost[check.host] = error
    transports.leave_out([host for host in nodes if host in lost], back=[host for host in nodes if host not in lost])
    return lost
