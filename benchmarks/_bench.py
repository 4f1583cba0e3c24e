"""Shared pieces of the benchmarks: paths, timing, process sampling, cleanup and tables.

Every benchmark runs the tflaunch way and its baseline in one process, interleaving the two
sides (ABAB..., the order flipping every repetition), and reports medians. A benchmark reports;
it exits 0 unless a goal it guards (:func:`verdict` with ``guard=True``) was missed, then 1, with
a ``FAILED`` line naming each.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import psutil

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable  # the project's venv interpreter when run as documented
TFLAUNCH = str(Path(PYTHON).with_name("tflaunch"))
if not Path(TFLAUNCH).exists():
    TFLAUNCH = shutil.which("tflaunch") or TFLAUNCH

_started: list[tuple[subprocess.Popen, bool]] = []  # (process, leads its own group), killed on exit


def header(title: str, lines: Iterable[str] = (), before: str | None = None) -> None:
    """Print the benchmark's title and the machine it ran on, after :func:`compile_sources` (of this
    tree's launcher and of ``before``'s, the older launcher a benchmark may compare with)."""
    compile_sources(ROOT / "launcher", *([Path(before) / "launcher"] if before else []))
    print(f"== {title}")
    print(f"   {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}, "
          f"python {sys.version.split()[0]}, tflaunch {TFLAUNCH}")
    for line in lines:
        print(f"   {line}")
    sys.stdout.flush()


def compile_sources(*packages: Path) -> None:
    """Write the packages' bytecode caches now, as an installed package has them. An editable install
    under PYTHONDONTWRITEBYTECODE (set on some machines) never writes them, and then every tflaunch
    run would compile its modules again: 0.25 s of CPU a run here, counted as tflaunch's own."""
    for package in packages:
        subprocess.run([PYTHON, "-m", "compileall", "-q", str(package)], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False)


def note(text: str) -> None:
    print(f"   {text}", flush=True)


TESTHOSTS = ROOT / "scripts" / "testhosts"


def hosts_up(prefix: str, subnet: str, count: int) -> dict | None:
    """``count`` namespaced test hosts with sshd at stock limits (scripts/testhosts), as its JSON
    says; None, with a RESULT line saying why, when they cannot be made."""
    done = subprocess.run([str(TESTHOSTS), "up", "--no-global", "--stock-limits", "--prefix", prefix,
                           "--subnet", subnet, "--hosts", str(count)], capture_output=True, text=True)
    if done.returncode != 0:
        print(f"RESULT skipped: testhosts up failed: {done.stderr.strip()}")
        return None
    return json.loads(done.stdout)


def hosts_down(prefix: str) -> None:
    done = subprocess.run([str(TESTHOSTS), "down", "--prefix", prefix], capture_output=True, text=True)
    note(f"testhosts down: {'ok' if done.returncode == 0 else done.stderr.strip()}")


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def spread(values: Sequence[float]) -> list[float]:
    """Median, min and max of a side's timings (NaN when it has none), for a table row."""
    nan = float("nan")
    return [median(values), min(values, default=nan), max(values, default=nan)]


def sides_table(results: dict[str, list[dict]], labels: dict[str, str], column: str,
                figure: Callable[[list[dict]], object]) -> None:
    """One row per side of a benchmark (labels: side -> its words, in order): the runs that exited 0
    and the spread of their wall times, then ``column``, ``figure`` of those runs."""
    rows = []
    for side, label in labels.items():
        ok = [r for r in results[side] if r["rc"] == 0]
        rows.append([label, len(ok), *spread([r["wall"] for r in ok]), figure(ok)])
    print()
    table(["side", "ok runs", "median s", "min s", "max s", column], rows)


