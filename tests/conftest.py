"""Shared fixtures: running the real tflaunch command and reading its run folders."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
HELPERS = ROOT / "tests" / "helpers"
TASK = str(HELPERS / "task.py")
LOCKSTEP = str(ROOT / "tests" / "workers" / "lockstep.py")  # the stand-in for a TensorFlow task

from testhosts_fixture import testhosts  # noqa: E402,F401  (fixture re-exported for ssh tests)
from testslurm_fixture import slurm, slurm3, testslurm, testslurm3  # noqa: E402,F401  (the Slurm tests' fixtures)
from testray_fixture import raycluster  # noqa: E402,F401  (the Ray tests' cluster)

pytest_plugins = ["tiers", "groups", "costs"]  # the unit tier's rules; xdist groups that hold; each test's CPU in its report; every test leaves cwd, env and signal handlers as found


def env_lines_of(text: str) -> list[dict]:
    """The JSON records ``tests/helpers/task.py env`` printed."""
    return [json.loads(line[4:]) for line in text.splitlines() if line.startswith("ENV ")]


@dataclass
class Finished:
    """A finished tflaunch invocation and the run folder it left."""

    returncode: int
    stdout: str
    stderr: str
    run_dir: Path | None

    @property
    def record(self) -> dict:
        return json.loads((self.run_dir / "run.json").read_text())

    def task_output(self, name: str) -> str:
        return (self.run_dir / f"{name}.log").read_text(errors="replace")

    @property
    def merged(self) -> bytes:
        return (self.run_dir / "merged.log").read_bytes()


class Tflaunch:
    """Runs ``python -m launcher`` as a real subprocess with its own log dir."""

    def __init__(self, log_dir: Path, cwd: Path, no_tensorflow: bool = False):
        self.log_dir = log_dir
        self.cwd = cwd
        self._started: list[subprocess.Popen] = []
        from tiers import NO_TENSORFLOW  # the plugin pytest loads: imported once pytest has

        # The tasks of a test not marked tensorflow cannot import it (tests/tiers.py).
        self._path = [str(NO_TENSORFLOW)] * no_tensorflow + [str(ROOT)]

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "launcher", *args]

    def env(self, extra: dict | None = None) -> dict:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(self._path)}
        env.update(extra or {})
        return env

    def start(self, *args: str, **kwargs) -> subprocess.Popen:
        proc = subprocess.Popen(self.argv(*self._with_log_dir(args)), cwd=self.cwd, env=self.env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
        self._started.append(proc)
        return proc

    def run(self, *args: str, timeout: float = 120, env: dict | None = None) -> Finished:
        proc = subprocess.Popen(self.argv(*self._with_log_dir(args)), cwd=self.cwd, env=self.env(env),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self._started.append(proc)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            # Interrupt rather than kill, so tflaunch stops its tasks and none outlives the test.
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=60)
            raise AssertionError(f"tflaunch did not finish within {timeout} s:\n{err[-3000:]}") from None
        return Finished(proc.returncode, out, err, self.latest_run())

    def stop_leftovers(self) -> None:
        """Interrupt any tflaunch this test started and left running (a failed assertion or the
        per-test timeout cut it short), so that its tasks do not outlive the test."""
        for proc in self._started:
            interrupt(proc)

    def latest_run(self) -> Path | None:
        """The run folder made last (run ids sort by second only; creation time breaks ties)."""
        runs = [p for p in self.log_dir.glob("*") if p.is_dir()] if self.log_dir.exists() else []
        return max(runs, key=lambda p: (p.name[:15], p.stat().st_ctime_ns)) if runs else None

    def merged_text(self) -> str:
        """The latest run's merged log so far ("" before there is one), for waiting on a live run."""
        run_dir = self.latest_run()
        merged = run_dir / "merged.log" if run_dir else None
        return merged.read_text(errors="replace") if merged and merged.exists() else ""

    def live_tasks(self, timeout: float = 30) -> list[dict]:
        """The latest run's tasks from run.json once each has its pid: the record follows the tasks a
        moment behind their output, so a test that saw a task's line may not find its pid yet."""
        from polling import wait_for

        def tasks() -> list[dict] | None:
            record = self.latest_run() / "run.json"
            found = json.loads(record.read_text())["tasks"] if record.exists() else []
            return found if found and all(t["pid"] for t in found) else None

        return wait_for(tasks, timeout=timeout, message="every task's pid in run.json")

    def _with_log_dir(self, args: tuple[str, ...]) -> list[str]:
        args = list(args)
        if args and args[0] in ("runs", "logs", "status", "report", "compare", "check"):
            return args if args[0] == "check" else [*args, "--log-dir", str(self.log_dir)]
        cut = args.index("--") if "--" in args else len(args)
        return [*args[:cut], "--log-dir", str(self.log_dir), *args[cut:]]


