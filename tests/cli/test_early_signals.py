"""A signal at any moment of tflaunch's start ends it quietly with 128+N and leaves nothing behind.

Tried the way a user meets it: tflaunch started in a process group of its own, as a terminal
starts a job, and SIGINT, SIGTERM, SIGHUP or SIGQUIT sent to that group at moments through its
first 150 ms, through the installed console script and through ``python -m launcher``. By then a
run has begun, so the moments cover Python's own start, the imports, the options, the run folder
and the first tasks.

A signal that lands while Python itself is still starting, before any of tflaunch's code runs, is
outside tflaunch's reach (docs/signals.md). To tell those runs apart, ``tests/helpers/startwatch``
(loaded through PYTHONPATH) writes one line at the first thing the process does after tflaunch's
own code began, saying whether tflaunch's handlers were in place by then. Every run must say they
were; a run whose line was written before the test sent its signal must exit 128+N with no
traceback; and no run, early or late, may leave a process or a run folder that claims to be running.
When Python itself drops an early signal and tflaunch starts anyway, the test signals again, as a
user would, and judges that second signal.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from conftest import ROOT

WATCH = ROOT / "tests" / "helpers" / "startwatch"
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
MOMENTS_MS = range(0, 151, 10)
CONSOLE_SCRIPT = Path(sys.executable).with_name("tflaunch")
ENTRIES = {
    "console script": [str(CONSOLE_SCRIPT)],
    "python -m launcher": [sys.executable, "-m", "launcher"],
}
AFTER_START = None  # a moment of its own: as soon as the watch line says tflaunch's code has begun


@dataclass
class Outcome:
    entry: str
    signum: int
    moment: str
    returncode: int | None
    stderr: str
    watch: str  # the start watch's line, "" when tflaunch's code never began
    after_start: bool  # the watch line was there before the (last) signal was sent
    sent_again: bool  # Python dropped the first signal while it started, and the test sent a second
    earlier: str  # stderr before the second signal: Python's own report of the dropped one
    leftovers: list[str]
    running_folders: list[str]

    def problems(self) -> list[str]:
        found = []
        if self.watch == "handlers default":
            found.append("tflaunch's first statements did not take over the signals")
        if self.after_start:
            if self.returncode != 128 + self.signum:
                found.append(f"exit {self.returncode}, expected {128 + self.signum}")
            if "Traceback" in self.stderr:
                found.append("a traceback")
        if self.leftovers:
            found.append(f"left running: {self.leftovers}")
        if self.running_folders:
            found.append(f"run folders still claiming to run: {self.running_folders}")
        return found

    def describe(self) -> str:
        name = signal.Signals(self.signum).name
        when = "after the start" if self.after_start else "possibly before tflaunch's code"
        when += ", sent again" if self.sent_again else ""
        return (f"{self.entry}, {name} at {self.moment} ({when}, watch {self.watch or 'silent'}): "
                f"{'; '.join(self.problems())}\n    stderr tail: {self.stderr[-600:]!r}"
                + (f"\n    before the second signal: {self.earlier[-300:]!r}" if self.sent_again else ""))


@contextlib.contextmanager
def terminal_dispositions():
    """Children start with the watched signals at their defaults, as from a terminal.

    A test run in the background (or under nohup) inherits some of them ignored, and an ignored
    disposition survives exec: Python would then never see an early SIGINT. A Python handler in
    this process becomes the default again in the child at exec.
    """
    previous = {}
    for signum in SIGNALS:
        if signal.getsignal(signum) == signal.SIG_IGN:
            previous[signum] = signal.signal(signum, lambda *_: None)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def marked_processes(marker: str) -> list[psutil.Process]:
    """Living processes (not zombies) whose environment carries ``marker``: tflaunch's whole family."""
    found = []
    for proc in psutil.process_iter(["environ", "status"]):
        environ = proc.info["environ"] or {}
        if environ.get("EARLY_SIGNALS_MARK") == marker and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


def leftovers_of(marker: str) -> list[str]:
    """What of tflaunch's family still runs once the kernel has had time to tear it down."""
    deadline = time.monotonic() + 10
    while True:
        alive = marked_processes(marker)
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    described = []
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            described.append(f"{proc.pid} {' '.join(proc.cmdline())[:80]}")
            proc.kill()  # ours (it carries this run's marker): the next runs must not inherit it
    return described


def running_folders(log_dir: Path) -> list[str]:
    claims = []
    for record in log_dir.glob("*/run.json"):
        try:
            status = json.loads(record.read_text()).get("status")
        except (OSError, ValueError):
            continue  # a record being replaced, or none: it claims nothing
        if status == "running":
            claims.append(record.parent.name)
    return claims


def read_watch(fd: int) -> str:
    try:
        return os.read(fd, 100).decode().strip()
    except BlockingIOError:
        return ""