def table(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """A plain fixed-width table; the first column is left-aligned, the rest right-aligned."""
    cells = [[str(c) for c in columns]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    for n, row in enumerate(cells):
        print("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
        if n == 0:
            print("  " + "  ".join("-" * w for w in widths))
    sys.stdout.flush()


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


_missed: list[str] = []  # the guarded goals missed so far: main_guard exits 1 when there are any


def verdict(name: str, value: float, target: float, unit: str = "", guard: bool = False) -> None:
    """The line each benchmark ends with: the measured ratio (or figure) against its target.
    ``guard``: a goal the project holds, whose miss makes the benchmark exit 1 (:func:`main_guard`)."""
    status = "within target" if value <= target else "OVER TARGET"
    print(f"RESULT {name}: {value:.3f}{unit} (target <= {target:g}{unit}): {status}", flush=True)
    if guard and not value <= target:  # NaN (nothing measured) misses too
        _missed.append(f"{name}: {value:.3f}{unit}, over its goal of {target:g}{unit}")


def ratio_interval(numerator: Sequence[float], denominator: Sequence[float], level: float = 0.9,
                   draws: int = 4000) -> tuple[float, float]:
    """The ``level`` bootstrap interval of median(numerator) / median(denominator): each side's runs
    resampled with replacement, ``draws`` times, with a fixed seed (the same runs give the same
    interval). On a shared machine a ratio whose interval holds its target is not told apart from
    it by this many runs."""
    if not numerator or not denominator:
        return float("nan"), float("nan")
    pick = random.Random(0).choices
    ratios = sorted(statistics.median(pick(numerator, k=len(numerator)))
                    / statistics.median(pick(denominator, k=len(denominator))) for _ in range(draws))
    low = ratios[int((1 - level) / 2 * draws)]
    high = ratios[min(draws - 1, int((1 + level) / 2 * draws))]
    return low, high


def interval_note(numerator: Sequence[float], denominator: Sequence[float]) -> None:
    """One line: the ratio's 90 % bootstrap interval (:func:`ratio_interval`), under its RESULT."""
    low, high = ratio_interval(numerator, denominator)
    note(f"90 % bootstrap interval of that ratio over these runs: {low:.3f} to {high:.3f}")


def interleaved(reps: int, sides: Sequence[str]) -> Iterator[tuple[int, str]]:
    """(repetition, side) pairs, the order of the sides reversed every other repetition."""
    for rep in range(reps):
        order = list(sides) if rep % 2 == 0 else list(reversed(sides))
        for side in order:
            yield rep, side


def free_ports(count: int) -> list[int]:
    """Ports the kernel hands out as free right now (held together so they differ)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@contextlib.contextmanager
def workdir(prefix: str, parent: Path | None = None) -> Iterator[Path]:
    """A fresh folder for one benchmark (in ``parent``, else the system's temporary folder),
    removed with everything in it at the end."""
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f"tflaunch-bench-{prefix}-", dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


TESTSLURM = ROOT / "scripts" / "testslurm"


@contextlib.contextmanager
def test_slurm(prefix: str, subnet: str, state_dir: Path, *options: str,
               timeout: float = 120) -> Iterator[dict[str, str] | None]:
    """A test Slurm cluster (``scripts/testslurm up``, slurmctld here and slurmd nodes in network
    namespaces; ``options`` such as ``--nodes 8``) for the length of the block, taken down after it
    whatever happens. Yields the environment that reaches it (``SLURM_CONF``, and ``PYTHONPATH`` for
    tflaunch from this tree), or None after a note saying why it did not come up."""
    up = subprocess.run([str(TESTSLURM), "up", "--prefix", prefix, "--subnet", subnet, "--port",
                         str(random.randint(18000, 19900)), *options, "--state-dir", str(state_dir)],
                        capture_output=True, text=True, timeout=timeout)
    if up.returncode != 0:
        note(f"testslurm up{''.join(' ' + o for o in options)} failed: {up.stderr.strip()}")
        yield None
        return
    try:
        yield {**os.environ, "SLURM_CONF": json.loads(up.stdout)["slurm_conf"], "PYTHONPATH": str(ROOT)}
    finally:
        subprocess.run([str(TESTSLURM), "down", "--prefix", prefix, "--state-dir", str(state_dir)],
                       capture_output=True, timeout=120)


def launcher_env(source: str | None) -> dict[str, str] | None:
    """The environment in which tflaunch runs the launcher package found in ``source`` (a folder
    from ``git archive COMMIT launcher | tar -x -C DIR``: an older tree, for a before/after run);
    None, the inherited one, without it."""
    return {**os.environ, "PYTHONPATH": source} if source else None


def popen(argv: Sequence[str], **kwargs) -> subprocess.Popen:
    """Popen in a new session, remembered so that :func:`cleanup` can kill its whole group."""
    kwargs.setdefault("stdin", subprocess.DEVNULL)
    kwargs.setdefault("start_new_session", True)
    proc = subprocess.Popen(list(argv), **kwargs)
    _started.append((proc, bool(kwargs["start_new_session"])))
    return proc


def cleanup(grace: float = 10.0) -> None:
    """Stop every process (and its group) this benchmark started and has not reaped yet.

    SIGTERM first, so that a tflaunch still running stops its own tasks (they run in sessions of
    their own, out of reach of its group), then SIGKILL after ``grace`` seconds. A reaped process's
    id may already belong to someone else, so only unreaped ones (running, or zombies still
    holding their id) are signalled.
    """
    live = [(proc, own_group) for proc, own_group in _started if proc.returncode is None]
    _started.clear()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc, own_group in live:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if own_group:
                    os.killpg(proc.pid, sig)
                else:
                    proc.send_signal(sig)
        deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 5.0)
        for proc, _ in live:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        live = [(proc, own_group) for proc, own_group in live if proc.returncode is None]
        if not live:
            return


def main_guard(main: Callable[[], None]) -> None:
    """Run ``main``; whatever happens, clean up; exit 0, or 1 with one ``FAILED`` line per goal
    that a guarded :func:`verdict` found missed."""
    def on_term(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        main()
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    except Exception as exc:  # report the problem, still exit 0
        import traceback

        traceback.print_exc()
        print(f"RESULT benchmark error: {exc}", flush=True)
    finally:
        cleanup()
    for missed in _missed:
        print(f"FAILED {missed}", flush=True)
    sys.exit(1 if _missed else 0)


@dataclass
class Sample:
    """What a sampler saw of one process: peak RSS and its last CPU times (own and reaped children)."""

    peak_rss: int = 0
    cpu_self: float = 0.0  # user + system of the process itself, last reading before it exited
    cpu_children: float = 0.0  # user + system of children it had reaped by then
    threads: dict[str, float] = field(default_factory=dict)  # thread id -> cpu seconds (last reading)
    samples: int = 0


class Sampler:
    """Polls one process with psutil on a background thread until stopped."""

    def __init__(self, pid: int, interval: float = 0.02, per_thread: bool = False):
        self.pid = pid
        self.interval = interval
        self.per_thread = per_thread
        self.result = Sample()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        try:
            proc = psutil.Process(self.pid)
        except psutil.Error:
            return
        while not self._stop.is_set():
            try:
                with proc.oneshot():
                    rss = proc.memory_info().rss
                    times = proc.cpu_times()
                    threads = proc.threads() if self.per_thread else []
                if proc.status() == psutil.STATUS_ZOMBIE:
                    return
            except psutil.Error:
                return
            r = self.result
            r.peak_rss = max(r.peak_rss, rss)
            r.cpu_self = times.user + times.system
            r.cpu_children = times.children_user + times.children_system
            for t in threads:
                r.threads[str(t.id)] = t.user_time + t.system_time
            r.samples += 1
            self._stop.wait(self.interval)


def wait4(proc: subprocess.Popen) -> tuple[int, float, "os.struct_rusage"]:
    """Wait for ``proc`` with wait4: (returncode, time.time() at exit, its rusage incl. reaped children)."""
    _, status, usage = os.wait4(proc.pid, 0)
    ended = time.time()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, ended, usage


def testhosts_missing() -> str | None:
    """Why namespaced test hosts cannot be brought up here (root, ip, ssh, nsenter, sshd), or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and sshd)"
    missing = [tool for tool in ("ip", "ssh", "nsenter") if not shutil.which(tool)] + \
              ([] if Path("/usr/sbin/sshd").exists() else ["/usr/sbin/sshd"])
    return f"missing {', '.join(missing)}" if missing else None


def last_run_dir(log_dir: Path) -> Path | None:
    runs = sorted(p for p in Path(log_dir).glob("*") if p.is_dir())
    return runs[-1] if runs else None


def read_manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


@dataclass
class PlannedTask:
    name: str
    argv: list[str]
    env: dict[str, str]  # only what tflaunch adds to the inherited environment
    workdir: str


def dry_run(args: Sequence[str], cwd: Path) -> list[PlannedTask]:
    """Each task's command and added env, as ``tflaunch ... --dry-run`` prints them."""
    import shlex

    args = list(args)
    cut = args.index("--") if "--" in args else len(args)
    argv = [TFLAUNCH, *args[:cut], "--dry-run", *args[cut:]]
    out = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=True).stdout
    tasks: list[PlannedTask] = []
    for line in out.splitlines():
        if not line.startswith(" ") and ": host " in line:
            tasks.append(PlannedTask(line.split(":", 1)[0], [], {}, ""))
        elif line.startswith("  command: "):
            tasks[-1].argv = shlex.split(line[len("  command: "):])
        elif line.startswith("  workdir: "):
            tasks[-1].workdir = line[len("  workdir: "):]
        elif line.startswith("  env: "):
            key, _, value = line[len("  env: "):].partition("=")
            if value.endswith(")") and "  (" in value:  # the layer the value came from, after the quoted value
                value = value[:value.rindex("  (")]
            tasks[-1].env[key] = shlex.split(value)[0] if value else ""
    return tasks
