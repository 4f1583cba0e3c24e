"""Real-run tests of ``tflaunch runs``, ``logs``, ``status``, ``report`` and ``compare``, and of the
resource sampler with real processes.

Most runs use tests/helpers/task.py tasks that print TFLAUNCH_METRIC lines chosen here, so every
figure the commands show can be checked exactly; one slow test runs the real trainer.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest

from conftest import DEFAULT_LOCAL_TWO, TASK, interrupt
from launcher.run.output.resources import ResourceSampler
from polling import wait_for

pytestmark = pytest.mark.timeout(120)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


# -- helpers ----------------------------------------------------------------------------------


def metric(**fields) -> str:
    """A task.py action printing one metric line (the launcher fills in the task's name)."""
    return "print:TFLAUNCH_METRIC " + json.dumps(fields, separators=(",", ":"))


def epoch_actions(seconds: list[float], rates: list[float | None], batch: int, losses: list[float] | None = None,
                  replicas: int = 1) -> list[str]:
    actions = []
    for i, (sec, rate) in enumerate(zip(seconds, rates)):
        loss = losses[i] if losses else round(1.0 / (i + 1), 4)
        actions.append(metric(kind="epoch", epoch=i + 1, loss=loss, accuracy=round(0.5 + 0.1 * i, 4),
                              val_loss=round(loss * 1.5, 4), val_accuracy=round(0.45 + 0.1 * i, 4), epoch_seconds=sec,
                              samples_per_second=rate, global_batch=batch, replicas=replicas))
    return actions


def final_action(accuracy: float, loss: float = 0.25, seconds: float = 9.5, epochs: int = 3) -> str:
    return metric(kind="final", test_loss=loss, test_accuracy=accuracy, total_seconds=seconds, epochs=epochs)


def launch(tflaunch, *args: str, code: int = 0, timeout: float = 120):
    """A finished run and its own folder (found from the run's first message, not by sorting ids)."""
    done = tflaunch.run(*args, timeout=timeout)
    assert done.returncode == code, done.stderr[-3000:]
    run_id = re.search(r"^tflaunch: run (\S+): \d+ tasks? from ", done.stderr, re.M).group(1)
    return dataclasses.replace(done, run_dir=tflaunch.log_dir / run_id)


def run_ok(tflaunch, *args: str):
    return launch(tflaunch, *args)


def inspect(tflaunch, *args: str, code: int = 0, timeout: float = 60):
    done = tflaunch.run(*args, timeout=timeout)
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    return done


def newest_run(tflaunch) -> Path | None:
    """The run started last (run ids started in the same second do not sort by time)."""
    manifests = {}
    for path in tflaunch.log_dir.glob("*/run.json"):
        try:
            manifests[path.parent] = json.loads(path.read_text())["started_at"]
        except (FileNotFoundError, ValueError):
            continue
    return max(manifests, key=manifests.get) if manifests else None


def record_of(tflaunch) -> dict | None:
    run = newest_run(tflaunch)
    try:
        return json.loads((run / "run.json").read_text()) if run else None
    except (FileNotFoundError, ValueError):
        return None


def all_tasks_running(tflaunch) -> dict | None:
    manifest = record_of(tflaunch)
    # Running, with their pids known (the agent reports each pid just after the start).
    if manifest and all(t["state"] == "running" and t.get("pid") for t in manifest["tasks"]):
        return manifest
    return None


def started(tflaunch) -> dict:
    """The newest run's record once all its tasks run."""
    return wait_for(lambda: all_tasks_running(tflaunch), message="the run's tasks to start")


def kill_task_groups(manifest: dict) -> None:
    for task in manifest["tasks"]:
        if task.get("pid"):
            try:
                os.killpg(task["pid"], signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def folder_state(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``folder`` with its size and modification time, to show nothing changed."""
    return {str(p.relative_to(folder)): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in folder.rglob("*")}


def data_rows(text: str, first_cell: str) -> dict[str, list[str]]:
    """Table rows keyed by their first cell, for rows whose first cell matches the pattern."""
    return {line.split()[0]: line.split() for line in text.splitlines() if re.match(first_cell, line)}


# -- tflaunch runs ----------------------------------------------------------------------------


def test_runs_lists_newest_first_with_status_exit_code_and_accuracy(tflaunch):
    good = run_ok(tflaunch, "--local", "2", "--", "python", TASK, *epoch_actions([2.0], [100.0], 32),
                  final_action(0.875))
    failed = launch(tflaunch, "--local", "2", "--", "python", TASK, "print:hi", "exit-if:worker-1:3", "sleep:5",
                    code=3)
    done = inspect(tflaunch, "runs")
    lines = done.stdout.splitlines()
    assert lines[0].split()[:3] == ["RUN", "STARTED", "CLUSTER"]
    assert [line.split()[0] for line in lines[1:]] == [failed.run_dir.name, good.run_dir.name]
    assert "failed (exit 3)" in lines[1] and "--local 2" in lines[1]
    assert "succeeded" in lines[2] and lines[2].rstrip().endswith("0.8750")
    rows = {r["run_id"]: r for r in json.loads(inspect(tflaunch, "runs", "--json").stdout)}
    assert rows[failed.run_dir.name]["status"] == "failed" and rows[failed.run_dir.name]["exit_code"] == 3
    assert rows[failed.run_dir.name]["test_accuracy"] is None
    good_row = rows[good.run_dir.name]
    assert (good_row["tasks"], good_row["attempts"], good_row["test_accuracy"]) == (2, 1, 0.875)
    assert good_row["source"] == "--local 2" and good_row["duration_seconds"] == good.record["duration_seconds"]
    assert inspect(tflaunch, "runs", "--last", "1").stdout.count("\n") == 2


def test_missing_unknown_and_ambiguous_runs_are_one_line_errors(tflaunch):
    # No log directory yet: no runs to list, and nothing for a command that needs a run.
    assert inspect(tflaunch, "runs").stderr.strip() == f"no runs in {tflaunch.log_dir}/ yet"
    for command in ("logs", "status", "report"):
        done = inspect(tflaunch, command, code=2)
        assert done.stderr.strip() == f"tflaunch: error: log directory {tflaunch.log_dir}/ does not exist " \
                                      f"(choose another with --log-dir DIR)"
    tflaunch.log_dir.mkdir()
    assert inspect(tflaunch, "runs").stderr.strip() == f"no runs in {tflaunch.log_dir}/ yet"
    assert json.loads(inspect(tflaunch, "runs", "--json").stdout) == []
    for command in ("logs", "status", "report"):
        assert "no runs in" in inspect(tflaunch, command, code=2).stderr
    first = run_ok(tflaunch, "--local", "1", "--", "python", TASK, "print:one").run_dir.name
    second = run_ok(tflaunch, "--local", "1", "--", "python", TASK, "print:two").run_dir.name
    done = inspect(tflaunch, "logs", "nosuchrun", code=2)
    assert done.stderr.strip() == (f"tflaunch: error: no run 'nosuchrun' in {tflaunch.log_dir}/; "
                                   f"the latest runs are: {second}, {first}")
    common = os.path.commonprefix([first, second])
    if common:  # both ids start with the same date, so a short prefix names both
        assert "is ambiguous" in inspect(tflaunch, "logs", common, code=2).stderr
    assert "| one" in inspect(tflaunch, "logs", first).stdout
    assert "| one" in inspect(tflaunch, "logs", first[:-1]).stdout  # a unique prefix
    assert "| two" in inspect(tflaunch, "logs", "latest").stdout
    assert "needs at least two runs" in inspect(tflaunch, "compare", first, code=2).stderr
    errors = inspect(tflaunch, "logs", "--task", "chief-0", code=2).stderr
    assert errors.strip() == f"tflaunch: error: run {second} has no task 'chief-0'; its tasks are: worker-0"
    assert "has no attempt 2" in inspect(tflaunch, "logs", "--attempt", "2", code=2).stderr
    assert "not a valid regular expression" in inspect(tflaunch, "logs", "--grep", "(", code=2).stderr


# -- tflaunch logs ----------------------------------------------------------------------------


def test_logs_show_merged_or_task_lines_filtered_by_attempt_and_pattern(tflaunch):
    done = run_ok(tflaunch, "--local", "2", "--", "python", TASK, "print:alpha", "stderr:beta", "print:gamma 42")
    merged = inspect(tflaunch, "logs").stdout.splitlines()
    assert merged == done.merged.decode().splitlines()
    assert any(re.match(r"^\S+ \S+ \[1\] worker-1 \| gamma 42$", line) for line in merged)
    assert inspect(tflaunch, "logs", "--task", "worker-1").stdout.splitlines() == ["alpha", "beta", "gamma 42"]
    assert inspect(tflaunch, "logs", "--task", "worker-0", "--attempt", "1").stdout == "alpha\nbeta\ngamma 42\n"
    grepped = inspect(tflaunch, "logs", "--grep", r"gamma \d+").stdout.splitlines()
    assert len(grepped) == 2 and {line.split()[3] for line in grepped} == {"worker-0", "worker-1"}
    assert inspect(tflaunch, "logs", "--attempt", "1", "--grep", "beta").stdout.count("beta") == 2


def followed_to_the_end(tflaunch, run: subprocess.Popen, first: str | None = None,
                        then: Callable[[], None] | None = None) -> str:
    """What ``tflaunch logs --follow --task worker-0`` prints of ``run`` (started now) until it ends
    by itself, as the run succeeds; ``first``: the line it must print while the run still goes,
    after which ``then`` is called."""
    try:
        started(tflaunch)
        follow = subprocess.Popen(tflaunch.argv("logs", "--follow", "--task", "worker-0", "--log-dir",
                                                str(tflaunch.log_dir)), cwd=tflaunch.cwd, env=tflaunch.env(),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        shown = ""
        if first is not None:
            shown = follow.stdout.readline()
            assert shown == first
            assert run.poll() is None, "the first line must arrive while the run is still going"
            if then is not None:
                then()
        rest, errors = follow.communicate(timeout=60)
        assert follow.returncode == 0, errors
        run.communicate(timeout=30)
        assert run.returncode == 0
        return shown + rest
    finally:
        interrupt(run)


@pytest.mark.timeout(90)
def test_logs_follow_prints_lines_as_they_come_and_ends_with_the_run(tflaunch):
    run = tflaunch.start("--local", "1", "--", "python", TASK, "print:tick-1", "sleep:2", "print:tick-2", "sleep:1",
                         "partial:last words")
    assert followed_to_the_end(tflaunch, run, first="tick-1\n") == "tick-1\ntick-2\nlast words\n"


# Attempt 1 goes on once the file "go" exists in its working folder (the test makes it once the
# follower printed attempt 1's first line): a follower started late, on a loaded machine, would
# find attempt 2 already running and its log at the top, and attempt 1's in attempt-1/.
ATTEMPT_LINES = ("import os, sys, time\n"
                 "attempt = os.environ['TFLAUNCH_ATTEMPT']\n"
                 "print(f'attempt {attempt} first', flush=True)\n"
                 "while attempt == '1' and not os.path.exists('go'):\n"
                 "    time.sleep(0.05)\n"
                 "time.sleep(1.5)\n"
                 "print(f'attempt {attempt} second', flush=True)\n"
                 "sys.exit(3 if attempt == '1' else 0)\n")


@pytest.mark.timeout(90)
def test_logs_follow_reads_on_across_a_restart_that_moves_the_log_into_its_attempt_folder(tflaunch):
    # Attempt 1's log is at the top of the run folder while it runs; when attempt 2 starts it moves
    # into attempt-1/ and a new one takes its place: the follower finishes the moved file, then the new.
    run = tflaunch.start("--local", "1", "--max-restarts", "1", "--restart-delay", "1", "--",
                         "python", "-c", ATTEMPT_LINES)
    out = followed_to_the_end(tflaunch, run, first="attempt 1 first\n", then=(tflaunch.cwd / "go").touch)
    assert out == "attempt 1 first\nattempt 1 second\nattempt 2 first\nattempt 2 second\n"
    run_dir = newest_run(tflaunch)
    assert sorted(p.name for p in (run_dir / "attempt-1").iterdir()) == ["worker-0.log"]
    assert not (run_dir / "attempt-2").exists()
    for attempt in ("1", "2"):
        shown = inspect(tflaunch, "logs", "--task", "worker-0", "--attempt", attempt).stdout
        assert shown == f"attempt {attempt} first\nattempt {attempt} second\n"


TWO_ATTEMPTS = ("import json, os, sys\n"
                "attempt = os.environ['TFLAUNCH_ATTEMPT']\n"
                "def say(**record): print('TFLAUNCH_METRIC ' + json.dumps(record), flush=True)\n"
                "if attempt == '1':\n"
                "    say(kind='epoch', epoch=1, loss=0.5, accuracy=0.5, epoch_seconds=0.5)\n"
                "    sys.exit(3)\n"
                "say(kind='epoch', epoch=2, loss=0.25, accuracy=0.75, epoch_seconds=0.75)\n"
                "say(kind='final', test_loss=0.3, test_accuracy=0.7, total_seconds=1.25, epochs=2)\n")


@pytest.mark.timeout(90)
def test_a_runs_duration_and_training_time_read_the_same_everywhere(tflaunch):
    from launcher.records.states import duration_text

    done = run_ok(tflaunch, "--local", "1", "--max-restarts", "1", "--restart-delay", "1", "--",
                  "python", "-c", TWO_ATTEMPTS)
    took = duration_text(json.loads((done.run_dir / "run.json").read_text())["duration_seconds"])
    assert float(took.split()[0]) >= 1.0  # both attempts and the restart delay, not the last attempt alone
    assert f"succeeded after 2 attempts in {took} (1 task)" in done.stderr
    # Trained: attempt 1's epoch (0.5 s) and attempt 2's (0.75 s); not the task's total of 1.25 s.
    assert "training: 2 epochs in 1.2 s (every attempt's epochs)" in done.stderr
    runs = inspect(tflaunch, "runs").stdout.splitlines()
    assert re.search(rf"\s{re.escape(took)}\s", next(line for line in runs if done.run_dir.name in line))
    report = inspect(tflaunch, "report").stdout.splitlines()
    assert report[0] == f"run {done.run_dir.name} (--local 1): succeeded in {took}, 2 epochs"
    assert "final (worker-0): test accuracy 0.7000, test loss 0.3000, 2 epochs in 1.2 s" in report
    status = inspect(tflaunch, "status").stdout.splitlines()
    assert f"not running: succeeded after {took}, 2 attempts;" in status[0] + ";"


@pytest.mark.timeout(90)
def test_launcher_gone_shows_launcher_lost_and_ends_follow(tflaunch):
    run = tflaunch.start("--local", "2", "--", "python", TASK, "print:up", "forever")
    manifest = started(tflaunch)
    try:
        follow = subprocess.Popen(tflaunch.argv("logs", "-f", "--log-dir", str(tflaunch.log_dir)),
                                  cwd=tflaunch.cwd, env=tflaunch.env(), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        wait_for(lambda: b"| up" in (newest_run(tflaunch) / "merged.log").read_bytes(), message="the task's output")
        status = json.loads(inspect(tflaunch, "status", "--json").stdout)
        assert status["status"] == "running" and status["launcher"]["alive"] is True
        run.kill()  # the launcher dies without recording an end; its tasks are left behind
        run.communicate()
        out, errors = follow.communicate(timeout=30)
        assert follow.returncode == 0, errors
        assert "| up" in out
        assert errors == (f"tflaunch: run {manifest['run_id']}: launcher lost (its process is gone); "
                          "stopped following\n")
        assert "launcher lost" in inspect(tflaunch, "runs").stdout
        assert json.loads(inspect(tflaunch, "status", "--json").stdout)["status"] == "launcher-lost"
        text = inspect(tflaunch, "status").stdout
        assert f"launcher lost: run.json says running but the launcher pid {manifest['launcher']['pid']}" in text
    finally:
        kill_task_groups(record_of(tflaunch) or manifest)
        interrupt(run)


# -- tflaunch status --------------------------------------------------------------------------


BUSY_TASK = ("import json, time; print('TFLAUNCH_METRIC ' + json.dumps({'kind': 'epoch', 'epoch': 1, 'loss': 0.5, "
             "'accuracy': 0.75, 'val_accuracy': 0.7}), flush=True)\n"
             "x = bytearray(30 * 1024 * 1024)\n"
             "while True: pass")


@pytest.mark.timeout(90)
def test_status_of_a_live_run_shows_states_pids_uptime_metric_and_usage(tflaunch):
    run = tflaunch.start("--local", "2", "--", "python", "-c", BUSY_TASK)
    try:
        manifest = started(tflaunch)
        wait_for(lambda: (newest_run(tflaunch) / "metrics.jsonl").read_text().count("\n") == 2,
                 message="both tasks' metrics")
        began = max(datetime.fromisoformat(t["started_at"]).timestamp() for t in manifest["tasks"])
        wait_for(lambda: time.time() - began > 1.1, message="the tasks to be up for more than 1 s")
        status = json.loads(inspect(tflaunch, "status", "--json").stdout)
        assert status["status"] == "running" and status["uptime_seconds"] > 1.0
        pids = {t["name"]: t["pid"] for t in manifest["tasks"]}
        for task in status["tasks"]:
            assert (task["state"], task["host"], task["alive"]) == ("running", "localhost", True)
            assert task["pid"] == pids[task["name"]]
            assert task["uptime_seconds"] > 1.0
            assert task["last_metric"]["epoch"] == 1 and task["last_metric"]["accuracy"] == 0.75
            assert task["usage"]["cpu_percent"] > 0, task["usage"]  # a busy loop (how busy depends on the load)
            assert task["usage"]["rss_mb"] > 30  # the 30 MB buffer
        text = inspect(tflaunch, "status").stdout
        assert text.startswith(f"run {manifest['run_id']} (--local 2): running for ")
        rows = data_rows(text.split("\n\n")[0], r"worker-\d")
        for name, row in rows.items():
            assert row[1:5] == ["worker", "localhost", "running", str(pids[name])]
        assert "epoch 1: loss 0.5000, acc 0.7500, val acc 0.7000" in text
    finally:
        interrupt(run)
    assert run.returncode == 130
    text = inspect(tflaunch, "status").stdout
    assert "not running: stopped (exit 130)" in text
    assert re.search(r"^worker-0\s+worker\s+localhost\s+stopped \(SIG[A-Z]+ from tflaunch\)", text, re.M)


def test_status_of_a_hung_run_shows_its_root_cause(tflaunch):
    # A real hang: worker-2 stops in a different line from the others, so the verdict names it.
    done = tflaunch.run("--local", "3", "--hang-timeout", "3", "--grace", "1", "--", "python", TASK,
                        "print:started", "sleep-if:worker-2:600", "forever")
    assert done.returncode == 124, done.stderr[-2000:]
    summary = done.record["root_cause"]["diagnosis"]["summary"]
    assert summary.startswith("worker-2 differs from the rest: "), summary
    text = inspect(tflaunch, "status").stdout
    assert f"root cause: worker-2 on localhost: {summary}" in text.splitlines(), text
    assert json.loads(inspect(tflaunch, "status", "--json").stdout)["root_cause"] == \
        f"worker-2 on localhost: {summary}"
    # A run that ended on its own has none to show.
    assert inspect(tflaunch, "--local", "1", "--", "python", TASK, "exit:0").returncode == 0
    assert "root cause" not in inspect(tflaunch, "status").stdout
    assert json.loads(inspect(tflaunch, "status", "--json").stdout)["root_cause"] is None


# -- resource sampler -------------------------------------------------------------------------


class AgentTasks:
    """Tasks started the way a run starts them (one agent for this machine); their readings feed a sampler."""

    def __init__(self, tmp_path: Path):
        from launcher.cluster.plan import TaskLaunch
        from launcher.options import RunOptions
        from launcher.transports.local import LocalTransport

        self.make_launch = lambda name, code: TaskLaunch(name, "worker", 0, "localhost", "127.0.0.1:1", True,
                                                         (sys.executable, "-c", code), {}, str(tmp_path))
        self.transport = LocalTransport(RunOptions(grace=1.0))
        self.tmp_path = tmp_path
        self.tasks: dict = {}

    def start(self, name: str, code: str):
        log = self.tmp_path / f"{name}.log"
        log.touch()
        self.tasks[name] = self.transport.start(self.make_launch(name, code), str(log))
        return self.tasks[name]

    def output(self, name: str) -> str:
        return (self.tmp_path / f"{name}.log").read_text()

    def readings(self) -> dict:
        return {name: task.reading() for name, task in self.tasks.items() if task.reading() is not None}

    def close(self) -> None:
        for task in self.tasks.values():
            task.kill()
        self.transport.close()


def samples_written(folder: Path, tasks: int) -> int:
    """The fewest samples any of the ``tasks`` processes has in resources.json so far."""
    try:
        figures = json.loads((folder / "resources.json").read_text())["tasks"]
    except FileNotFoundError:
        return 0
    return min(f["samples"] for f in figures.values()) if len(figures) == tasks else 0


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of one process, read from /proc (independently of psutil)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_of(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def test_resource_sampler_measures_busy_idle_and_child_processes(tmp_path):
    agents = AgentTasks(tmp_path)
    # Each prints "ready" once its interpreter has started and it is in its steady state.
    busy = agents.start("busy", "x = bytearray(20 * 1024 * 1024)\nprint('ready', flush=True)\nwhile True: pass")
    idle = agents.start("idle", "import time; print('ready', flush=True); time.sleep(60)")
    # The task itself sleeps; its child does the work, and the tree's figures must include it.
    parent = agents.start("parent", "import subprocess, sys, time\n"
                                    "subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
                                    "print('ready', flush=True)\n"
                                    "time.sleep(60)")
    procs = {"busy": busy, "idle": idle, "parent": parent}
    sampler = ResourceSampler(agents.readings, tmp_path, interval=0.25, write_every=0.5)
    try:
        wait_for(lambda: all(agents.output(name) == "ready\n" for name in procs), timeout=30,
                 message="every task to be ready")
        wait_for(lambda: len(children_of(parent.pid)) == 1, timeout=10, message="the parent's child")
        (child,) = children_of(parent.pid)
        # The first readings, from which CPU% is measured.
        wait_for(lambda: len(agents.readings()) == 3, timeout=10, message="a reading of every task")
        sampler.sample_once()
        spent = {"busy": cpu_seconds(busy.pid), "parent": cpu_seconds(child) + cpu_seconds(parent.pid)}
        began = time.monotonic()
        sampler.start()
        # A window of 16 samples (about 4 s) keeps the CPU% comparison below within its tolerance.
        wait_for(lambda: samples_written(tmp_path, 3) >= 16, timeout=60, message="16 samples of each process")
        sampler.stop()
        wall = time.monotonic() - began
        spent = {"busy": cpu_seconds(busy.pid) - spent["busy"],
                 "parent": cpu_seconds(child) + cpu_seconds(parent.pid) - spent["parent"]}
    finally:
        agents.close()
    assert not sampler.is_alive()
    data = json.loads((tmp_path / "resources.json").read_text())
    figures = data["tasks"]
    assert set(figures) == {"busy", "idle", "parent"}
    for name, f in figures.items():
        assert f["samples"] >= 10 and f["pid"] == procs[name].pid
        assert f["rss_mb_mean"] > 1 and f["rss_mb_peak"] >= f["rss_mb_mean"]
        assert f["cpu_percent_peak"] >= f["cpu_percent_mean"] >= 0
        assert f["latest"]["pid"] == procs[name].pid and f["latest"]["time"] <= data["updated"]
    assert figures["busy"]["rss_mb_peak"] > 20  # the 20 MB buffer
    assert figures["parent"]["latest"]["processes"] == 2
    assert figures["idle"]["cpu_percent_mean"] < 5
    # What a busy loop gets depends on the machine's load: compare with what the kernel says it got.
    for name in ("busy", "parent"):
        actual = 100 * spent[name] / wall
        assert figures[name]["cpu_percent_mean"] == pytest.approx(actual, abs=10 + 0.15 * actual), (name, actual)
        if actual > 60:  # a fair share of a core: then the figure must show a busy loop
            assert figures[name]["cpu_percent_mean"] > 50


def test_resource_sampler_never_raises(tmp_path):
    from launcher.transports.base import Reading

    def broken() -> dict:
        raise RuntimeError("no readings today")

    good = Reading(pid=os.getpid(), rss_bytes=1 << 20, cpu_seconds=1.0, processes=1, at=time.time())
    for readings, folder in ((broken, tmp_path), (lambda: {"bad": "x", "worse": None}, tmp_path),
                             (lambda: {"me": good}, tmp_path / "missing" / "dir")):
        calls = []
        sampler = ResourceSampler(lambda: calls.append(1) or readings(), folder, interval=0.05, write_every=0.1)
        sampler.start()
        # Several rounds of failing samples and writes (one write per two samples).
        wait_for(lambda: len(calls) >= 5, timeout=10, message="five sampling rounds")
        assert sampler.is_alive()
        sampler.stop()
        assert not sampler.is_alive()
    assert json.loads((tmp_path / "resources.json").read_text())["tasks"] == {}
    ResourceSampler(lambda: {}, tmp_path).stop()  # stopped without being started


# -- tflaunch report --------------------------------------------------------------------------


SECONDS = [3.0, 1.25, 1.5]
RATES = [None, 512.0, 480.0]


def test_report_shows_exact_epoch_figures_and_writes_a_png_only_with_plot(tflaunch):
    done = run_ok(tflaunch, "--local", "2", "--", "python", TASK,
                  *epoch_actions(SECONDS, RATES, 64, losses=[0.9, 0.6, 0.45]), final_action(0.9125))
    before = folder_state(done.run_dir)
    text = inspect(tflaunch, "report").stdout
    assert folder_state(done.run_dir) == before
    assert "learning curves" not in text and text.splitlines()[-1].startswith("resource use")
    text = inspect(tflaunch, "report", "--plot").stdout
    lines = text.splitlines()
    assert re.fullmatch(rf"run {done.run_dir.name} \(--local 2\): succeeded in \d+\.\d s, 3 epochs", lines[0])
    assert "worker-0 (chief):" in lines and "worker-1:" not in lines
    assert data_rows(text, r"\s+\d+\s") == {
        "1": ["1", "0.9000", "0.5000", "1.3500", "0.4500", "3.000", "-"],
        "2": ["2", "0.6000", "0.6000", "0.9000", "0.5500", "1.250", "512.0"],
        "3": ["3", "0.4500", "0.7000", "0.6750", "0.6500", "1.500", "480.0"],
    }
    # the epochs' own times (3.0 + 1.25 + 1.5 s), not the task's total of 9.5 s
    assert "final (worker-0): test accuracy 0.9125, test loss 0.2500, 3 epochs in 5.8 s" in lines
    png = done.run_dir / "learning_curves.png"
    assert lines[-1] == f"learning curves: {png}"
    assert png_size(png) == (1000, 400) and png.stat().st_size > 10_000
    import matplotlib.image

    assert matplotlib.image.imread(str(png)).shape[:2] == (400, 1000)
    png.unlink()
    before = folder_state(done.run_dir)
    every = inspect(tflaunch, "report", "--all", "--no-plot").stdout
    assert "worker-0 (chief):" in every and "\nworker-1:\n" in every and "learning curves" not in every
    report = json.loads(inspect(tflaunch, "report", "--task", "worker-1", "--json").stdout)
    assert list(report["epochs"]) == ["worker-1"]
    assert [r["epoch_seconds"] for r in report["epochs"]["worker-1"]] == SECONDS
    assert report["final"]["test_accuracy"] == 0.9125 and report["plot"] is None
    assert folder_state(done.run_dir) == before
    both = inspect(tflaunch, "report", "--plot", "--json", code=2)
    assert both.stdout == "" and both.stderr.splitlines()[-1] == ("tflaunch: error: --json only prints; draw the "
                                                                  "learning curves with a separate 'report --plot'")
    assert folder_state(done.run_dir) == before
    assert "has no task 'ps-0'" in inspect(tflaunch, "report", "--task", "ps-0", code=2).stderr


def test_inspection_commands_leave_the_log_directory_untouched(tflaunch):
    one = run_ok(tflaunch, "--local", "1", "--", "python", TASK, *epoch_actions(SECONDS, RATES, 32)).run_dir.name
    two = run_ok(tflaunch, "--local", "2", "--", "python", TASK, *epoch_actions(SECONDS, RATES, 64),
                 final_action(0.9)).run_dir.name
    before = folder_state(tflaunch.log_dir)
    for command in (["runs"], ["runs", "--json"], ["logs"], ["logs", "--task", "worker-1", "--grep", "epoch"],
                    ["status", one], ["status", "--json"], ["report"], ["report", "--all", "--json"],
                    ["report", one, "--no-plot"], ["compare", one, two], ["compare", one, two, "--json"]):
        assert inspect(tflaunch, *command).stdout, command
        assert folder_state(tflaunch.log_dir) == before, command


def test_report_without_matplotlib_says_how_to_install_it_and_still_prints(tflaunch, tmp_path):
    run_dir = run_ok(tflaunch, "--local", "1", "--", "python", TASK, *epoch_actions(SECONDS, RATES, 32)).run_dir
    blocker = tmp_path / "no_matplotlib"
    (blocker / "matplotlib").mkdir(parents=True)
    (blocker / "matplotlib" / "__init__.py").write_text("raise ImportError('matplotlib is blocked here')\n")
    from conftest import ROOT

    done = tflaunch.run("report", "--plot", env={"PYTHONPATH": f"{blocker}{os.pathsep}{ROOT}"})
    assert done.returncode == 0, done.stderr
    python = done.stdout.splitlines()[-1].split("not installed for ", 1)[-1].split(" (")[0]
    assert Path(python).is_file(), done.stdout  # the interpreter that lacks it, and the command that works anywhere
    assert done.stdout.splitlines()[-1] == (f"learning curves: not drawn, matplotlib is not installed for {python} "
                                            f"({python} -m pip install matplotlib)")
    assert len(data_rows(done.stdout, r"\s+\d+\s")) == 3
    assert not (run_dir / "learning_curves.png").exists()


def test_report_and_compare_explain_missing_metrics(tflaunch):
    quiet = run_ok(tflaunch, "--local", "1", "--", "python", TASK, "print:no metrics here").run_dir.name
    done = inspect(tflaunch, "report", code=2)
    assert done.stderr.strip() == (f"tflaunch: error: run {quiet} has no epoch metrics: its tasks printed "
                                   f"no TFLAUNCH_METRIC lines and no Keras epoch lines")
    run = tflaunch.start("--local", "1", "--", "python", TASK, "forever")
    try:
        live = started(tflaunch)["run_id"]
        assert f"run {live} is still running and its tasks reported no epoch yet" in \
            inspect(tflaunch, "report", code=2).stderr
        assert f"run {live} is still running and has reported no epoch yet" in \
            inspect(tflaunch, "compare", live, quiet, code=2).stderr
        assert "running" in data_rows(inspect(tflaunch, "runs").stdout, live)[live]
    finally:
        interrupt(run)


# -- tflaunch compare -------------------------------------------------------------------------


def test_compare_speedup_is_the_ratio_of_recorded_epoch_times(tflaunch):
    one = run_ok(tflaunch, "--local", "1", "--", "python", TASK, *epoch_actions([4.0, 2.0, 2.2], [None, 64.0, 60.0], 32),
                 final_action(0.9))
    two = run_ok(tflaunch, "--local", "2", "--", "python", TASK,
                 *epoch_actions([3.0, 1.25, 1.5], [None, 120.0, 110.0], 64, replicas=2), final_action(0.95))
    solo = run_ok(tflaunch, "--local", "1", "--", "python", TASK, *epoch_actions([1.6], [40.0], 32))
    text = inspect(tflaunch, "compare", one.run_dir.name, two.run_dir.name, solo.run_dir.name[:-1]).stdout
    lines = text.splitlines()
    assert lines[0].startswith("epoch time and samples/s: means over the epochs after the first (the warm-up)")
    assert "(speedup: epoch time of the first run / epoch time of this run)" in lines
    assert lines[-1].startswith(f"arguments that differ: {one.run_dir.name}: 'print:TFLAUNCH_METRIC ")
    rows = data_rows(text, r"\d{8}-")
    recorded = {}
    for done in (one, two, solo):
        records = [json.loads(line) for line in (done.run_dir / "metrics.jsonl").read_text().splitlines()]
        epochs = [r for r in records if r["kind"] == "epoch" and r["task"] == "worker-0"]
        steady = epochs[1:] or epochs
        recorded[done.run_dir.name] = sum(r["epoch_seconds"] for r in steady) / len(steady)
    base = recorded[one.run_dir.name]
    expected = ((one, 1, 32, 62.0, "0.9000"), (two, 2, 64, 115.0, "0.9500"), (solo, 1, 32, 40.0, "-"))
    for done, workers, batch, rate, accuracy in expected:
        row = rows[done.run_dir.name]
        assert row[3:6] == [str(workers), str(batch), f"{recorded[done.run_dir.name]:.3f}"]
        assert row[6:8] == [f"{batch / rate * 1000:.2f}", f"{rate:.1f}"] and row[10] == accuracy
        printed = float(row[11].rstrip("x"))
        assert printed == round(base / recorded[done.run_dir.name], 2)
    assert [rows[d.run_dir.name][11] for d in (one, two, solo)] == ["1.00x", "1.53x", "1.31x"]  # 2.1 s / 1.375 s, / 1.6 s
    # the last epoch's training loss and accuracy
    assert rows[one.run_dir.name][8:10] == ["0.3333", "0.7000"] and rows[solo.run_dir.name][8:10] == ["1.0000", "0.5000"]
    data = json.loads(inspect(tflaunch, "compare", one.run_dir.name, two.run_dir.name, "--json").stdout)
    assert data["baseline"] == one.run_dir.name
    first, second = data["runs"]
    assert second["speedup"] == pytest.approx(recorded[one.run_dir.name] / recorded[two.run_dir.name], rel=1e-12)
    assert first["speedup"] == 1.0 and second["steady_epochs"] == [2, 3]
    assert second["step_seconds"] == pytest.approx(64 / 115.0)


def keras_epochs(seconds: float) -> list[str]:
    """Actions of a task that prints what Keras 3's Model.fit(verbose=2) does for two epochs of
    ``seconds`` each: both print "0s", the whole seconds Keras rounds to."""
    actions = []
    for epoch in (1, 2):
        actions += [f"print:Epoch {epoch}/2", f"sleep:{seconds}",
                    f"print:10/10 - 0s - 30ms/step - accuracy: 0.{epoch}000 - loss: {1.0 / epoch:.4f}"]
    return actions


def test_compare_tells_keras_runs_apart_where_keras_prints_the_same_whole_seconds(tflaunch):
    fast = run_ok(tflaunch, "--local", "1", "--", "python", TASK, *keras_epochs(0.2))
    slow = run_ok(tflaunch, "--local", "1", "--", "python", TASK, *keras_epochs(0.6))
    rows = data_rows(inspect(tflaunch, "compare", fast.run_dir.name, slow.run_dir.name).stdout, r"\d{8}-")
    quick, late = (float(rows[done.run_dir.name][5]) for done in (fast, slow))
    # Each epoch's own time, not Keras's 0s: as tflaunch read the lines, so a line read a few ms
    # late (a loaded machine) makes an epoch look that much shorter or longer.
    assert 0.15 <= quick < 0.5 and 0.55 <= late < 0.9, rows
    assert float(rows[slow.run_dir.name][11].rstrip("x")) < 0.7  # slower: no "1.00x"
    assert rows[fast.run_dir.name][8:10] == ["0.5000", "0.2000"]  # the last epoch's loss and accuracy


# -- the real trainer -------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.tensorflow
@pytest.mark.timeout(300)
@pytest.mark.xdist_group(DEFAULT_LOCAL_TWO)
def test_real_trainer_run_reports_epochs_resources_and_learning_curves(default_local_two):
    done, tflaunch, _ = default_local_two
    assert done.returncode == 0, done.stderr[-3000:]
    trained = sorted({json.loads(line)["epoch"] for line in (done.run_dir / "metrics.jsonl").read_text().splitlines()
                      if '"kind":"epoch"' in line})
    report = json.loads(inspect(tflaunch, "report", "--json").stdout)
    assert report["chief"] == "worker-0" and [r["epoch"] for r in report["epochs"]["worker-0"]] == trained
    assert len(trained) >= 2
    for row in report["epochs"]["worker-0"]:
        assert 0 < row["loss"] and 0 <= row["accuracy"] <= 1 and row["epoch_seconds"] > 0
    assert 0 <= report["final"]["test_accuracy"] <= 1
    text = inspect(tflaunch, "report", "--plot").stdout
    png = done.run_dir / "learning_curves.png"
    assert f"learning curves: {png}" in text
    width, height = png_size(png)
    assert (width, height) == (1000, 400) and png.stat().st_size > 10_000
    resources = done.run_dir / "resources.json"
    if resources.exists():  # written once the run loop samples its tasks
        figures = json.loads(resources.read_text())["tasks"]
        assert set(figures) == {"worker-0", "worker-1"}
        for f in figures.values():
            assert f["rss_mb_peak"] >= f["rss_mb_mean"] > 50  # TensorFlow processes
            assert f["cpu_percent_peak"] >= f["cpu_percent_mean"] > 0
        assert "resource use per task (resources.json):" in text
    else:
        assert "resource use: not recorded for this run (no resources.json)" in text
    rows = data_rows(inspect(tflaunch, "runs").stdout, r"\d{8}-")
    assert rows[done.run_dir.name][-1] == f"{report['final']['test_accuracy']:.4f}"


@pytest.mark.unit
def test_stacks_show_a_terminals_control_characters_escaped():
    from launcher.inspect.stacks import stacks_lines

    answer = {"run_id": "r\x1b[2J", "attempt": 1, "verdict": {"summary": "odd \x9b31m"},
              "tasks": [{"name": "w\x07", "role": "worker", "host": "h", "pid": 1,
                         "stacks": "Thread 1 (idle): \x1b]0;owned\x07\n    f (x.py:1)\rcover\n"}]}
    lines = stacks_lines(answer)
    assert not any(re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f]", line) for line in lines), lines
    assert lines[0].startswith("run r\\x1b[2J, attempt 1: stacks of 1 running task, sampled at")
    assert lines[1] == "verdict: odd \\x9b31m"
    assert lines[-2:] == ["Thread 1 (idle): \\x1b]0;owned\\x07", "    f (x.py:1)\\x0dcover"]
