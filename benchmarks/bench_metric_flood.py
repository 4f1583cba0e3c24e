"""tflaunch's memory under a flood of metric lines: a quiet run against one whose task prints 20,000 lines of 20 KB.

    python benchmarks/bench_metric_flood.py [--reps N] [--lines L] [--size BYTES]

Side A (quiet): ``tflaunch --local 1 -- python -c <WRITER> 10 200``, ten small epoch records.
Side B (flood): ``tflaunch --local 1 -- python -c <WRITER> L BYTES``, L epoch records of about
BYTES each (a ``pad`` list of figures), 400 MB of metric lines with the defaults.
Side C (quarter flood): side B with L/4 records, to show that the cost does not grow with the flood.
Both with the console on a file, as ``tflaunch submit`` has it. tflaunch's peak RSS is its VmHWM in
/proc, read every 20 ms until it exits (the high-water mark only grows: the last reading is the
peak). Besides it, the sizes of metrics.jsonl, merged.log and the console's file.

The ratio peak(B) / peak(A) is printed for information: a flood of any output fills tflaunch's
fixed buffers once (the console's queue, 16 MiB of task lines; the pump's sweep and merged.log's
batch, a few MiB each), and a quiet run's 20 MB or so is mostly the interpreter. The target is
that memory stays flat: peak(B) / peak(C) <= 1.2, four times the lines printed for the same memory.
"""

from __future__ import annotations

import argparse
import subprocess
import time
from pathlib import Path

import _bench
from _bench import PYTHON, TFLAUNCH, median, note

TARGET = 1.2
WRITER = (
    "import json, sys\n"
    "count, size = int(sys.argv[1]), int(sys.argv[2])\n"
    "pad = [0.5] * max(0, (size - 80) // 5)\n"
    "for epoch in range(1, count + 1):\n"
    "    sys.stdout.write('TFLAUNCH_METRIC ' + json.dumps({'kind': 'epoch', 'epoch': epoch, 'loss': 1 / epoch, 'pad': pad}) + '\\n')\n"
)


def peak_kib(pid: int) -> int:
    """tflaunch's VmHWM so far, in KiB; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def one_run(where: Path, lines: int, size: int) -> dict:
    logs = where / "logs"
    console = where / "console.out"
    started = time.monotonic()
    with open(console, "wb") as out:
        proc = _bench.popen([TFLAUNCH, "--local", "1", "--log-dir", str(logs), "--",
                             PYTHON, "-c", WRITER, str(lines), str(size)], stdout=out, stderr=out, cwd=where)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, peak_kib(proc.pid))
            time.sleep(0.02)
    wall = time.monotonic() - started
    run = max(p for p in logs.iterdir() if p.is_dir())
    sizes = {name: (run / name).stat().st_size for name in ("metrics.jsonl", "merged.log")}
    result = {"rc": proc.returncode, "wall": wall, "peak_mb": peak / 1024, "console": console.stat().st_size, **sizes}
    subprocess.run(["rm", "-rf", str(logs), str(console)], check=False)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--lines", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=20_000)
    args = parser.parse_args()
    _bench.header("tflaunch's peak RSS: quiet run vs a flood of metric lines",
                  [f"flood: {args.lines:,} epoch records of {args.size:,} bytes "
                   f"({args.lines * args.size / 1e6:,.0f} MB); console on a file; {args.reps} reps"])
    sides = {"quiet": (10, 200), "quarter flood": (args.lines // 4, args.size), "flood": (args.lines, args.size)}
    results: dict[str, list[dict]] = {side: [] for side in sides}
    with _bench.workdir("metric-flood") as where:
        for rep, side in _bench.interleaved(args.reps, list(sides)):
            result = one_run(where, *sides[side])
            results[side].append(result)
            note(f"rep {rep + 1} {side}: exit {result['rc']}, {result['wall']:.1f} s, "
                 f"peak RSS {result['peak_mb']:.1f} MB")
    print()
    rows = []
    for side, runs in results.items():
        ok = [r for r in runs if r["rc"] == 0]
        rows.append([side, len(ok), median([r["wall"] for r in ok]), median([r["peak_mb"] for r in ok]),
                     max((r["metrics.jsonl"] for r in ok), default=0) / 2**20,
                     max((r["merged.log"] for r in ok), default=0) / 2**20,
                     max((r["console"] for r in ok), default=0) / 2**20])
    _bench.table(["side", "ok runs", "median s", "peak RSS MB", "metrics.jsonl MiB", "merged.log MiB",
                  "console MiB"], rows)
    quiet, quarter, flood = rows[0][3], rows[1][3], rows[2][3]
    note(f"peak RSS: quiet {quiet:.1f} MB, quarter flood {quarter:.1f} MB, flood {flood:.1f} MB; "
         f"flood / quiet {flood / quiet if quiet else float('nan'):.2f}")
    _bench.verdict("flood / quarter flood peak RSS", flood / quarter if quarter else float("nan"), TARGET)


if __name__ == "__main__":
    _bench.main_guard(main)
