"""Free ports for each node's tasks, checked on that node (through ``srun``), never guessed.

Each node gets one ``srun`` step that runs tflaunch's host probe (:mod:`launcher.cluster.probe`,
standard library only) on a window of candidate ports; the first free ones are taken. All nodes
are probed at once. The window starts at a point derived from the job id, so that two jobs that
share a node start their search in different places. The probe also reports whether the working
directory exists there, which would otherwise only show as a failed start.
"""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..cluster import probe
from ..errors import PreflightError
from .commands import COMMAND_TIMEOUT, last_line

PROBE_SOURCE = Path(probe.__file__).read_text()
PROBE_MARK = "TFLAUNCH_PROBE "
PORT_LOW, PORT_SPAN = 20000, 30000  # candidates within 20000-49999, below Linux's ephemeral range
WINDOWS = 3  # windows tried per node before giving up


@dataclass(frozen=True)
class NodeAnswer:
    node: str
    hostname: str
    free: dict[int, bool]
    workdir_exists: bool


def window_start(job_id: str, window: int, size: int) -> int:
    """Where a node's candidate window starts for this job (deterministic, spread by job id)."""
    digits = "".join(ch for ch in job_id if ch.isdigit()) or "0"
    return PORT_LOW + (int(digits) * 97 + window * size) % (PORT_SPAN - size)


def srun_probe_argv(node: str, python: str, request: Mapping) -> list[str]:
    """A one-task step on ``node`` that runs the probe; ``--overlap`` lets it share the job's CPUs."""
    encoded = base64.b64encode(json.dumps(request).encode()).decode()
    return ["srun", "--nodes=1", "--ntasks=1", f"--nodelist={node}", "--overlap", "--job-name=tflaunch-probe",
            "--quiet", python, "-c", PROBE_SOURCE, encoded]


def probe_node(node: str, python: str, ports: list[int], workdir: str) -> NodeAnswer:
    argv = srun_probe_argv(node, python, {"ports": ports, "workdirs": [workdir], "gpus": []})
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise PreflightError("--slurm: 'srun' is not installed here") from None
    except subprocess.TimeoutExpired:
        raise PreflightError(f"--slurm: checking ports on node {node}: no answer from srun within "
                             f"{COMMAND_TIMEOUT:g} s") from None
    for line in done.stdout.splitlines():
        if line.startswith(PROBE_MARK):
            answer = json.loads(line[len(PROBE_MARK):])
            return NodeAnswer(node, answer["hostname"], {int(p): free for p, free in answer["ports"].items()},
                              bool(answer["workdirs"].get(workdir)))
    detail = last_line(done.stderr) or f"srun exited with {done.returncode}"
    raise PreflightError(f"--slurm: checking ports on node {node} with {python}: {detail}")


def free_ports(job_id: str, needed: Mapping[str, int], python: str, workdir: str) -> dict[str, list[int]]:
    """``needed[node]`` free ports on each node, checked there; raises PreflightError naming the node."""
    def search(node: str) -> list[int]:
        count = needed[node]
        size = max(8, 4 * count)
        found: list[int] = []
        for window in range(WINDOWS):
            start = window_start(job_id, window, size)
            answer = probe_node(node, python, list(range(start, start + size)), workdir)
            if not answer.workdir_exists:
                raise PreflightError(f"--slurm: working directory {workdir} does not exist on node {node}; "
                                     "expected a filesystem shared by every node")
            found += [p for p, free in sorted(answer.free.items()) if free and p not in found]
            if len(found) >= count:
                return found[:count]
        raise PreflightError(f"--slurm: node {node}: only {len(found)} of {count} ports free in "
                             f"{WINDOWS} windows of {size}")

    nodes = list(needed)
    with ThreadPoolExecutor(max_workers=min(32, len(nodes))) as pool:
        return dict(zip(nodes, pool.map(search, nodes)))