def signal_once(entry: str, signum: int, moment_ms: float | None, where: Path) -> Outcome:
    """Start tflaunch, signal its process group at ``moment_ms`` (or right after its code began)."""
    marker = uuid.uuid4().hex
    log_dir = where / "logs"
    watch_read, watch_write = os.pipe()
    os.set_blocking(watch_read, False)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(WATCH), str(ROOT)]),
           "STARTWATCH_FD": str(watch_write), "STARTWATCH_PARENT": str(os.getpid()),
           "EARLY_SIGNALS_MARK": marker}
    argv = [*ENTRIES[entry], "--local", "2", "--log-dir", str(log_dir), "--", "sleep", "600"]
    where.mkdir()
    start = time.monotonic()
    proc = subprocess.Popen(argv, cwd=where, env=env, pass_fds=(watch_write,), process_group=0,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    os.close(watch_write)
    earlier = b""  # what tflaunch wrote before a second signal, when the test had to send one
    try:
        if moment_ms is None:
            select.select([watch_read], [], [], 60)
        else:
            time.sleep(max(0.0, start + moment_ms / 1000 - time.monotonic()))
        watch = read_watch(watch_read)  # read before the signal: a line here means the signal came after
        after_start = bool(watch)
        os.killpg(proc.pid, signum)
        sent_again = not after_start and not ended(proc, 10)
        if sent_again:
            # Python may drop a SIGINT that comes while it starts (it raises KeyboardInterrupt in
            # an import's callback, prints "Exception ignored" and goes on), and tflaunch then
            # starts as if nothing had happened. A user presses Ctrl-C again; so does the test,
            # once tflaunch's code runs, and that signal must end it.
            select.select([watch_read], [], [], 60)
            watch, after_start = read_watch(watch_read), True
            earlier = drain(proc.stderr.fileno())
            os.killpg(proc.pid, signum)
        try:
            _, stderr = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            _, stderr = proc.communicate()
            stderr += b"\n[the test killed tflaunch: it had not ended 60 s after the signal]"
        watch = watch or read_watch(watch_read)
    finally:
        os.close(watch_read)
    return Outcome(entry, signum, "after the start" if moment_ms is None else f"{moment_ms} ms",
                   proc.returncode, stderr.decode(errors="replace"), watch, after_start, sent_again,
                   earlier.decode(errors="replace"), leftovers_of(marker), running_folders(log_dir))


def ended(proc: subprocess.Popen, seconds: float) -> bool:
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        return False
    return True


def drain(fd: int) -> bytes:
    """What a pipe holds now, without waiting for more."""
    os.set_blocking(fd, False)
    chunks = []
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    os.set_blocking(fd, True)
    return b"".join(chunks)


@pytest.mark.slow
@pytest.mark.parametrize("entry", list(ENTRIES))
def test_signal_through_the_start_ends_quietly(entry, tmp_path):
    if entry == "console script" and not CONSOLE_SCRIPT.exists():
        pytest.skip(f"no console script at {CONSOLE_SCRIPT} (install the project: pip install -e .)")
    outcomes = []
    with terminal_dispositions():
        for index, signum in enumerate(SIGNALS):
            # Each signal's series is shifted by a quarter of the step, so the four cover the step between them.
            offsets = [moment + index * 2.5 for moment in MOMENTS_MS]
            for number, moment in enumerate([*offsets, AFTER_START]):
                where = tmp_path / f"{signal.Signals(signum).name}-{number}"
                outcomes.append(signal_once(entry, signum, moment, where))
    failures = [outcome.describe() for outcome in outcomes if outcome.problems()]
    assert not failures, f"{len(failures)} of {len(outcomes)} runs went wrong:\n" + "\n".join(failures[:20])
    for signum in SIGNALS:
        after = [o for o in outcomes if o.signum == signum and o.after_start]
        assert after, f"no {signal.Signals(signum).name} landed after tflaunch's code began"


PROGRAM = "import launcher\nlauncher.launch  # the Python API, loaded\n"


@pytest.mark.parametrize("argv, taken", [
    (["{python}", "-m", "launcher", "--version"], True),
    (["{python}", "-Bmlauncher", "--version"], True),
    (["{script}", "--version"], True),
    (["{python}", "-c", PROGRAM], False),
    (["{python}", "program.py", "--local", "2"], False),
    (["{python}", "-m", "app", "-m", "launcher"], False),  # runpy imports the package app as -m launcher would
], ids=["-m launcher", "-Bmlauncher", "console script", "-c", "a script", "-m a package"])
def test_only_the_command_takes_the_signals_at_once(argv, taken, tmp_path):
    """The tflaunch command takes over the signals in its first statements; a program importing
    the package (as the Python API's users do) keeps Python's own handlers."""
    if "{script}" in argv and not CONSOLE_SCRIPT.exists():
        pytest.skip(f"no console script at {CONSOLE_SCRIPT} (install the project: pip install -e .)")
    (tmp_path / "program.py").write_text(PROGRAM)
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__init__.py").write_text(PROGRAM)
    (tmp_path / "app" / "__main__.py").write_text("")
    argv = [part.format(python=sys.executable, script=CONSOLE_SCRIPT) for part in argv]
    watch_read, watch_write = os.pipe()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(WATCH), str(ROOT)]),
           "STARTWATCH_FD": str(watch_write), "STARTWATCH_PARENT": str(os.getpid())}
    with os.fdopen(watch_read) as watch:
        try:
            done = subprocess.run(argv, cwd=tmp_path, env=env, pass_fds=(watch_write,), capture_output=True,
                                  text=True, timeout=120)
        finally:
            os.close(watch_write)
        line = watch.read().strip()
    assert done.returncode == 0, done.stderr
    assert line == ("handlers taken" if taken else "handlers default")
