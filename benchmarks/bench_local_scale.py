"""Hundreds and thousands of local tasks: what tflaunch itself costs, and whether a common open-files
limit holds a thousand tasks.

    python benchmarks/bench_local_scale.py [--tasks 256] [--many 1000] [--reps 3]

1. **Memory, 256 tasks**: ``tflaunch --local 256 -- sleep 6``; once every task runs, the PSS (from
   ``/proc/PID/smaps_rollup``) of tflaunch and of every process it started other than the tasks
   (the one local agent), against the PSS of the tasks themselves for scale. Target: launcher
   side <= 100 MB (one agent per task used to cost 822 MB).
2. **A thousand tasks under ``ulimit -n 1024``**: ``tflaunch --local 1000 -- true`` in a shell whose
   soft and hard open-files limits are both 1024, against a shell loop starting the same 1000
   ``true`` with one log file each. Target: every run succeeds; the wall-time ratio is printed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from pathlib import Path

import _bench
from _bench import TFLAUNCH, median, note, spread, table

TARGET_PSS_MB = 100.0


def pss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for tid in os.listdir(f"/proc/{parent}/task") if os.path.isdir(f"/proc/{parent}/task") else []:
            try:
                children = [int(c) for c in Path(f"/proc/{parent}/task/{tid}/children").read_text().split()]
            except OSError:
                continue
            found += children
            todo += children
    return found


def memory(work: Path, tasks: int) -> dict:
    logs = work / "mem-logs"
    proc = _bench.popen([TFLAUNCH, "--local", str(tasks), "--quiet", "--log-dir", str(logs), "--", "sleep", "6"],
                        cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def all_running() -> bool:
        return sum(1 for p in descendants(proc.pid) if Path(f"/proc/{p}/comm").exists()
                   and Path(f"/proc/{p}/comm").read_text().strip() == "sleep") >= tasks

    ok = _bench.wait_for(all_running, timeout=60, interval=0.05)
    tree = descendants(proc.pid)
    launcher_side = [proc.pid] + [p for p in tree if _comm(p) != "sleep"]
    task_side = [p for p in tree if _comm(p) == "sleep"]
    result = {"ok": ok, "launcher_kb": sum(pss_kb(p) for p in launcher_side), "launcher_procs": len(launcher_side),
              "tasks_kb": sum(pss_kb(p) for p in task_side), "tasks": len(task_side)}
    proc.wait()
    result["rc"] = proc.returncode
    return result


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def thousand(work: Path, count: int, side: str, rep: int) -> tuple[float, int]:
    if side == "tflaunch":
        inner = f"{TFLAUNCH} --local {count} --quiet --log-dir {work / 'many-logs'} -- true"
    else:
        out = work / f"loop-{rep}"
        out.mkdir(exist_ok=True)
        inner = f"for i in $(seq {count}); do /bin/true > {out}/task-$i.log 2>&1 & done; wait"
    started = time.monotonic()
    done = subprocess.run(["bash", "-c", f"ulimit -n 1024 && {inner}"], cwd=work, capture_output=True)
    return time.monotonic() - started, done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=256)
    parser.add_argument("--many", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    _bench.header(f"bench_local_scale: {args.tasks} local tasks' memory; {args.many} tasks under ulimit -n 1024")
    with _bench.workdir("localscale") as work:
        runs = [memory(work, args.tasks) for _ in range(args.reps)]
        good = [r for r in runs if r["ok"] and r["rc"] == 0]
        rows = [[f"{args.tasks} x sleep", f"{len(good)}/{len(runs)}",
                 f"{median([r['launcher_kb'] for r in good]) / 1024:.1f}" if good else "-",
                 f"{median([r['launcher_procs'] for r in good]):.0f}" if good else "-",
                 f"{median([r['tasks_kb'] for r in good]) / 1024:.1f}" if good else "-"]]
        print()
        table(["run", "ok", "launcher-side PSS MB", "launcher-side processes", "tasks' PSS MB"], rows)
        if good:
            _bench.verdict(f"launcher-side PSS, {args.tasks} local tasks", median([r["launcher_kb"] for r in good]) / 1024,
                           TARGET_PSS_MB, " MB")
        results: dict[str, list[tuple[float, int]]] = {"tflaunch": [], "shell": []}
        for rep, side in _bench.interleaved(args.reps, ["tflaunch", "shell"]):
            results[side].append(thousand(work, args.many, side, rep))
            note(f"rep {rep + 1} {side}: {results[side][-1][0]:.2f} s, exit {results[side][-1][1]}")
        rows = []
        for side, label in (("tflaunch", f"tflaunch --local {args.many}"), ("shell", "shell loop")):
            walls = [w for w, rc in results[side] if rc == 0]
            rows.append([f"{label} under ulimit -n 1024", f"{len(walls)}/{len(results[side])}", *spread(walls)])
        print()
        table(["side", "ok runs", "median s", "min s", "max s"], rows)
        ok = [w for w, rc in results["tflaunch"] if rc == 0]
        base = [w for w, rc in results["shell"] if rc == 0]
        if ok and base:
            note(f"ratio tflaunch / shell loop, {args.many} x true: {median(ok) / median(base):.2f}")
        print(f"RESULT {args.many} tasks under ulimit -n 1024: {len(ok)} of {len(results['tflaunch'])} runs succeeded "
              f"({'met' if len(ok) == len(results['tflaunch']) else 'MISSED'})")


if __name__ == "__main__":
    _bench.main_guard(main)