def interrupt(proc: subprocess.Popen) -> None:
    """Stop a tflaunch still running as Ctrl-C does, so that it stops its tasks; SIGKILL after 60 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


@pytest.fixture
def folder_for_others() -> Iterator[Callable[[int], Path]]:
    """Makes folders under /tmp with the mode asked for, which another user (setpriv) can reach as it
    cannot reach tmp_path, whose parents are private to root; they are removed after the test."""
    made: list[Path] = []

    def make(mode: int) -> Path:
        made.append(Path(tempfile.mkdtemp(prefix="tflaunch-shared-", dir="/tmp")))
        made[-1].chmod(mode)
        return made[-1]

    yield make
    for path in made:
        shutil.rmtree(path, ignore_errors=True)


# The tests that read a run of the default job share one (xdist_group keeps them in one worker).
DEFAULT_LOCAL_TWO = "default_local_two"
# The tests that make or edit files of this machine's (/etc/hosts, ~/.ssh), and those that compare them
# before and after: one at a time, in one worker.
MACHINE_FILES = "machine-files"


class DefaultRun(NamedTuple):
    """The shared run of the default job: the finished run, a Tflaunch whose log folder holds it (its
    ``cwd`` holds ``model``, the saved model, and ``tmp``, the tasks' TMPDIR) and its wall-clock seconds."""

    done: Finished
    tflaunch: Tflaunch
    seconds: float


@pytest.fixture(scope="session")
def default_local_two(tmp_path_factory) -> DefaultRun:
    """One ``tflaunch --local 2`` of the built-in trainer with its default training options (two
    MultiWorkerMirroredStrategy workers, as the default job), the chief saving its model, for the
    tests that read such a run."""
    path = tmp_path_factory.mktemp(DEFAULT_LOCAL_TWO)
    (path / "tmp").mkdir()
    launcher = Tflaunch(path / "logs", path)
    started = time.monotonic()
    done = launcher.run("--local", "2", "--", "python", "-m", "trainer", "--model-dir", str(path / "model"),
                        timeout=240, env={"TMPDIR": str(path / "tmp")})  # about 30 s here
    return DefaultRun(done, launcher, time.monotonic() - started)


@pytest.fixture
def tflaunch(tmp_path: Path, request: pytest.FixtureRequest):
    from tiers import tensorflow_free

    launcher = Tflaunch(tmp_path / "logs", tmp_path, no_tensorflow=tensorflow_free(request.node))
    yield launcher
    launcher.stop_leftovers()


def processes_where(match: Callable[[psutil.Process], bool]) -> list[psutil.Process]:
    """Living processes (not zombies) that ``match`` (given each process, with its ``cmdline`` and
    ``status`` in ``info``); one that ends or hides meanwhile is passed over."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and match(proc):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


def descendants_alive(marker: str) -> list[psutil.Process]:
    """Living processes (not zombies) whose command line contains ``marker`` (a per-test unique string)."""
    return processes_where(lambda proc: any(marker in part for part in proc.info["cmdline"] or []))


def processes_of_run(run_id: str) -> list[psutil.Process]:
    """Living processes (not zombies) whose environment names run ``run_id``: its tasks and what they
    started, wherever they run on this machine (never another test's run, whatever its command)."""
    return processes_where(lambda proc: proc.environ().get("TFLAUNCH_RUN_ID") == run_id)


def marked(marker: str) -> list[int]:
    """Living processes (not zombies) with ``marker`` as an argument."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if marker in (proc.info["cmdline"] or []) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except psutil.NoSuchProcess:
            pass
    return found


@pytest.fixture
def procs():
    """Start processes each in a session of its own (``procs(argv, **popen_kwargs)``); every group
    is killed and every process reaped when the test ends."""
    started: list[subprocess.Popen] = []

    def start(argv, **kwargs) -> subprocess.Popen:
        started.append(subprocess.Popen(argv, start_new_session=True, **kwargs))
        return started[-1]

    yield start
    for proc in started:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
