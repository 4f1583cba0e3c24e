"""Slurm: time from ``tflaunch submit`` to the first training step, and 8 tasks on 2 nodes through srun.

    python benchmarks/bench_slurm.py [--reps N]

Brings up a test cluster with ``scripts/testslurm up --prefix bsl --subnet 10.126.250`` (slurmctld
here, two slurmd nodes in network namespaces) and takes it down at the end, whatever happens.
Needs root, munge and slurm-wlm.

Part 1, submit to first step: ``tflaunch submit --nodes 2 -- python -m trainer --epochs 1
--steps-per-epoch 1`` (one step per epoch, so the first epoch record is the first step). Measured
from the moment submit starts to (a) the job's start (``slurm.json``), (b) the first epoch record in
``metrics.jsonl``; for reference, ``tflaunch --local 2`` with the same command on this machine.

Part 2, start of 8 tasks: inside one allocation (``salloc -N2 --ntasks-per-node=4``), side A is
``tflaunch --slurm --quiet -- true`` (one srun step with an agent per node, ports picked by the
agents, supervise to the end); side B is one bare ``srun -N1 -n1 hostname``; for information,
``tflaunch --local 8 --quiet -- true`` on this machine. Sides alternate (order flipped every
repetition). Target: median(A) / median(B) <= 20.

Part 3, 256 tasks on 8 nodes (a second test cluster of 8 nodes declaring 32 CPUs each, ``salloc -N8
--ntasks-per-node=32``): side A ``tflaunch --slurm --quiet -- true``, side B one bare ``srun -n 256
--overlap true``, alternating; while side A runs, ``squeue -s`` is polled and the job steps it
started are counted. Targets: median(A) / median(B) <= 3, and one job step for the tasks.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import _bench
from _bench import PYTHON, ROOT, median, note, spread, table

TARGET = 20.0
TARGET_256 = 3.0
PREFIX, SUBNET = "bsl", "10.126.250"


def inner(reps: int) -> None:
    """Run inside the allocation (salloc): time both sides and print them as one JSON line."""
    sides = {"tflaunch --slurm (8 tasks)": [PYTHON, "-m", "launcher", "--slurm", "--quiet", "--log-dir",
                                            os.environ["BENCH_LOGS"], "--", "true"],
             "srun hostname (1 task)": ["srun", "-N1", "-n1", "--overlap", "hostname"],
             "(tflaunch --local 8, this machine)": [PYTHON, "-m", "launcher", "--local", "8", "--quiet",
                                                    "--log-dir", os.environ["BENCH_LOGS"], "--", "true"]}
    times: dict[str, list[float]] = {name: [] for name in sides}
    for rep in range(reps):
        order = list(sides) if rep % 2 == 0 else list(reversed(list(sides)))
        for name in order:
            start = time.perf_counter()
            done = subprocess.run(sides[name], capture_output=True, text=True, timeout=120, cwd=ROOT)
            elapsed = time.perf_counter() - start
            if done.returncode == 0:
                times[name].append(elapsed)
            else:
                print(f"   {name} failed: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
    print("TIMES " + json.dumps(times), flush=True)


def inner_many(reps: int) -> None:
    """Inside an allocation of 8 nodes x 32 slots: tflaunch --slurm against one srun -n 256, and the
    job steps tflaunch's runs started (polled with squeue while they run)."""
    import threading

    job = os.environ["SLURM_JOB_ID"]
    sides = {"tflaunch --slurm (256 tasks)": [PYTHON, "-m", "launcher", "--slurm", "--quiet", "--log-dir",
                                             os.environ["BENCH_LOGS"], "--", "true"],
             "srun -n 256 true": ["srun", "-n", "256", "--overlap", "true"]}
    times: dict[str, list[float]] = {name: [] for name in sides}
    steps: set[str] = set()
    for rep in range(reps):
        order = list(sides) if rep % 2 == 0 else list(reversed(list(sides)))
        for name in order:
            done_event = threading.Event()

            def poll() -> None:
                while not done_event.is_set():
                    out = subprocess.run(["squeue", "-s", "-h", "-j", job, "-o", "%i %j"], capture_output=True,
                                         text=True).stdout
                    steps.update(line.split()[0] for line in out.splitlines()
                                 if line.strip() and not line.split()[0].endswith(".batch")
                                 and "tflaunch" in line)
                    done_event.wait(0.05)

            watcher = threading.Thread(target=poll, daemon=True)
            if name.startswith("tflaunch"):
                watcher.start()
            start = time.perf_counter()
            done = subprocess.run(sides[name], capture_output=True, text=True, timeout=300, cwd=ROOT)
            elapsed = time.perf_counter() - start
            done_event.set()
            if done.returncode == 0:
                times[name].append(elapsed)
            else:
                print(f"   {name} failed: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
    print("TIMES " + json.dumps(times), flush=True)
    print("STEPS " + json.dumps({"runs": reps, "steps": sorted(steps)}), flush=True)


def many_nodes(reps: int, state: Path) -> None:
    with _bench.test_slurm("bsm", "10.126.249", state / "cluster8", "--nodes", "8", "--cpus", "32",
                           timeout=180) as env:
        if env is None:
            return
        run = subprocess.run(["salloc", "-N8", "--ntasks-per-node=32", "--", PYTHON, __file__, "--inner-many",
                              "--reps", str(reps)], capture_output=True, text=True, timeout=1800,
                             env={**env, "BENCH_LOGS": str(state / "many-logs")}, cwd=ROOT)
        times_line = next((l for l in run.stdout.splitlines() if l.startswith("TIMES ")), None)
        steps_line = next((l for l in run.stdout.splitlines() if l.startswith("STEPS ")), None)
        if times_line is None or steps_line is None:
            note(f"8-node allocation run failed: {run.stderr.strip()[-500:]}")
            return
        times = json.loads(times_line[len("TIMES "):])
        steps = json.loads(steps_line[len("STEPS "):])
        print()
        table(["side (8 nodes x 32 tasks)", "median s", "min s", "max s"],
              [[name, *spread(values)] for name, values in times.items()])
        note(f"job steps tflaunch started over {steps['runs']} runs: {len(steps['steps'])} "
             f"({', '.join(steps['steps'])}); one per run is the target")
        a, b = (median(v) for v in times.values())
        _bench.verdict("256 tasks via tflaunch --slurm / one srun -n 256 true", a / b, TARGET_256)

def first_step(env: dict, logs: Path) -> tuple[float, float] | None:
    """(job start, first step) in seconds after submit started, or None when the run failed."""
    start = time.time()
    done = subprocess.run([PYTHON, "-m", "launcher", "submit", "--nodes", "2", "--log-dir", str(logs), "--",
                           "python", "-m", "trainer", "--epochs", "1", "--steps-per-epoch", "1"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    if done.returncode != 0:
        note(f"submit failed: {done.stderr.strip()}")
        return None
    run_dir = Path(done.stdout.strip().rsplit("run folder ", 1)[1])
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        metrics = run_dir / "metrics.jsonl"
        epochs = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
        epochs = [r for r in epochs if r.get("kind") == "epoch"]
        if epochs:
            slurm = json.loads((run_dir / "slurm.json").read_text())
            began = datetime.fromisoformat(slurm["started_at"]).timestamp()
            return began - start, min(r["time"] for r in epochs) - start
        time.sleep(0.1)
    note(f"no first step within 300 s in {run_dir}")
    return None


def local_first_step(logs: Path) -> float | None:
    start = time.time()
    done = subprocess.run([PYTHON, "-m", "launcher", "--local", "2", "--quiet", "--log-dir", str(logs), "--",
                           "python", "-m", "trainer", "--epochs", "1", "--steps-per-epoch", "1"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    runs = sorted(logs.iterdir())
    if done.returncode != 0 or not runs:
        return None
    records = [json.loads(line) for line in (runs[-1] / "metrics.jsonl").read_text().splitlines()]
    return min(r["time"] for r in records if r.get("kind") == "epoch") - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--inner-many", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--only-many", action="store_true", help="run part 3 alone")
    args = parser.parse_args()
    if args.inner:
        inner(args.reps)
        return
    if args.inner_many:
        inner_many(args.reps)
        return
    if args.only_many:
        with _bench.workdir("slurm") as state:
            many_nodes(args.reps, state)
        return
    _bench.header("Slurm: submit to first training step; 8 tasks on 2 nodes through srun vs one srun",
                  [f"test cluster: scripts/testslurm up --prefix {PREFIX} --subnet {SUBNET}, {args.reps} reps"])
    with _bench.workdir("slurm") as state, _bench.test_slurm(PREFIX, SUBNET, state / "cluster") as env:
        if env is None:
            return
        starts, steps, local = [], [], []
        for rep in range(args.reps):
            got = first_step(env, state / "logs")
            if got:
                starts.append(got[0])
                steps.append(got[1])
            figure = local_first_step(state / "local-logs")
            if figure is not None:
                local.append(figure)
        table(["submit to", "median s", "min s", "max s"],
              [["job start", *spread(starts)], ["first training step", *spread(steps)],
               ["(--local 2: first training step)", *spread(local)]])
        inner_run = subprocess.run(["salloc", "-N2", "--ntasks-per-node=4", "--", PYTHON, __file__, "--inner",
                                    "--reps", str(args.reps)], capture_output=True, text=True, timeout=900,
                                   env={**env, "BENCH_LOGS": str(state / "inner-logs")}, cwd=ROOT)
        line = next((l for l in inner_run.stdout.splitlines() if l.startswith("TIMES ")), None)
        if line is None:
            note(f"allocation run failed: {inner_run.stderr.strip()[-500:]}")
            return
        times = json.loads(line[len("TIMES "):])
        table(["side", "median s", "min s", "max s"], [[name, *spread(values)] for name, values in times.items()])
        a, b = (median(v) for v in list(times.values())[:2])
        _bench.verdict("8 tasks via tflaunch --slurm / one bare srun", a / b, TARGET)
        many_nodes(args.reps, state)


if __name__ == "__main__":
    main()
