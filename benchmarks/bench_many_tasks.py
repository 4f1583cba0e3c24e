"""Many trivial tasks: tflaunch --local 64 vs a shell loop starting them in the background.

    python benchmarks/bench_many_tasks.py [--reps N] [--tasks T]

Two workloads, each with the same command on both sides:
  true    the system's ``true`` (by absolute path, so the shell forks and execs it as tflaunch does)
  python  ``python -c pass`` with the project's interpreter
Side A: ``tflaunch --local 64 --quiet --threads off -- CMD``.
Side B: ``sh -c 'for i in 1..64: CMD >task-$i.log 2>&1 & done; wait'`` (one output file per task,
as tflaunch gives each task).
Wall time from start to exit. Targets: each task beyond the first adds <= 2 ms to a run (64 x ``true``
against 1 x ``true``, every task under the one local agent); median(A) / median(B) <= 2 (for
``true``); tflaunch's peak RSS <= 80 MB (wait4's ru_maxrss of the tflaunch process, cross-checked by
psutil sampling).
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import time
from pathlib import Path

import _bench
from _bench import PYTHON, TFLAUNCH, median, note, spread, table

TARGET_RATIO = 2.0
TARGET_PER_TASK_MS = 2.0
TARGET_RSS_MB = 80.0


def commands() -> dict[str, list[str]]:
    true = shutil.which("true") or "/bin/true"
    return {"true": [true], "python": [PYTHON, "-c", "pass"]}


def run_tflaunch(work: Path, tasks: int, command: list[str]) -> dict:
    log_dir = work / "logs"
    argv = [TFLAUNCH, "--local", str(tasks), "--quiet", "--threads", "off", "--log-dir", str(log_dir), "--", *command]
    with open(work / "tflaunch.console", "wb") as console:
        start = time.perf_counter()
        proc = _bench.popen(argv, cwd=work, stdout=console, stderr=console)
        with _bench.Sampler(proc.pid, interval=0.01) as sampler:
            rc, _, usage = _bench.wait4(proc)
        wall = time.perf_counter() - start
    run_dir = _bench.last_run_dir(log_dir)
    manifest = _bench.read_manifest(run_dir)
    ok_tasks = sum(1 for t in manifest["tasks"] if t.get("exit_code") == 0)
    shutil.rmtree(run_dir, ignore_errors=True)
    return {"wall": wall, "rc": rc, "maxrss": usage.ru_maxrss * 1024, "sampled_rss": sampler.result.peak_rss,
            "cpu": sampler.result.cpu_self, "ok_tasks": ok_tasks}


def run_shell(work: Path, tasks: int, command: list[str], rep: int) -> dict:
    out = work / f"shell-{rep}"
    out.mkdir(exist_ok=True)
    cmd = shlex.join(command)
    script = (f"i=0; while [ $i -lt {tasks} ]; do {cmd} >{shlex.quote(str(out))}/task-$i.log 2>&1 & "
              f"i=$((i+1)); done; wait")
    start = time.perf_counter()
    proc = _bench.popen(["/bin/sh", "-c", script], cwd=work)
    rc = proc.wait()
    wall = time.perf_counter() - start
    logs = len(list(out.glob("task-*.log")))
    shutil.rmtree(out, ignore_errors=True)
    return {"wall": wall, "rc": rc, "ok_tasks": logs}


def startup_costs(work: Path, reps: int = 7) -> dict[str, float]:
    """Median wall time of a bare interpreter and of one that imports what ``tflaunch run`` imports."""
    probes = {"bare": [PYTHON, "-c", "pass"],
              "imports": [PYTHON, "-c", "import launcher.cli, launcher.run.lifecycle.launch, launcher.run.output.pump, launcher.run.console.writer, launcher.run.lifecycle.summary"]}
    walls: dict[str, list[float]] = {k: [] for k in probes}
    for _, key in _bench.interleaved(reps, list(probes)):
        start = time.perf_counter()
        _bench.popen(probes[key], cwd=work).wait()
        walls[key].append(time.perf_counter() - start)
    return {k: median(v) for k, v in walls.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=7, help="repetitions per side and workload (default 7)")
    parser.add_argument("--tasks", type=int, default=64)
    args = parser.parse_args()
    _bench.header(f"bench_many_tasks: {args.tasks} trivial tasks, tflaunch --local {args.tasks} vs a shell loop",
                  [f"{args.reps} interleaved repetitions per side and workload"])
    results: dict[tuple[str, str], list[dict]] = {}
    with _bench.workdir("many") as work:
        for name, command in commands().items():
            note(f"workload {name}: {shlex.join(command)}")
            sides = ["tflaunch", "shell"] + (["tflaunch-1"] if name == "true" else [])
            for rep, side in _bench.interleaved(args.reps, sides):
                if side == "tflaunch-1":  # the same launch with one task: tflaunch's fixed cost
                    r = run_tflaunch(work, 1, command)
                    note(f"rep {rep + 1} tflaunch, 1 task: wall {r['wall']:.3f} s, exit {r['rc']}")
                elif side == "tflaunch":
                    r = run_tflaunch(work, args.tasks, command)
                    note(f"rep {rep + 1} tflaunch wall {r['wall']:.3f} s, exit {r['rc']}, tasks ok {r['ok_tasks']}, "
                         f"launcher cpu {r['cpu']:.2f} s, maxrss {r['maxrss'] / 2**20:.1f} MB")
                else:
                    r = run_shell(work, args.tasks, command, rep)
                    note(f"rep {rep + 1} shell    wall {r['wall']:.3f} s, exit {r['rc']}")
                results.setdefault((name, side), []).append(r)

        imports = startup_costs(work)

    rows = []
    for (name, side), runs in results.items():
        rs = [r for r in runs if r["rc"] == 0]
        walls = [r["wall"] for r in rs]
        rss = f"{median([r['maxrss'] for r in rs]) / 2**20:.1f}" if side.startswith("tflaunch") else "-"
        label = {"tflaunch": f"tflaunch --local {args.tasks}", "shell": "shell loop",
                 "tflaunch-1": "tflaunch --local 1"}
        rows.append([f"{name:6s} {label[side]}", len(rs), *spread(walls), rss])
    print()
    table(["workload side", "ok runs", "median s", "min s", "max s", "peak RSS MB"], rows)
    ratios = {}
    for name in commands():
        a = median([r["wall"] for r in results[(name, "tflaunch")] if r["rc"] == 0])
        b = median([r["wall"] for r in results[(name, "shell")] if r["rc"] == 0])
        ratios[name] = a / b
    t = [r for (name, side), rs in results.items() if side.startswith("tflaunch") for r in rs]
    one = median([r["wall"] for r in results[("true", "tflaunch-1")] if r["rc"] == 0])
    many = median([r["wall"] for r in results[("true", "tflaunch")] if r["rc"] == 0])
    print(f"  where tflaunch's time goes: interpreter start {imports['bare']:.3f} s, + importing the launcher "
          f"{imports['imports'] - imports['bare']:.3f} s, whole 1-task run {one:.3f} s, "
          f"each further task {(many - one) / (args.tasks - 1) * 1000:.1f} ms")
    peak = max(r["maxrss"] for r in t) / 2**20
    sampled = max(r["sampled_rss"] for r in t) / 2**20
    print(f"  tflaunch peak RSS over all runs: {peak:.1f} MB by wait4 ru_maxrss, {sampled:.1f} MB by psutil sampling; "
          f"median launcher CPU ({args.tasks} x true): "
          f"{median([r['cpu'] for r in results[('true', 'tflaunch')]]):.2f} s")
    print(f"  for information: ratio with python -c pass = {ratios['python']:.3f}")
    _bench.verdict(f"each task beyond the first ({args.tasks} x true against 1 x true)",
                   (many - one) / (args.tasks - 1) * 1000, TARGET_PER_TASK_MS, " ms")
    _bench.verdict(f"ratio tflaunch / shell loop ({args.tasks} x true)", ratios["true"], TARGET_RATIO)
    _bench.verdict("tflaunch peak RSS", peak, TARGET_RSS_MB, " MB")


if __name__ == "__main__":
    _bench.main_guard(main)
