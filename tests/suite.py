"""The whole suite in tiers, as CI runs it, each in an order of its own that a seed fixes.

    python tests/suite.py [--tiers unit,fast,...] [--seed N] [pytest arguments]

The tiers run cheapest first, so a mistake in pure logic shows in seconds rather than after the
TensorFlow runs: ``unit`` (pure logic), ``project`` (checks of the source tree), ``fast`` (real
processes, quick), ``processes`` (slow real-process tests: many tasks, restarts, terminals),
``ssh`` (namespaced hosts and a real sshd), ``slurm`` (a real slurmctld and slurmd nodes),
``ray`` (a real Ray cluster of several nodes on this machine), ``tensorflow`` (real TensorFlow runs) and ``rest`` (whatever no tier above took, so no test is
ever left out). A test belongs to the first tier whose
markers it has.

Every tier runs in random order (pytest-randomly) with one seed, printed first and given again
with ``--seed`` to replay the same order: a test that passes only after another fails here. Some
tiers run their tests in parallel worker processes (pytest-xdist, :data:`WORKERS`): there the seed
fixes the order the tests are handed out in, not which worker runs each. The tiers of one stage
(:data:`STAGES`) run at the same time, each in a pytest process of its own, its output shown whole
when it ends; the tiers in :data:`BESIDE` start once the unit tier ended and run beside every stage after it.
The tests marked ``alone`` (they measure CPU shares or time what they start, busy) of every tier wait
in one queue and run after every tier ended, one at a time, with nothing beside them. Those marked
``favoured`` (they time what they start, and use a fraction of a core) wait in another queue, which
runs one at a time beside the stages from the end of the first, in a CPU cgroup that puts them before
everything else the suite runs (:class:`Favoured`, cgroup v1's ``cpu`` controller, as root); where
this process can make none, they join the queue of tests that run alone.
Each tier's time and outcome are printed as it ends (after its slowest tests), then the
:data:`SLOWEST` slowest tests of the whole suite and the as many that used the most CPU (each with its
time and CPU, ``tests/costs.py``), and a table with the suite's whole time. The exit
code is 0 when every tier passed (a tier with no test passes), else 1.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import NamedTuple

from cgroups import move_out
from costs import PROPERTY as CPU_PROPERTY
from tiers import HEAVY_MARKERS

ROOT = Path(__file__).resolve().parents[1]
# (name, markers): a test runs in the first tier whose expression it matches.
TIERS = (
    ("unit", "unit"),
    ("project", "project"),
    ("fast", " and ".join(f"not {name}" for name in HEAVY_MARKERS)),
    ("processes", "not ssh and not slurm and not ray and not tensorflow"),
    ("ssh", "ssh and not slurm and not tensorflow"),
    ("slurm", "slurm and not tensorflow"),
    ("ray", "ray and not tensorflow"),
    ("tensorflow", "tensorflow"),
    ("rest", "not nothing"),
)
# Tiers whose tests run in parallel worker processes (pytest-xdist), and how many. Their tests
# mostly wait for the runs they start: on two cores, four workers took the fast tier from 283 s to
# 120 s and the processes tier from 218 s to 128 s; two took the TensorFlow tests that need not run
# alone from about 1,660 s to 1,156 s; three took them as long (437 s against 442 and 451 s, on more
# CPU: 757 s against 712 and 732), the two cores being busy already. Each ssh and Slurm worker brings
# up test hosts or clusters of its own. The ssh tier's 81 tests wait for logins more than they
# compute: beside the processes tier, three workers took it 192 s where two took 230 s minutes later
# (99 and 95 s of CPU; 2026-12-03), while the processes tier, off the critical path, went from 149
# to 177 s.
WORKERS = {"unit": 2, "fast": 4, "processes": 4, "ssh": 3, "slurm": 2, "tensorflow": 2}
# The tiers of one stage run at the same time, each in a pytest process of its own whose output is
# shown whole when it ends; the stages run one after the other, cheapest first. The ssh tier mostly
# waits for its hosts' sshd logins (85 s of CPU in 158 s) and runs beside the processes tier (144 s
# in 115 s) rather than after it: together they leave neither core idle. The fast tier beside them too
# took as long as it and they one after the other (312 s against 316 s), and tests that time what
# they start failed there.
STAGES = (("unit",), ("fast",), ("processes", "ssh"), ("tensorflow",), ("rest",))
# Tiers that share nothing with the others start once the first BESIDE_AFTER stages ended and run
# beside all the stages after them, off the critical path: the project tier reads the source tree;
# each of the Slurm tier's workers brings up clusters of its own (namespaced nodes under a random
# prefix and subnet) once, and its tests mostly wait for the scheduler; the Ray tier runs in one
# process, which brings up one Ray cluster per test module (its own GCS port and session), and its
# tests mostly wait for Ray. The unit tier has both cores to itself (26 s alone; 74-87 s with the
# project tier and the Slurm clusters' start beside it), so a mistake in pure logic shows in seconds.
BESIDE = ("project", "slurm", "ray")
BESIDE_AFTER = 1
# A test that measures CPU shares, or times busy tasks against a bound: every tier leaves such tests
# out, and they run in one queue after every tier ended, one at a time, with nothing beside them.
ALONE = "alone"
# A test that times what it starts, whose tasks mostly sleep or wait (stand-ins whose input sleeps,
# threads that come and go): every tier leaves such tests out, and they run in one queue, one at a
# time, beside the stages, favoured for the CPU (FAVOURED_SHARES), where there is a cgroup to favour
# them in; elsewhere with the tests that run alone.
FAVOURED = "favoured"
# cgroup v1's highest cpu.shares, against the 1,024 of each thread outside the cgroup: a test of the
# queue gets the CPU whenever it asks while a dozen threads of the other tiers want both cores
# (262,144 to 12 x 1,024: 95 %), and the other tiers use whatever it leaves. Only tests that use a
# fraction of a core go there: with every test that ran alone, busy ones included, beside the fast tier
# or the TensorFlow tier, tests there starved for seconds (a busy task seen idle, an agent's 15 s to
# start a task, a Ray cluster's start, an agent's keep-alive over Ray).
FAVOURED_SHARES = 262144
FAVOURED_PREFIX = "tflaunch-suite-"  # the cgroup's name, before the suite's pid
NO_TESTS = 5  # pytest's exit code when no test was selected
SLOWEST = 15  # each tier, and then the suite, ends with its slowest tests: where the suite's time goes


def expressions() -> dict[str, str]:
    """Each tier's marker expression, leaving out what the tiers before it took."""
    found, before = {}, []
    for name, markers in TIERS:
        found[name] = " and ".join([f"({markers})"] + [f"not ({taken})" for taken in before])
        before.append(markers)
    return found


