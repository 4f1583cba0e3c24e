"""Wall-time overhead of tflaunch on a real 2-worker MultiWorkerMirroredStrategy job.

    python benchmarks/bench_tf_overhead.py [--reps N] [--epochs E] [--dataset NAME]

Side A: ``tflaunch --local 2 --quiet -- python -m trainer ...``.
Side B: the same two trainer processes started by hand, each with exactly the env tflaunch adds
(read from ``--dry-run``; TF_CONFIG rebuilt on two fresh free ports), output to one file per task.
Wall time runs from just before the first process is started to both having exited.
Target: median(tflaunch) / median(hand) <= 1.03.

The trainer's own ``total_seconds`` (process start to its final metric line) is shown too: on a
shared machine it varies far more between runs than the launcher costs, so the script also
reports what tflaunch itself adds, free of that noise: its latency before the first task starts
and after the last one ends (from run.json) and its own CPU time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from datetime import datetime
from pathlib import Path

import _bench
from _bench import TFLAUNCH, median, note

TARGET = 1.03
FINAL_RE = re.compile(rb'TFLAUNCH_METRIC (\{"kind":"final".*\})')
EPOCH_RE = re.compile(rb'TFLAUNCH_METRIC (\{"kind":"epoch".*\})')


def trainer_seconds(text: bytes) -> float | None:
    """The trainer's own total_seconds (from its final metric line), the largest over the tasks."""
    found = [json.loads(m.group(1)).get("total_seconds") for m in FINAL_RE.finditer(text)]
    found = [f for f in found if isinstance(f, (int, float))]
    return max(found) if found else None


def epoch_seconds(text: bytes) -> float | None:
    """The seconds the epochs themselves took (their epoch_seconds summed per task), the largest
    over the tasks: the rest of the trainer's own time is its start (TensorFlow's import, the
    cluster's connection) and its end."""
    per_task: dict[str, float] = {}
    for match in EPOCH_RE.finditer(text):
        record = json.loads(match.group(1))
        if isinstance(record.get("epoch_seconds"), (int, float)):
            per_task[record.get("task", "")] = per_task.get(record.get("task", ""), 0.0) + record["epoch_seconds"]
    return max(per_task.values()) if per_task else None


def run_tflaunch(work: Path, command: list[str]) -> dict:
    log_dir = work / "logs"
    argv = [TFLAUNCH, "--local", "2", "--quiet", "--log-dir", str(log_dir), "--", *command]
    with open(work / "tflaunch.console", "wb") as console:
        started = time.time()
        start = time.perf_counter()
        proc = _bench.popen(argv, cwd=work, stdout=console, stderr=console)
        with _bench.Sampler(proc.pid, interval=0.05) as sampler:
            rc, exited, usage = _bench.wait4(proc)
        wall = time.perf_counter() - start
    result = {"wall": wall, "rc": rc, "trainer": None, "epochs": None, "before": None, "after": None,
              "cpu": sampler.result.cpu_self, "rss": sampler.result.peak_rss,
              "all_cpu": usage.ru_utime + usage.ru_stime}  # tflaunch, its agent and the trainers it reaped
    run_dir = _bench.last_run_dir(log_dir)
    if run_dir is None:
        return result
    merged = (run_dir / "merged.log").read_bytes()
    result["trainer"], result["epochs"] = trainer_seconds(merged), epoch_seconds(merged)
    # Launcher latency, free of training noise: before the first task starts and after the last one ends.
    tasks = _bench.read_manifest(run_dir)["tasks"]
    starts = [datetime.fromisoformat(t["started_at"]).timestamp() for t in tasks if t.get("started_at")]
    ends = [datetime.fromisoformat(t["ended_at"]).timestamp() for t in tasks if t.get("ended_at")]
    if starts and ends:
        result.update(before=min(starts) - started, after=exited - max(ends))
    return result


