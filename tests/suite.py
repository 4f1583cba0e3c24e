"""The whole suite in tiers, as CI runs it, each in an order of its own that a seed fixes.

    python tests/suite.py [--tiers unit,fast,...] [--seed N] [pytest arguments]

The tiers run one after the other, cheapest first, so a mistake in pure logic shows in seconds
rather than after the TensorFlow runs: ``unit`` (pure logic), ``fast`` (real processes, quick),
``processes`` (slow real-process tests: many tasks, restarts, terminals), ``ssh`` (namespaced
hosts and a real sshd), ``slurm`` (a real slurmctld and slurmd nodes), ``tensorflow`` (real
TensorFlow runs) and ``rest`` (whatever no tier above took, so no test is ever left out). A test
belongs to the first tier whose markers it has.

Every tier runs in random order (pytest-randomly) with one seed, printed first and given again
with ``--seed`` to replay the same order: a test that passes only after another fails here. The
unit and fast tiers run their tests in parallel worker processes (pytest-xdist, :data:`WORKERS`):
there the seed fixes the order the tests are handed out in, not which worker runs each. Each
tier's time and outcome are printed as it ends (after its slowest tests) and again in a table at
the end. The exit code is 0 when every tier passed (a tier with no test passes), else 1.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (name, markers): a test runs in the first tier whose expression it matches.
TIERS = (
    ("unit", "unit"),
    ("fast", "not slow and not ssh and not slurm and not tensorflow"),
    ("processes", "not ssh and not slurm and not tensorflow"),
    ("ssh", "ssh and not slurm and not tensorflow"),
    ("slurm", "slurm and not tensorflow"),
    ("tensorflow", "tensorflow"),
    ("rest", "not nothing"),
)
# Tiers whose tests run in parallel worker processes (pytest-xdist), and how many. The fast tier's
# tests mostly wait for the runs they start: four workers on two cores took it from 283 s to 120 s.
# The slower tiers' tests measure CPU shares, time terminals and share one network of test hosts or
# one Slurm cluster: they run one at a time.
WORKERS = {"unit": 2, "fast": 4}
NO_TESTS = 5  # pytest's exit code when no test was selected
SLOWEST = 10  # each tier ends with its slowest tests and their times: where the suite's time goes


def expressions() -> dict[str, str]:
    """Each tier's marker expression, leaving out what the tiers before it took."""
    found, before = {}, []
    for name, markers in TIERS:
        found[name] = " and ".join([f"({markers})"] + [f"not ({taken})" for taken in before])
        before.append(markers)
    return found


def run_tier(name: str, expression: str, seed: int, passed_on: list[str]) -> tuple[int, float]:
    what = "whatever the tiers above left" if name == TIERS[-1][0] else f"{dict(TIERS)[name]}, less the tiers above"
    print(f"\n=== tier {name}: {what}", flush=True)
    started = time.monotonic()
    workers = ["-n", str(WORKERS[name])] if name in WORKERS else []
    code = subprocess.call([sys.executable, "-m", "pytest", "-p", "randomly", f"--randomly-seed={seed}", *workers,
                            "-m", expression, f"--durations={SLOWEST}", *passed_on], cwd=ROOT)
    took = time.monotonic() - started
    print(f"=== tier {name}: {'passed' if code in (0, NO_TESTS) else f'FAILED (exit {code})'} in {took:.0f} s",
          flush=True)
    return code, took


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiers", default=",".join(name for name, _ in TIERS),
                        help="the tiers to run, comma-separated, in the suite's order")
    parser.add_argument("--seed", type=int, default=None, help="the random order's seed (default: a new one)")
    args, passed_on = parser.parse_known_args(argv)
    chosen = [name.strip() for name in args.tiers.split(",") if name.strip()]
    unknown = sorted(set(chosen) - {name for name, _ in TIERS})
    if unknown:
        parser.error(f"--tiers: no tier {', '.join(unknown)} (tiers: {', '.join(name for name, _ in TIERS)})")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 2**31)
    print(f"test order seed {seed} (again: python tests/suite.py --seed {seed})", flush=True)
    results = []
    for name, expression in expressions().items():
        if name in chosen:
            results.append((name, *run_tier(name, expression, seed, passed_on)))
    print(f"\n{'tier':<12}{'outcome':<22}{'time':>8}")
    for name, code, took in results:
        print(f"{name:<12}{'passed' if code in (0, NO_TESTS) else f'failed (exit {code})':<22}{took:>7.0f}s")
    total = sum(took for _, _, took in results)
    print(f"{'all':<12}{'':<22}{total:>7.0f}s   seed {seed}")
    return 0 if all(code in (0, NO_TESTS) for _, code, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