def tier_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of each tier's pytest: this one's, with bytecode caches written.

    Some machines set PYTHONDONTWRITEBYTECODE. In a clean clone nothing of the tree has a cache then,
    so every process compiles what it imports, every time: each pytest process (a tier's, each of its
    workers') its collection of every test file, assertions rewritten (11.5 s of CPU against 2.6 s with
    the caches, measured here), and each of the suite's thousands of tflaunch runs the launcher (about
    0.25 s of CPU a run). The caches change nothing a test sees: Python writes each one whole, and
    reads it only while it matches its source."""
    env = dict(os.environ if environ is None else environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def write_caches() -> None:
    """The tree's bytecode caches, written once before the tiers start (their processes would
    otherwise each compile the same modules at once)."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", "launcher", "trainer", "tests", "benchmarks"],
                   cwd=ROOT, env=tier_environment(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


def passed(code: int) -> bool:
    return code in (0, NO_TESTS)


def parts(stage: tuple[str, ...]) -> list[tuple[str, str]]:
    """The pytest runs of one stage's tiers, as (tier, marker expression): each leaves out its tests
    that wait in the queue of tests that run alone or favoured."""
    return [(name, f"{expressions()[name]} and not {ALONE} and not {FAVOURED}") for name in stage]


def queue_expressions(chosen: list[str], favoured: bool) -> dict[str, str]:
    """The marker expressions of the queues, by name, for the tests of the chosen tiers: ``favoured``
    says whether there is a cgroup for the favoured queue, else its tests wait with those that run alone."""
    tiers = f"({' or '.join(f'({expressions()[name]})' for name, _ in TIERS if name in chosen)})"
    if not favoured:
        return {ALONE: f"({ALONE} or {FAVOURED}) and {tiers}"}
    return {FAVOURED: f"{FAVOURED} and not {ALONE} and {tiers}", ALONE: f"{ALONE} and {tiers}"}


class Favoured:
    """A cgroup under cgroup v1's CPU controller, made beside this process's own, whose processes get
    the CPU before any other of the suite's (:data:`FAVOURED_SHARES`): the favoured queue runs there,
    as if nothing ran beside it."""

    def __init__(self, mount: Path, own: str):
        self.parent = mount / own.lstrip("/")
        self.folder = self.parent / f"{FAVOURED_PREFIX}{os.getpid()}"
        for left in self.parent.glob(f"{FAVOURED_PREFIX}*"):  # of a suite killed before its end
            if not Path(f"/proc/{left.name[len(FAVOURED_PREFIX):]}").exists():
                Favoured.moved_out(left, self.parent)
        self.folder.mkdir()
        try:
            (self.folder / "cpu.shares").write_text(str(FAVOURED_SHARES))
        except OSError:
            self.folder.rmdir()
            raise

    @classmethod
    def make(cls, cgroups: str = "/proc/self/cgroup", root: Path = Path("/sys/fs/cgroup")) -> "Favoured | None":
        """One, or None where there is no v1 CPU controller this process may write to (cgroup v2 only,
        not root, a read-only /sys in a container)."""
        try:
            lines = Path(cgroups).read_text().splitlines()
        except OSError:
            return None
        for line in lines:
            parts = line.split(":", 2)
            if len(parts) == 3 and "cpu" in parts[1].split(","):
                mount = root / parts[1]
                if not (mount / "cpu.shares").exists():
                    return None
                try:
                    return cls(mount, parts[2])
                except OSError:
                    return None
        return None

    def argv(self, argv: list[str]) -> list[str]:
        """``argv`` started in the cgroup: the shell moves itself in, then execs it (same pid)."""
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.folder / "cgroup.procs"), *argv]

    def remove(self) -> None:
        """The cgroup gone, any process a test left there (a daemon) moved back beside this one's."""
        Favoured.moved_out(self.folder, self.parent)

    @staticmethod
    def moved_out(folder: Path, parent: Path) -> None:
        """``folder`` removed, the processes in it moved to ``parent``; a line when that fails."""
        try:
            move_out(folder, parent)
            folder.rmdir()
        except OSError as exc:
            print(f"the suite's cgroup {folder} could not be removed: {exc}", flush=True)