def run_by_hand(work: Path, planned: list[_bench.PlannedTask], rep: int) -> dict:
    ports = _bench.free_ports(len(planned))
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    run_dir = work / f"hand-{rep}"
    run_dir.mkdir()
    planned_dir = planned[0].env.get("TFLAUNCH_RUN_DIR", str(work / "logs" / "<run-id>"))
    envs = []
    for index, task in enumerate(planned):
        # --dry-run names the run folder '<run-id>' (no folder exists yet): point every such value,
        # TFLAUNCH_TENSORBOARD_DIR among them, at this side's own folder, as a real run would.
        env = {**os.environ, **{k: v.replace(planned_dir, str(run_dir)) for k, v in task.env.items()}}
        env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}},
                                      separators=(",", ":"))
        env["TFLAUNCH_RUN_ID"] = run_dir.name
        env["TFLAUNCH_RUN_DIR"] = str(run_dir)
        envs.append(env)
    fds = [os.open(run_dir / f"{t.name}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) for t in planned]
    try:
        start = time.perf_counter()
        procs = [_bench.popen(t.argv, cwd=work, env=env, stdout=fd, stderr=fd, close_fds=True)
                 for t, env, fd in zip(planned, envs, fds)]
        waited = [_bench.wait4(p) for p in procs]
        wall = time.perf_counter() - start
        codes = [rc for rc, _, _ in waited]
        all_cpu = sum(usage.ru_utime + usage.ru_stime for _, _, usage in waited)
    finally:
        for fd in fds:
            os.close(fd)
    text = b"".join((run_dir / f"{t.name}.log").read_bytes() for t in planned)
    return {"wall": wall, "rc": max(codes, key=abs), "trainer": trainer_seconds(text), "epochs": epoch_seconds(text),
            "all_cpu": all_cpu}


def fixed_cost(work: Path, reps: int = 3) -> float:
    """tflaunch's own wall time for the same 2-task launch when the tasks do nothing (/bin/true)."""
    walls = []
    for rep in range(reps):
        argv = [TFLAUNCH, "--local", "2", "--quiet", "--log-dir", str(work / "logs-true"), "--", "true"]
        with open(os.devnull, "wb") as devnull:
            start = time.perf_counter()
            proc = _bench.popen(argv, cwd=work, stdout=devnull, stderr=devnull)
            proc.wait()
            walls.append(time.perf_counter() - start)
    return median(walls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5, help="repetitions per side (default 5)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--dataset", default="digits")
    args = parser.parse_args()
    command = ["python", "-m", "trainer", "--epochs", str(args.epochs), "--dataset", args.dataset]
    _bench.header("bench_tf_overhead: 2-worker MWMS job, tflaunch --local 2 vs hand-launched",
                  [f"job: {' '.join(command)}; {args.reps} interleaved repetitions per side"])
    with _bench.workdir("tf") as work:
        planned = _bench.dry_run(["--local", "2", "--", *command], work)
        note(f"env tflaunch adds (from --dry-run): {', '.join(sorted(planned[0].env))}")
        results: dict[str, list[dict]] = {"tflaunch": [], "hand": []}
        for rep, side in _bench.interleaved(args.reps, ["tflaunch", "hand"]):
            r = run_tflaunch(work, command) if side == "tflaunch" else run_by_hand(work, planned, rep)
            results[side].append(r)
            extra = f" launcher cpu {r['cpu']:.2f} s, peak rss {r['rss'] / 2**20:.0f} MB" if side == "tflaunch" else ""
            trainer = f"{r['trainer']:.2f}" if r["trainer"] is not None else "?"
            trainer += f" (epochs {r['epochs']:.2f})" if r["epochs"] is not None else ""
            note(f"rep {rep + 1} {side:8s} wall {r['wall']:.2f} s, trainer total_seconds {trainer}, "
                 f"exit {r['rc']}{extra}")
        bare = fixed_cost(work)

    ok = {side: [r for r in rs if r["rc"] == 0] for side, rs in results.items()}
    _bench.sides_table(results, {"tflaunch": "tflaunch --local 2 --quiet", "hand": "hand-launched (same env)"},
                       "trainer's own s", lambda rs: median([r["trainer"] for r in rs if r["trainer"] is not None]))
    epochs = {side: [r["epochs"] for r in rs if r["epochs"] is not None] for side, rs in ok.items()}
    if epochs["tflaunch"] and epochs["hand"]:
        print(f"  of the trainer's own time, its epochs (median): {median(epochs['tflaunch']):.2f} s under tflaunch, "
              f"{median(epochs['hand']):.2f} s by hand; the rest is its start and end")
    t = ok["tflaunch"]
    print(f"  tflaunch process: median CPU {median([r['cpu'] for r in t]):.2f} s, "
          f"median peak RSS {median([r['rss'] for r in t]) / 2**20:.0f} MB; "
          f"same launch with tasks = true: {bare:.2f} s wall")
    before = median([r["before"] for r in t if r["before"] is not None])
    after = median([r["after"] for r in t if r["after"] is not None])
    print(f"  tflaunch latency (run.json task times): start -> first task started {before:.3f} s, "
          f"last task ended -> tflaunch exit {after:.3f} s, together {before + after:.3f} s")
    failed = sum(1 for rs in results.values() for r in rs if r["rc"] != 0)
    if failed:
        print(f"  {failed} run(s) exited non-zero and are left out of the medians")
    if ok["tflaunch"] and ok["hand"]:
        a, b = median([r["wall"] for r in ok["tflaunch"]]), median([r["wall"] for r in ok["hand"]])
        pairs = [ta["wall"] / hb["wall"] for ta, hb in zip(results["tflaunch"], results["hand"])
                 if ta["rc"] == 0 and hb["rc"] == 0]
        print(f"  difference of medians: {a - b:+.2f} s; median of per-repetition ratios: {median(pairs):.3f}")
        cpu = median([r["cpu"] for r in t])
        everything = {side: median([r["all_cpu"] for r in rs]) for side, rs in ok.items()}
        print(f"  CPU of everything each side ran (median): tflaunch side {everything['tflaunch']:.2f} s "
              f"(tflaunch, its agent and the trainers), hand side {everything['hand']:.2f} s (the trainers)")
        print(f"  upper bound free of training noise: (hand median + latency {before + after:.2f} s "
              f"+ launcher CPU {cpu:.2f} s) / hand median = {(b + before + after + cpu) / b:.3f}")
        _bench.verdict("ratio tflaunch / hand-launched", a / b, TARGET)
        _bench.interval_note([r["wall"] for r in ok["tflaunch"]], [r["wall"] for r in ok["hand"]])
    else:
        print("RESULT ratio tflaunch / hand-launched: no successful runs on one side")


if __name__ == "__main__":
    _bench.main_guard(main)
