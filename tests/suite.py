"""The whole suite in tiers, as CI runs it, each in an order of its own that a seed fixes.

    python tests/suite.py [--tiers unit,fast,...] [--seed N] [pytest arguments]

The tiers run cheapest first, so a mistake in pure logic shows in seconds rather than after the
TensorFlow runs: ``unit`` (pure logic), ``fast`` (real processes, quick), ``processes`` (slow
real-process tests: many tasks, restarts, terminals), ``ssh`` (namespaced hosts and a real sshd),
``slurm`` (a real slurmctld and slurmd nodes), ``tensorflow`` (real TensorFlow runs) and ``rest``
(whatever no tier above took, so no test is ever left out). A test belongs to the first tier whose
markers it has.

Every tier runs in random order (pytest-randomly) with one seed, printed first and given again
with ``--seed`` to replay the same order: a test that passes only after another fails here. Some
tiers run their tests in parallel worker processes (pytest-xdist, :data:`WORKERS`): there the seed
fixes the order the tests are handed out in, not which worker runs each. The tiers of one stage
(:data:`STAGES`) run at the same time, each in a pytest process of its own, its output shown whole
when it ends. A tier in workers or beside another runs its tests marked ``alone`` (they measure
CPU shares or time what they start) after the rest, one at a time, with nothing beside them.
Each tier's time and outcome are printed as it ends (after its slowest tests) and again in a
table at the end, with the suite's whole time. The exit code is 0 when every tier passed (a tier
with no test passes), else 1.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tiers import ALONE_EXPRESSION, ALONE_FILE

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
# Tiers whose tests run in parallel worker processes (pytest-xdist), and how many. Their tests
# mostly wait for the runs they start: on two cores, four workers took the fast tier from 283 s to
# 120 s and the processes tier from 218 s to 128 s; two took the TensorFlow tests that need not run
# alone from about 1,660 s to 1,156 s.
WORKERS = {"unit": 2, "fast": 4, "processes": 4, "tensorflow": 2}
# The tiers of one stage run at the same time, each in a pytest process of its own whose output is
# shown whole when it ends. The ssh and Slurm tiers share nothing: each session brings up its own
# namespaced hosts or Slurm cluster under a random prefix and subnet, and their tests mostly wait
# for the network and the scheduler.
STAGES = (("unit",), ("fast",), ("processes",), ("ssh", "slurm"), ("tensorflow",), ("rest",))
# A test that measures CPU shares or times what it starts against a bound: in a tier that runs in
# workers or beside another tier, such tests run after it, one at a time, with nothing beside them.
ALONE = "alone"
NO_TESTS = 5  # pytest's exit code when no test was selected
SLOWEST = 10  # each tier ends with its slowest tests and their times: where the suite's time goes


def expressions() -> dict[str, str]:
    """Each tier's marker expression, leaving out what the tiers before it took."""
    found, before = {}, []
    for name, markers in TIERS:
        found[name] = " and ".join([f"({markers})"] + [f"not ({taken})" for taken in before])
        before.append(markers)
    return found


def passed(code: int) -> bool:
    return code in (0, NO_TESTS)


def parts(stage: tuple[str, ...]) -> list[tuple[str, str, str | None]]:
    """The pytest runs of one stage's tiers, as (tier, marker expression, the expression of its tests
    that run alone afterwards, or None): a tier in workers or beside another tier runs those after."""
    found = []
    for name in stage:
        expression = expressions()[name]
        if len(stage) > 1 or name in WORKERS:
            found.append((name, f"{expression} and not {ALONE}", f"{expression} and {ALONE}"))
        else:
            found.append((name, expression, None))
    return found


class TierRun:
    """One pytest run of a tier's tests, its output to this terminal or held until it ends. ``alone``
    is the expression of the tier's tests that it leaves out, to run alone after it: their ids are
    in :attr:`left_alone` once it ended."""

    def __init__(self, name: str, selection: list[str], seed: int, passed_on: list[str], *, held: bool = False,
                 workers: int = 0, alone: str | None = None, by_itself: bool = False):
        self.name, self.by_itself = name, by_itself
        what = "whatever the tiers above left" if name == TIERS[-1][0] else f"{dict(TIERS)[name]}, less the tiers above"
        self.heading = f"=== tier {name}: {'its tests that run alone' if by_itself else what}"
        self.output = tempfile.TemporaryFile() if held else None
        if not held:
            print(f"\n{self.heading}", flush=True)
        env = dict(os.environ)
        self.alone_file = None
        if alone is not None:
            handle, self.alone_file = tempfile.mkstemp(prefix="tflaunch-suite-alone-")
            os.close(handle)
            env.update({ALONE_FILE: self.alone_file, ALONE_EXPRESSION: alone})
        self.started = time.monotonic()
        in_workers = ["-n", str(workers)] if workers else []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-p", "randomly", f"--randomly-seed={seed}", *in_workers, *selection,
             f"--durations={SLOWEST}", *passed_on], cwd=ROOT, env=env, stdout=self.output,
            stderr=subprocess.STDOUT if held else None)
        self.took = 0.0
        self.left_alone: list[str] = []

    def wait(self) -> int:
        code = self.process.wait()
        self.took = time.monotonic() - self.started
        if self.output is not None:
            self.output.seek(0)
            print(f"\n{self.heading}", flush=True)
            sys.stdout.buffer.write(self.output.read())
            sys.stdout.flush()
            self.output.close()
        if self.alone_file is not None:
            self.left_alone = Path(self.alone_file).read_text().split()
            os.unlink(self.alone_file)
        outcome = "passed" if passed(code) else f"FAILED (exit {code})"
        print(f"=== tier {self.name}{' (alone)' if self.by_itself else ''}: {outcome} in {self.took:.0f} s", flush=True)
        return code


def run_stage(stage: tuple[str, ...], seed: int, passed_on: list[str]) -> list[tuple[str, int, float]]:
    """Run one stage's tiers at the same time, then the tests of each that run alone, one tier after
    the other; returns (tier, exit code, time) for each tier, its two parts added up."""
    runs = [TierRun(name, ["-m", expression], seed, passed_on, held=len(stage) > 1, workers=WORKERS.get(name, 0),
                    alone=alone) for name, expression, alone in parts(stage)]
    results = {run.name: (run.wait(), run.took) for run in runs}
    for run in runs:
        if run.left_alone:
            by_itself = TierRun(run.name, run.left_alone, seed, passed_on, by_itself=True)
            code, took = results[run.name]
            alone_code = by_itself.wait()
            results[run.name] = (code if not passed(code) else alone_code if not passed(alone_code) else 0,
                                 took + by_itself.took)
    return [(name, *results[name]) for name in stage]


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
    started = time.monotonic()
    results = []
    for stage in STAGES:
        tiers = tuple(name for name in stage if name in chosen)
        if tiers:
            results += run_stage(tiers, seed, passed_on)
    print(f"\n{'tier':<12}{'outcome':<22}{'time':>8}")
    for name, code, took in results:
        print(f"{name:<12}{'passed' if passed(code) else f'failed (exit {code})':<22}{took:>7.0f}s")
    print(f"{'all':<12}{'':<22}{time.monotonic() - started:>7.0f}s   seed {seed} (tiers of one stage overlap)")
    return 0 if all(passed(code) for _, code, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