class Timed(NamedTuple):
    """One test's figures from a JUnit report: its time, its CPU (None: not reported) and where it is."""

    seconds: float
    cpu: float | None
    tier: str
    test_id: str


def timings(reports: list[tuple[str, Path]]) -> tuple[list[Timed], list[str]]:
    """Every test of the suite's JUnit reports, and a line for each report that could not be read."""
    found, unread = [], []
    for tier, path in reports:
        try:
            root = ElementTree.parse(path).getroot()
        except (OSError, ElementTree.ParseError) as exc:
            unread.append(f"tier {tier}: no test times ({path}: {exc})")
            continue
        for case in root.iter("testcase"):
            test_id = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
            cpu = next((float(p.get("value")) for p in case.iter("property") if p.get("name") == CPU_PROPERTY), None)
            found.append(Timed(float(case.get("time") or 0), cpu, tier, test_id))
    return found, unread


def slowest(found: list[Timed], count: int = SLOWEST) -> list[Timed]:
    """The ``count`` slowest tests."""
    return sorted(found, key=lambda t: t.seconds, reverse=True)[:count]


def costliest(found: list[Timed], count: int = SLOWEST) -> list[Timed]:
    """The ``count`` tests that used the most CPU."""
    return sorted([t for t in found if t.cpu is not None], key=lambda t: t.cpu, reverse=True)[:count]


def timed_line(test: Timed) -> str:
    cpu = f"{test.cpu:7.1f}s CPU" if test.cpu is not None else " " * 12
    return f"{test.seconds:8.1f}s {cpu}  {test.tier:<12}{test.test_id}"


class TierRun:
    """One pytest run of a tier's tests (or of a queue: :data:`ALONE`, :data:`FAVOURED`), its output
    to this terminal or held until it ends, in the cgroup ``favoured`` when one is given."""

    def __init__(self, name: str, selection: list[str], seed: int, passed_on: list[str], *, held: bool = False,
                 workers: int = 0, favoured: Favoured | None = None):
        self.name = name
        if name == ALONE:
            what = "the tests of every tier that run alone, one at a time"
        elif name == FAVOURED:
            what = "the tests of every tier favoured for the CPU, one at a time, beside the stages"
        elif name == TIERS[-1][0]:
            what = "whatever the tiers above left"
        else:
            what = f"{dict(TIERS)[name]}, less the tiers above"
        self.heading = f"=== tier {name}: {what}"
        self.output = tempfile.TemporaryFile() if held else None
        if not held:
            print(f"\n{self.heading}", flush=True)
        env = tier_environment()
        handle, report = tempfile.mkstemp(prefix="tflaunch-suite-junit-", suffix=".xml")
        os.close(handle)
        self.report = Path(report)
        self.started = time.monotonic()
        # loadgroup: the tests of one xdist_group (those that share one run) go to one worker.
        in_workers = ["-n", str(workers), "--dist", "loadgroup"] if workers else []
        argv = [sys.executable, "-m", "pytest", "-p", "randomly", f"--randomly-seed={seed}", *in_workers, *selection,
                f"--durations={SLOWEST}", f"--junitxml={report}", *passed_on]
        self.process = subprocess.Popen(favoured.argv(argv) if favoured else argv, cwd=ROOT, env=env,
                                        stdout=self.output, stderr=subprocess.STDOUT if held else None)
        self.took = 0.0
        self.cpu = 0.0  # CPU seconds of its pytest process and every process of it that was waited for
        # A tier beside the stages is waited for only after them: its time is stamped as it ends.
        self.ended: float | None = None
        self.exited = threading.Event()  # set once its process ended, and was reaped
        threading.Thread(target=self._stamp, name=f"tier-{name}", daemon=True).start()

    def _stamp(self) -> None:
        # wait4, not Popen.wait: its resource usage is the tier's CPU. Only this thread reaps the
        # process (wait() below waits for it), so Popen never looks for a child already reaped.
        _, status, usage = os.wait4(self.process.pid, 0)
        self.process.returncode = os.waitstatus_to_exitcode(status)
        self.cpu = usage.ru_utime + usage.ru_stime
        self.ended = time.monotonic()
        self.exited.set()

    def wait(self) -> int:
        self.exited.wait()
        code = self.process.returncode
        self.took = self.ended - self.started
        if self.output is not None:
            self.output.seek(0)
            print(f"\n{self.heading}", flush=True)
            sys.stdout.buffer.write(self.output.read())
            sys.stdout.flush()
            self.output.close()
        outcome = "passed" if passed(code) else f"FAILED (exit {code})"
        print(f"=== tier {self.name}: {outcome} in {self.took:.0f} s ({self.cpu:.0f} s of CPU)", flush=True)
        return code


