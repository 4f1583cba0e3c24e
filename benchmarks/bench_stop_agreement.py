"""What saving on SIGTERM costs a 2-worker fit loop per step: backups on against backups off.

    python benchmarks/bench_stop_agreement.py [--reps N] [--epochs E] [--before DIR]

With a backup folder (``--max-restarts 1``), the fit loop's workers agree after the same steps on
whether any of them was asked to stop, by a scalar all-reduce of their own (trainer.termination).
Side A: ``tflaunch --local 2 --max-restarts 1 -- python -m trainer``; side B: the same without
restarts, so without a backup folder and without the agreements. Each run's training rate is
worker-0's samples per second over epochs 2 to E (timed per step by the trainer: the epoch's
backup, written after its last step, is left out). With ``--before DIR`` (a folder holding another
tree's ``trainer`` package, ``git archive COMMIT trainer | tar -x -C DIR``), side A also runs with
that trainer, interleaved: a before/after comparison in one run.
Target: median rate of A / median rate of B >= 0.9. Side A also pays tf_keras's own BackupAndRestore,
which assigns a training-state variable before every step; the agreements, one reduction about
every termination.AGREE_SECONDS, are about 1 % of it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import _bench
from _bench import ROOT, TFLAUNCH, median, note

TARGET = 0.9


def rate(work: Path, trainer_from: Path, restarts: bool, epochs: int) -> tuple[float | None, str]:
    """(worker-0's samples per second over epochs 2..epochs, the spacing the workers agreed on)."""
    logs = work / "logs"
    argv = [TFLAUNCH, "--local", "2", "--quiet", "--log-dir", str(logs), *(["--max-restarts", "1"] if restarts else []),
            "--", "python", "-m", "trainer", "--epochs", str(epochs)]
    # 'python -m trainer' finds the package in its working folder first: the tree under test.
    done = subprocess.run(argv, cwd=trainer_from, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run_dir = _bench.last_run_dir(logs)
    if done.returncode != 0 or run_dir is None:
        return None, f"exit {done.returncode}"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rates = [r["samples_per_second"] for r in records if r.get("kind") == "epoch" and r.get("task") == "worker-0"
             and r.get("epoch", 0) >= 2 and isinstance(r.get("samples_per_second"), (int, float))]
    agreed = [line.split("every", 1)[1].strip() for line in (run_dir / "worker-0.log").read_text().splitlines()
              if "agree on stopping every" in line]
    return (sum(rates) / len(rates) if rates else None), (f"every {agreed[0]}" if agreed else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5, help="repetitions per side (default 5)")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--before", metavar="DIR", help="a folder holding another tree's trainer package")
    args = parser.parse_args()
    _bench.header("bench_stop_agreement: 2-worker fit loop, backups on (stop agreements) vs off",
                  [f"job: python -m trainer --epochs {args.epochs}; {args.reps} interleaved repetitions per side"])
    with _bench.workdir("stop") as work:
        sides = {"backups": (ROOT, True), "none": (ROOT, False),
                 **({"before": (Path(args.before).resolve(), True)} if args.before else {})}
        rates: dict[str, list[float]] = {side: [] for side in sides}
        for rep, side in _bench.interleaved(args.reps, list(sides)):
            folder, restarts = sides[side]
            value, agreed = rate(work / side, folder, restarts, args.epochs)
            note(f"rep {rep + 1} {side:8s} " + (f"{value:.0f} samples/s {agreed}" if value else f"failed ({agreed})"))
            if value:
                rates[side].append(value)
    labels = {"backups": "--max-restarts 1 (backups, agreements)", "none": "no restarts (no backup folder)",
              "before": f"--max-restarts 1, trainer from {args.before}"}
    print()
    _bench.table(["side", "ok runs", "median samples/s", "min", "max"],
                 [[labels[side], len(v), *_bench.spread(v)] for side, v in rates.items()])
    base = median(rates["none"])
    if args.before:
        note(f"the trainer from {args.before} with backups: {median(rates['before']) / base:.3f} of the rate without")
    ratio = median(rates["backups"]) / base
    print(f"RESULT rate with backups / without: {ratio:.3f} (target >= {TARGET:g}): "
          f"{'within target' if ratio >= TARGET else 'UNDER TARGET'}", flush=True)


if __name__ == "__main__":
    _bench.main_guard(main)
