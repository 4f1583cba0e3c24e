"""Log throughput: 8 chatty tasks through tflaunch's merged log vs the same writers into plain files.

    python benchmarks/bench_log_throughput.py [--reps N] [--tasks T] [--lines L] [--before DIR]

Every task runs the same writer, ``python -c <WRITER> L``, which prints L numbered lines to stdout.
Side A: ``tflaunch --local 8 --quiet --threads off -- python -c <WRITER> L``; each task's output
comes over its agent's channel into its log, and tflaunch's pump thread reads them all into merged.log.
Side B: the same 8 writer processes started together by this script, each with stdout and stderr
on its own file (O_APPEND, as tflaunch opens them) and exactly the env tflaunch adds, waited together.
Side C (for information): side B without PYTHONUNBUFFERED, which tflaunch sets for every task.
Side D (with ``--before DIR``): side A with the launcher package found in DIR (``git archive COMMIT
launcher | tar -x -C DIR``), interleaved with the others: a before/after comparison in one run.
After every tflaunch run, merged.log is checked line by line: every number 0..L-1 of every task
exactly once and intact. Besides wall times, the CPU of everything each side ran (tflaunch, its
agent and the writers, or the writers alone) is summed from wait4. Target: median(A) / median(B) <= 1.2.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

import _bench
from _bench import PYTHON, TFLAUNCH, median, note

TARGET = 1.2
TEXT = " the quick brown fox jumps over the lazy dog"
WRITER = (
    "import sys\n"
    "w = sys.stdout.write\n"
    "for i in range(int(sys.argv[1])):\n"
    f"    w(f'{{i}}{TEXT}\\n')\n"
)


def check_merged(path: Path, names: list[str], lines: int) -> dict:
    """Per-task counts of lost, duplicated and damaged lines in merged.log."""
    seen = {name: bytearray(lines) for name in names}
    damaged = other = 0
    text = TEXT.encode()
    with open(path, "rb") as merged:
        for line in merged:
            # "<date> <time> [<attempt>] <task> | <content>": the task is the word before " | "
            head, sep, content = line.rstrip(b"\n").partition(b" | ")
            if not sep:
                damaged += 1
                continue
            counts = seen.get(head.rsplit(b" ", 1)[-1].decode(errors="replace"))
            if counts is None:
                other += 1  # tflaunch's own messages
                continue
            number, _, rest = content.partition(b" ")
            if not number.isdigit() or int(number) >= lines or b" " + rest != text:
                damaged += 1
                continue
            n = int(number)
            if counts[n] < 255:
                counts[n] += 1
    lost = sum(c.count(0) for c in seen.values())
    duplicated = sum(sum(v - 1 for v in c if v > 1) for c in seen.values())
    return {"lost": lost, "duplicated": duplicated, "damaged": damaged, "launcher_lines": other}


def run_tflaunch(work: Path, tasks: int, lines: int, source: str | None = None) -> dict:
    log_dir = work / "logs"
    argv = [TFLAUNCH, "--local", str(tasks), "--quiet", "--threads", "off", "--log-dir", str(log_dir),
            "--", "python", "-c", WRITER, str(lines)]
    with open(work / "tflaunch.console", "wb") as console:
        start = time.perf_counter()
        proc = _bench.popen(argv, cwd=work, stdout=console, stderr=console, env=_bench.launcher_env(source))
        with _bench.Sampler(proc.pid, interval=0.05, per_thread=True) as sampler:
            rc, ended, usage = _bench.wait4(proc)
        wall = time.perf_counter() - start
    run_dir = _bench.last_run_dir(log_dir)
    if run_dir is None:
        raise RuntimeError(f"tflaunch exited {rc} without a run folder; see {work / 'tflaunch.console'}")
    names = [f"worker-{i}" for i in range(tasks)]
    last_write = max(os.stat(run_dir / f"{n}.log").st_mtime for n in names)
    check = check_merged(run_dir / "merged.log", names, lines)
    s = sampler.result
    pump = sum(cpu for tid, cpu in s.threads.items() if tid != str(proc.pid))
    result = {"wall": wall, "rc": rc, "cpu": s.cpu_self, "pump_cpu": pump, "rss": s.peak_rss,
              "all_cpu": usage.ru_utime + usage.ru_stime,  # tflaunch, its agent and the tasks the agent reaped
              "drain": ended - last_write, "merged_mb": (run_dir / "merged.log").stat().st_size / 1e6, **check}
    shutil.rmtree(run_dir, ignore_errors=True)
    return result


def run_direct(work: Path, planned: list[_bench.PlannedTask], lines: int, rep: int, buffered: bool) -> dict:
    out = work / f"direct-{rep}-{'buffered' if buffered else 'same-env'}"
    out.mkdir()
    fds = [os.open(out / f"{t.name}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) for t in planned]
    envs = []
    for task in planned:
        env = {**os.environ, **task.env}
        if buffered:
            env.pop("PYTHONUNBUFFERED", None)
        envs.append(env)
    try:
        start = time.perf_counter()
        procs = [_bench.popen([PYTHON, "-c", WRITER, str(lines)], cwd=work, env=env, stdout=fd, stderr=fd)
                 for env, fd in zip(envs, fds)]
        waited = [_bench.wait4(p) for p in procs]
        wall = time.perf_counter() - start
        codes = [rc for rc, _, _ in waited]
        all_cpu = sum(usage.ru_utime + usage.ru_stime for _, _, usage in waited)
    finally:
        for fd in fds:
            os.close(fd)
    counted = sum((out / f"{t.name}.log").read_bytes().count(b"\n") for t in planned)
    shutil.rmtree(out, ignore_errors=True)
    return {"wall": wall, "rc": max(codes, key=abs), "lines": counted, "all_cpu": all_cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5, help="repetitions per side (default 5)")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--before", metavar="DIR",
                        help="also run tflaunch with the launcher package in DIR (an older tree), interleaved")
    args = parser.parse_args()
    _bench.header(f"bench_log_throughput: {args.tasks} tasks x {args.lines:,} lines, tflaunch vs direct to files",
                  [f"{args.reps} interleaved repetitions per side; writer: python -c <print {args.lines:,} "
                   f"numbered lines of {len(TEXT) + 7} bytes>"], before=args.before)
    sides = ["tflaunch", "direct", "buffered"] + (["before"] if args.before else [])
    results: dict[str, list[dict]] = {s: [] for s in sides}
    with _bench.workdir("logs") as work:
        planned = _bench.dry_run(["--local", str(args.tasks), "--threads", "off", "--", "python", "-c", "pass"], work)
        note(f"env tflaunch adds (from --dry-run): {', '.join(sorted(planned[0].env))}")
        for rep, side in _bench.interleaved(args.reps, sides):
            if side in ("tflaunch", "before"):
                r = run_tflaunch(work, args.tasks, args.lines, args.before if side == "before" else None)
                note(f"rep {rep + 1} {side:8s} wall {r['wall']:.2f} s, exit {r['rc']}, launcher cpu {r['cpu']:.2f} s "
                     f"(non-main threads {r['pump_cpu']:.2f} s), drain after last write {r['drain']:.2f} s, "
                     f"lost {r['lost']}, duplicated {r['duplicated']}, damaged {r['damaged']}")
            else:
                r = run_direct(work, planned, args.lines, rep, buffered=(side == "buffered"))
                note(f"rep {rep + 1} {side:8s} wall {r['wall']:.2f} s, exit {r['rc']}, lines {r['lines']:,}")
            results[side].append(r)

    labels = {"tflaunch": "tflaunch --local 8 (merged.log)", "direct": "direct to files, same env",
              "buffered": "direct, PYTHONUNBUFFERED unset", "before": f"tflaunch from {args.before}"}
    total = args.tasks * args.lines
    _bench.sides_table(results, {side: labels[side] for side in sides}, "M lines/s",
                       lambda ok: f"{total / median([r['wall'] for r in ok]) / 1e6:.2f}" if ok else "-")
    t = results["tflaunch"]
    print(f"  merged.log check over {len(t)} runs ({args.tasks} x {args.lines:,} lines each): "
          f"lost {sum(r['lost'] for r in t)}, duplicated {sum(r['duplicated'] for r in t)}, "
          f"damaged {sum(r['damaged'] for r in t)}; merged.log {median([r['merged_mb'] for r in t]):.0f} MB")
    print(f"  tflaunch process: median CPU {median([r['cpu'] for r in t]):.2f} s, "
          f"of which non-main threads (pump, sampler) {median([r['pump_cpu'] for r in t]):.2f} s; "
          f"peak RSS {median([r['rss'] for r in t]) / 2**20:.0f} MB; "
          f"drain after the last task write {median([r['drain'] for r in t]):.2f} s")
    walls = {side: [r["wall"] for r in results[side] if r["rc"] == 0] for side in ("tflaunch", "direct")}
    a, b = median(walls["tflaunch"]), median(walls["direct"])
    c = median([r["wall"] for r in results["buffered"] if r["rc"] == 0])
    cpu = {side: median([r["all_cpu"] for r in results[side]]) for side in sides if side != "buffered"}
    print(f"  CPU of everything each side ran (median): tflaunch side {cpu['tflaunch']:.2f} s (tflaunch, its agent "
          f"and the writers), direct side {cpu['direct']:.2f} s"
          + (f", before side {cpu['before']:.2f} s" if args.before else ""))
    print(f"  for information: tflaunch / direct without PYTHONUNBUFFERED = {a / c:.3f}")
    if args.before:
        d = median([r["wall"] for r in results["before"] if r["rc"] == 0])
        print(f"  for information: before ({args.before}) / direct (same env) = {d / b:.3f}; "
              f"this tree / direct = {a / b:.3f}")
    _bench.verdict("ratio tflaunch / direct (same env)", a / b, TARGET)
    _bench.interval_note(walls["tflaunch"], walls["direct"])


if __name__ == "__main__":
    _bench.main_guard(main)
