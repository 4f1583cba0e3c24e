"""Module fixture ``raycluster``: a real Ray cluster on this machine, a head and three worker nodes
of 1 CPU each (tests/helpers/ray_cluster.py), shared by a module's tests and torn down after them
with no process of it left.

    def test_something(raycluster):
        raycluster.address          # the GCS address: tflaunch --ray ADDRESS
        raycluster.add(cpus=1, gpus=0)   # a new node; its id
        raycluster.remove(node_id)  # that node dies
        raycluster.nodes()          # [{"id": ..., "address": ...}] of the worker nodes alive
        raycluster.state()          # {"groups": {id: state}, "actors": [names alive]}
        raycluster.wait_free()      # no actor alive and every placement group removed, or the test fails

Without Ray installed (``pip install -e '.[test]'`` brings it) the fixture skips with the reason;
with ``CI`` set it fails instead.
"""

from __future__ import annotations

import importlib.util
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

HELPER = Path(__file__).resolve().parent / "helpers" / "ray_cluster.py"
UP_WITHIN = 120.0  # seconds for the head and three nodes on a loaded 2-core machine
NODES = 3


class RayCluster:
    def __init__(self, nodes: int = NODES, env: dict | None = None):
        self.proc = subprocess.Popen([sys.executable, str(HELPER), str(nodes)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, start_new_session=True,
                                     env={**os.environ, **(env or {})})
        line = self._read(UP_WITHIN)
        if not line.startswith("address "):
            self.close()
            pytest.fail(f"the test Ray cluster did not come up: {line!r}")
        self.address = line.split()[1]

    def _read(self, within: float) -> str:
        ready, _, _ = select.select([self.proc.stdout], [], [], within)
        return self.proc.stdout.readline().strip() if ready else ""

    def ask(self, command: str, within: float = 60.0):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        line = self._read(within)
        if not line:
            pytest.fail(f"the test Ray cluster did not answer {command!r}")
        return json.loads(line)

    def add(self, cpus: int = 1, gpus: int = 0) -> str:
        return self.ask(f"add {cpus} {gpus}")

    def remove(self, node_id: str) -> None:
        self.ask(f"remove {node_id}")

    def nodes(self) -> list[dict]:
        return self.ask("nodes")

    def state(self) -> dict:
        return self.ask("state")

    def wait_free(self, within: float = 30.0) -> dict:
        """Ray's own state once nothing of a run is left: no actor alive, no placement group but removed."""
        deadline = time.monotonic() + within
        while True:
            state = self.state()
            if not state["actors"] and all(s == "REMOVED" for s in state["groups"].values()):
                return state
            if time.monotonic() > deadline:
                pytest.fail(f"the run left Ray resources behind: {state}")
            time.sleep(0.5)

    def close(self) -> None:
        """Every process of the cluster ends; any that does not is killed and named."""
        try:
            family = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            family = []
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        _, alive = psutil.wait_procs(family, timeout=15)
        for proc in alive:
            proc.kill()
        if alive:
            pytest.fail(f"the test Ray cluster left processes: {[p.pid for p in alive]}")


@pytest.fixture(scope="module")
def raycluster():
    if importlib.util.find_spec("ray") is None:
        # CI must run them: there a missing Ray fails rather than skips.
        (pytest.fail if os.environ.get("CI") else pytest.skip)(
            "the Ray tests need Ray: pip install -e '.[test]' (or 'tflaunch[ray]')")
    cluster = RayCluster()
    try:
        yield cluster
    finally:
        cluster.close()
