"""Preflight checks of every host of a planned cluster, run in parallel (``tflaunch check``).

Per host: reachable (over ssh for remote hosts), the task's Python runs, TensorFlow is
installed (and the same version everywhere, else a warning), each task's port is free, each
working directory exists, and requested GPU indices exist where ``nvidia-smi`` is present.
Then, for clusters that span hosts, the mesh: every host reaches every task's TF_CONFIG address
(see :mod:`launcher.run.mesh`).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ..cluster.exposure import exposure_text, unique_names
from ..cluster.plan import TaskLaunch
from ..transports.ssh import DEFAULT_CONNECT_TIMEOUT
from . import mesh

PROBE_SOURCE = (Path(__file__).parent.parent / "cluster" / "probe.py").read_text()
PROBE_MARK = "TFLAUNCH_PROBE "
PROBE_SLACK = 30.0  # seconds a probe may take once connected (nvidia-smi can be slow)


@dataclass(frozen=True)
class CheckItem:
    host: str
    check: str
    ok: bool
    detail: str
    warning: bool = False  # shown, but does not fail the check

    @property
    def line(self) -> str:
        """The item as one line of text; mesh lines already name their hosts."""
        return self.detail if self.check == "mesh" else f"{self.host} {self.check}: {self.detail}"


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


def check_hosts(launches: Sequence[TaskLaunch], with_mesh: bool = True) -> CheckReport:
    """Probe every host of ``launches`` in parallel and judge the answers.

    ``with_mesh``: also probe the mesh when the cluster spans hosts (not with ``auto`` ports,
    which are only known to this machine's port lock).
    """
    by_host: dict[str, list[TaskLaunch]] = {}
    for launch in launches:
        by_host.setdefault("localhost" if launch.local else launch.host, []).append(launch)
    with ThreadPoolExecutor(max_workers=min(32, len(by_host))) as pool:
        answers = list(pool.map(lambda item: _probe_host(*item), by_host.items()))
    report = CheckReport()
    for (host, tasks), (answer, connect_error, elapsed) in zip(by_host.items(), answers):
        report.items += _judge(host, tasks, answer, connect_error, elapsed)
    versions = {i.detail.split()[0] for i in report.items if i.check == "tensorflow" and i.ok}
    if len(versions) > 1:
        report.items.append(CheckItem("*", "tensorflow", False, f"versions differ across hosts: {', '.join(sorted(versions))}",
                                      warning=True))
    if with_mesh and mesh.applies(launches):
        report.items += _check_mesh(launches, report)
    exposed = exposure_text(unique_names(n for l in launches for n in (l.host, l.address.rsplit(":", 1)[0])))
    if exposed:
        report.items.append(CheckItem("*", "exposure", False, exposed, warning=True))
    return report


def _check_mesh(launches: Sequence[TaskLaunch], hosts: CheckReport) -> list[CheckItem]:
    """The mesh between the hosts that passed: a host or port that failed above is not probed again."""
    broken = frozenset(i.host for i in hosts.failures if i.check in ("ssh", "python"))
    busy = frozenset(t.name for t in launches for i in hosts.failures
                     if i.check == f"port {t.address.rsplit(':', 1)[1]}" and i.host == mesh.host_label(t))
    result = mesh.probe_mesh(launches, skip_hosts=broken, skip_tasks=busy)
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


def _probe_host(host: str, tasks: list[TaskLaunch]) -> tuple[dict | None, str | None, float]:
    first = tasks[0]
    request = {"ports": sorted({int(t.address.rsplit(":", 1)[1]) for t in tasks}),
               "workdirs": sorted({t.workdir for t in tasks}), "gpus": []}
    timeout = ((first.ssh.connect_timeout if first.ssh else None) or DEFAULT_CONNECT_TIMEOUT) + PROBE_SLACK
    argv = mesh.script_argv(first, PROBE_SOURCE, request)
    started = time.monotonic()
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, check=False)
    except FileNotFoundError as exc:
        return None, f"cannot run {exc.filename}", 0.0
    except subprocess.TimeoutExpired:
        return None, f"no answer within {timeout:g} s", timeout
    elapsed = time.monotonic() - started
    for line in done.stdout.decode("utf-8", "replace").splitlines():
        if line.startswith(PROBE_MARK):
            return json.loads(line[len(PROBE_MARK):]), None, elapsed
    message = done.stderr.decode("utf-8", "replace").strip().splitlines()
    detail = message[-1] if message else f"exit code {done.returncode}"
    if not first.local and done.returncode == 255:
        return None, detail, elapsed
    return {"python_error": f"{first.python} did not run the probe: {detail}"}, None, elapsed


def _judge(host: str, tasks: list[TaskLaunch], answer: dict | None, connect_error: str | None,
           elapsed: float) -> list[CheckItem]:
    first = tasks[0]
    items = []
    if not first.local:
        if connect_error:
            return [CheckItem(host, "ssh", False, f"cannot reach {host}: {connect_error}")]
        items.append(CheckItem(host, "ssh", True, f"reachable ({elapsed:.2f} s)"))
    elif connect_error:
        return [CheckItem(host, "python", False, connect_error)]
    assert answer is not None
    if "python_error" in answer:
        return items + [CheckItem(host, "python", False, answer["python_error"])]
    items.append(CheckItem(host, "python", True, f"{answer['python']} ({answer['executable']}) on {answer['hostname']}"))
    if answer["tensorflow"]:
        items.append(CheckItem(host, "tensorflow", True, f"{answer['tensorflow']} installed"))
    else:
        items.append(CheckItem(host, "tensorflow", False, answer["tensorflow_error"]))
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
