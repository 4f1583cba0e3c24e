"""What sealing costs a local run's start: ``tflaunch --local 2`` sealed (the default) and with --no-seal.

    python benchmarks/sealed_start.py [--reps N]

Both sides run ``tflaunch --local 2 --quiet --threads off -- python -c <CODE>``, whose task writes
time.time() as its first act and exits 0. Measured per run: launch -> the later task's first
act ("start"), and launch -> tflaunch's exit ("wall"). The sealed side makes the run's network
namespace and, where slirp4netns or pasta is installed, gives it outside network (which one is
printed). Target: sealed start / unsealed start <= 1.1 (medians of interleaved runs).
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

import _bench
from _bench import TFLAUNCH, median, note, table

TARGET = 1.1
CODE = ("import os, sys, time\n"
        "stamp = time.time()\n"
        "with open(os.path.join(sys.argv[1], os.environ['TFLAUNCH_TASK']), 'w') as f:\n"
        "    f.write(repr(stamp))\n")
SIDES = {"sealed": [], "unsealed": ["--no-seal"]}


def once(work: Path, side: str, rep: int) -> dict:
    stamps = work / f"stamps-{side}-{rep}"
    stamps.mkdir()
    argv = [TFLAUNCH, "--local", "2", "--quiet", "--threads", "off", *SIDES[side], "--log-dir", str(work / "logs"),
            "--", "python", "-c", CODE, str(stamps)]
    with open(work / "tflaunch.console", "ab") as console:
        launched = time.time()
        proc = _bench.popen(argv, cwd=work, stdout=console, stderr=console)
        rc, exited, _ = _bench.wait4(proc)
    firsts = [float(path.read_text()) for path in stamps.iterdir()]
    start = max(firsts) - launched if len(firsts) == 2 else None
    return {"rc": rc if start is not None else 1, "start": start, "wall": exited - launched}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    outside = next((tool for tool in ("slirp4netns", "pasta") if shutil.which(tool)), None)
    _bench.header("sealed start: tflaunch --local 2, sealed (default) and --no-seal",
                  [f"outside network of the sealed side: {outside or 'none (neither slirp4netns nor pasta)'}",
                   f"{args.reps} runs per side, interleaved; as uid {os.geteuid()}"])
    results: dict[str, list[dict]] = {side: [] for side in SIDES}
    with _bench.workdir("sealed") as work:
        for rep, side in _bench.interleaved(args.reps, list(SIDES)):
            results[side].append(once(work, side, rep))
        console = (work / "tflaunch.console").read_text(errors="replace")
    lines = sorted({line for line in console.splitlines() if "network:" in line})
    for line in lines:
        note(f"said: {line}")
    rows = []
    for side in SIDES:
        ok = [r for r in results[side] if r["rc"] == 0]
        rows.append([side, len(ok), median([r["start"] for r in ok]), min((r["start"] for r in ok), default=float("nan")),
                     median([r["wall"] for r in ok])])
    print()
    table(["side", "ok runs", "start median s", "start min s", "wall median s"], rows)
    sealed = [r["start"] for r in results["sealed"] if r["rc"] == 0]
    unsealed = [r["start"] for r in results["unsealed"] if r["rc"] == 0]
    walls = [median([r["wall"] for r in results[side] if r["rc"] == 0]) for side in SIDES]
    note(f"wall-time ratio sealed / unsealed: {walls[0] / walls[1]:.3f}")
    _bench.verdict("sealed start / unsealed start", median(sealed) / median(unsealed), TARGET)
    _bench.interval_note(sealed, unsealed)


if __name__ == "__main__":
    _bench.main_guard(main)