def start_stage(stage: tuple[str, ...], seed: int, passed_on: list[str], held: bool) -> list[TierRun]:
    return [TierRun(name, ["-m", expression], seed, passed_on, held=held, workers=WORKERS.get(name, 0))
            for name, expression in parts(stage)]


def run_suite(chosen: list[str], seed: int, passed_on: list[str], favoured: Favoured | None = None) \
        -> tuple[list[tuple[str, int, float, float]], list[TierRun]]:
    """Every chosen tier: the stages one after the other, the tiers beside them and, in the cgroup
    ``favoured``, the favoured queue started once the first :data:`BESIDE_AFTER` stages ended, then the
    queue of tests that run alone. Returns (tier, exit code, time, CPU) per tier, the queues last, and
    the runs."""
    beside: list[TierRun] = []
    runs: list[TierRun] = []
    queues = queue_expressions(chosen, favoured is not None)
    for number, stage in enumerate(STAGES):
        if number == BESIDE_AFTER:
            beside = start_stage(tuple(name for name in BESIDE if name in chosen), seed, passed_on, held=True)
            if favoured is not None:
                beside.append(TierRun(FAVOURED, ["-m", queues[FAVOURED]], seed, passed_on, held=True,
                                      favoured=favoured))
        tiers = tuple(name for name in stage if name in chosen and name not in BESIDE)
        if tiers:
            started = start_stage(tiers, seed, passed_on, held=len(tiers) > 1)
            for run in started:
                run.wait()
            runs += started
    for run in beside:
        run.wait()
    runs += beside
    alone = TierRun(ALONE, ["-m", queues[ALONE]], seed, passed_on)
    alone.wait()
    runs.append(alone)
    results = {run.name: (run.process.returncode, run.took, run.cpu) for run in runs}
    order = [name for name, _ in TIERS] + [FAVOURED, ALONE]
    return [(name, *results[name]) for name in order if name in results], runs


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
    write_caches()
    favoured = Favoured.make()
    print(f"the {FAVOURED} tests: " + (f"beside the stages, in cgroup {favoured.folder}" if favoured else
                                      "with those that run alone, after every tier (no CPU cgroup to favour them in)"),
          flush=True)
    try:
        results, runs = run_suite(chosen, seed, passed_on, favoured)
    finally:
        if favoured is not None:
            favoured.remove()
    found, unread = timings([(run.name, run.report) for run in runs])
    print(f"\n=== the {SLOWEST} slowest tests of the suite")
    for test in slowest(found):
        print(timed_line(test))
    print(f"\n=== the {SLOWEST} tests of the suite that used the most CPU")
    for test in costliest(found):
        print(timed_line(test))
    for line in unread:
        print(line)
    for run in runs:
        run.report.unlink(missing_ok=True)
    # CPU: of each tier's pytest process and what it waited for; a daemon that left its parent (an
    # sshd of a test host, a Ray node) is not counted.
    print(f"\n{'tier':<12}{'outcome':<22}{'time':>8}{'CPU':>8}")
    for name, code, took, cpu in results:
        print(f"{name:<12}{'passed' if passed(code) else f'failed (exit {code})':<22}{took:>7.0f}s{cpu:>7.0f}s")
    print(f"{'all':<12}{'':<22}{time.monotonic() - started:>7.0f}s{sum(r[3] for r in results):>7.0f}s   seed {seed} "
          f"({', '.join(BESIDE)} and {FAVOURED} beside the other tiers; {ALONE}: after them, one test at a time)")
    return 0 if all(passed(code) for _, code, _, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
