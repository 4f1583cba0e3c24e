"""A run on a Ray cluster (``--ray ADDRESS --nnodes 3``) beside the same run on this machine
(``--local 3``): from tflaunch's start to every task started.

    python benchmarks/bench_ray.py [--reps 3]

Brings up a Ray cluster of a head and three 1-CPU nodes on this machine (tests/helpers/ray_cluster.py,
the tests' own) and takes it down at the end. Each run's tasks print ``up`` and sleep; a run is
timed from tflaunch's start until every task's ``up`` is in merged.log, then stopped with SIGINT.
The two sides interleave (``--reps`` runs each), and beside them one task's start
(``tflaunch --local 1``). Target: the Ray run's median at most the ``--local 3`` run's plus one
task start plus 3 s (the Ray driver's connection, the placement group, three actors and their agents).
"""

from __future__ import annotations

import argparse
import select
import signal
import subprocess
import time
from pathlib import Path

import _bench
from _bench import PYTHON, ROOT, TFLAUNCH, median, note, spread, table

HELPER = ROOT / "tests" / "helpers" / "ray_cluster.py"
UP = "echo up; exec sleep 600"
SLACK_TARGET = 3.0  # seconds beyond --local 3 and one task start


def all_up(logs: Path, count: int) -> bool:
    run_dir = _bench.last_run_dir(logs)
    merged = run_dir / "merged.log" if run_dir else None
    return bool(merged and merged.exists()) and merged.read_text(errors="replace").count("| up") >= count


def timed(argv: list[str], logs: Path, count: int, work: Path) -> float | None:
    """Seconds from tflaunch's start to ``count`` tasks up; None when they did not all start."""
    started = time.monotonic()
    proc = _bench.popen([TFLAUNCH, *argv, "--quiet", "--no-check", "--log-dir", str(logs), "--", "sh", "-c", UP],
                        cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if not _bench.wait_for(lambda: all_up(logs, count), timeout=180, interval=0.02):
            return None
        return time.monotonic() - started
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=90)


def ray_cluster() -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([PYTHON, str(HELPER), "3"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    ready, _, _ = select.select([proc.stdout], [], [], 180)
    line = proc.stdout.readline().strip() if ready else ""
    if not line.startswith("address "):
        proc.stdin.close()
        proc.wait(timeout=60)
        raise SystemExit(f"the Ray cluster did not come up: {line!r}")
    return proc, line.split()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    _bench.header("bench_ray: --ray ADDRESS --nnodes 3 beside --local 3, tflaunch's start to every task started")
    cluster, address = ray_cluster()
    try:
        with _bench.workdir("bench-ray-") as work:
            sides = {"ray": ["--ray", address, "--nnodes", "3"], "local": ["--local", "3"],
                     "one": ["--local", "1"]}
            found: dict[str, list[float]] = {side: [] for side in sides}
            runs = 0
            for rep, side in _bench.interleaved(args.reps, list(sides)):
                runs += 1
                value = timed(sides[side], work / f"logs-{runs}", 1 if side == "one" else 3, work)
                if value is None:
                    note(f"rep {rep + 1} {side}: the tasks did not all start")
                    continue
                found[side].append(value)
            labels = {"ray": "--ray ADDRESS --nnodes 3", "local": "--local 3", "one": "--local 1 (one task start)"}
            print()
            table(["side", "runs", "median s", "min s", "max s"],
                  [[labels[side], len(values), *spread(values)] for side, values in found.items()])
            ray, local, one = (median(found[side]) if found[side] else float("nan") for side in ("ray", "local", "one"))
            print()
            note(f"--ray over --local 3: {ray - local:+.3f} s, ratio {ray / local:.2f}")
            _bench.verdict("--ray minus --local 3, minus one task start", ray - local - one, SLACK_TARGET, " s")
    finally:
        cluster.stdin.close()
        cluster.wait(timeout=120)


if __name__ == "__main__":
    _bench.main_guard(main)
