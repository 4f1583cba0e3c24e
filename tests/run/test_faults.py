"""Faults around tflaunch itself, with real processes: signals, a full disk, a vanished run folder,
bad environments, exhausted resources. A user must never see a traceback or find a task left behind.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path

import pytest
from conftest import TASK, descendants_alive, env_lines_of
from polling import wait_for


def marker() -> str:
    """A sleep duration unique to one test, to find its task processes by command line."""
    return f"{300 + uuid.uuid4().int % 10_000 / 1000:.3f}"


def sleeping(sleep: str) -> list:
    """The task processes of a test: ``sleep <marker>`` itself (not tflaunch, whose argv names it too)."""
    return [p for p in descendants_alive(sleep) if (p.info["cmdline"] or [""])[0].endswith("sleep")]


def handles_sighup(pid: int) -> bool:
    """Whether tflaunch's signal handlers are installed (Python alone does not catch SIGHUP)."""
    try:
        caught = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                      if line.startswith("SigCgt:"))
    except (FileNotFoundError, StopIteration):
        return False
    return bool(int(caught.split()[1], 16) & (1 << (signal.SIGHUP - 1)))


def record_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGQUIT, signal.SIGTERM])
def test_a_hangup_or_quit_stops_every_task_finishes_the_record_and_exits_128_plus_n(tflaunch, signum):
    sleep = marker()
    proc = tflaunch.start("--local", "2", "--", "sleep", sleep)
    wait_for(lambda: len(sleeping(sleep)) == 2, timeout=30, message="both tasks running")
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signum, err
    assert "Traceback" not in err and f"received {signal.Signals(signum).name}: stopping every task" in err
    wait_for(lambda: not sleeping(sleep), timeout=5, message="the tasks to be gone")
    record = record_of(tflaunch.latest_run())
    assert record["status"] == "stopped" and record["exit_code"] == 128 + signum
    assert [t["state"] for t in record["tasks"]] == ["stopped", "stopped"]


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.0, 0.01, 0.03, 0.06, 0.1, 0.2, 0.4])
def test_ctrl_c_at_any_moment_once_tflaunch_handles_signals_is_quiet_and_leaves_nothing(tflaunch, delay):
    sleep = marker()
    proc = tflaunch.start("--local", "2", "--", "sleep", sleep)
    wait_for(lambda: handles_sighup(proc.pid) or proc.poll() is not None, timeout=30, message="signal handlers")
    # The moment within the start is what this test varies; nothing observable marks it.
    subprocess.run(["sleep", str(delay)], check=True)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert proc.returncode == 130, err
    wait_for(lambda: not sleeping(sleep), timeout=5, message="no task left")
    run_dir = tflaunch.latest_run()
    if run_dir is not None and (run_dir / "run.json").exists():  # a run folder, once made, is final
        assert record_of(run_dir)["status"] == "stopped"


@pytest.mark.slow
def test_ctrl_c_while_many_tasks_are_starting_stops_every_one_of_them(tflaunch):
    sleep = marker()
    proc = tflaunch.start("--local", "150", "--", "sleep", sleep)
    wait_for(lambda: len(sleeping(sleep)) >= 10, timeout=60, message="the first tasks running")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err, err[-2000:]
    wait_for(lambda: not sleeping(sleep), timeout=10, message="every task gone")
    record = record_of(tflaunch.latest_run())
    assert record["status"] == "stopped"
    assert {t["state"] for t in record["tasks"]} == {"stopped"}
    assert all(t["pid"] is not None for t in record["tasks"] if t["started_at"])


def test_a_program_that_is_not_executable_code_is_one_line_and_a_final_record(tflaunch, tmp_path):
    program = tmp_path / "not-a-program"
    program.write_bytes(b"\x00\x01garbage")
    program.chmod(0o755)
    done = tflaunch.run("--local", "2", "--", str(program))
    assert done.returncode == 127 and "Traceback" not in done.stderr
    assert "Exec format error" in done.stderr
    record = done.record
    assert record["status"] == "failed" and record["root_cause"]["error"].endswith("Exec format error")


def test_more_tasks_than_this_machine_has_ports_for_is_one_line(tflaunch):
    # More tasks than the ephemeral range has ports is refused by the per-machine cap before any
    # port is picked (the ports running out inside reserve_ports is tests/cluster/test_ports.py's).
    done = tflaunch.run("--local", "70000", "--", "true", timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("tflaunch: error: --local 70000: ")
    assert len(done.stderr.strip().splitlines()) == 1 and done.run_dir is None


@pytest.mark.slow
def test_more_tasks_than_the_open_files_limit_still_run_because_descriptors_grow_with_hosts(tflaunch):
    # 200 tasks once needed about 1,500 descriptors; now one agent and a bounded set of log files.
    argv = ["bash", "-c", 'ulimit -n 256 && exec "$@"', "bash",
            *tflaunch.argv("--local", "200", "--quiet", "--log-dir", str(tflaunch.log_dir), "--", "sh", "-c",
                           "echo $TFLAUNCH_TASK")]
    done = subprocess.run(argv, cwd=tflaunch.cwd, env=tflaunch.env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    run_dir = tflaunch.latest_run()
    assert (run_dir / "worker-199.log").read_text() == "worker-199\n"


def test_a_log_dir_that_cannot_be_created_is_one_line_and_starts_nothing(tflaunch):
    done = subprocess.run(tflaunch.argv("--local", "2", "--log-dir", "/proc/no/such", "--", "true"),
                          cwd=tflaunch.cwd, env=tflaunch.env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr == ("tflaunch: error: --local 2: log_dir: cannot create a run folder in '/proc/no/such' "
                           "(--log-dir): No such file or directory\n")


def mounted_tmpfs(path: Path, size: str) -> Path:
    """A tmpfs of ``size`` at ``path`` (the tests run as root); unmount it with ``umount``."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    return path


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 2 MB tmpfs, unmounted afterwards."""
    mount = mounted_tmpfs(tmp_path / "small", "2m")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def full_tmpfs(tmp_path):
    """A 256 KB tmpfs filled to the last byte by one file, unmounted afterwards."""
    mount = mounted_tmpfs(tmp_path / "full", "256k")
    try:
        with open(mount / "filler", "wb", buffering=0) as filler:
            try:
                while True:
                    filler.write(b"\0" * 4096)
            except OSError:
                pass
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_log_dir_where_run_json_cannot_be_written_refuses_the_run_before_any_task_starts(tflaunch, full_tmpfs,
                                                                                          tmp_path):
    started = tmp_path / "started"
    done = subprocess.run(tflaunch.argv("--local", "1", "--log-dir", str(full_tmpfs), "--", "touch", str(started)),
                          cwd=tflaunch.cwd, env=tflaunch.env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert re.fullmatch(rf"tflaunch: error: {re.escape(str(full_tmpfs))}/[\w-]+/run\.json: cannot write the run "
                        r"record: No space left on device; no task was started\n", done.stderr), done.stderr
    assert not started.exists()
    assert [p.name for p in full_tmpfs.iterdir()] == ["filler"]  # no empty run folder left behind


@pytest.mark.slow
def test_a_full_disk_stops_the_tasks_and_says_which_path_and_why(tflaunch, small_tmpfs):
    sleep = marker()
    chatty = f"import sys, time\nfor i in range(10**7): print('line', i, 'x' * 200)\ntime.sleep({sleep})"
    proc = subprocess.Popen(tflaunch.argv("--local", "2", "--log-dir", str(small_tmpfs), "--", sys.executable, "-c",
                                          chatty), cwd=tflaunch.cwd, env=tflaunch.env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "Traceback" not in err, err[-3000:]
    run_dir = next(p for p in small_tmpfs.iterdir() if p.is_dir())
    # The disk is the root cause, whichever task died of it first; the tasks are stopped.
    failed = f"tflaunch: run {run_dir.name} failed: cannot write the run folder: {run_dir}/"
    assert any(line.startswith(failed) and line.endswith(": No space left on device") for line in err.splitlines()), \
        err[-3000:]
    assert not sleeping(sleep)
    record = record_of(run_dir)  # the final record still fits, and says how the run ended
    assert record["run_id"] == run_dir.name and record["status"] == "failed" and record["root_cause"] is None
    assert record["error"].startswith(str(run_dir)) and record["error"].endswith("No space left on device")


def test_a_run_folder_removed_under_a_running_run_ends_without_a_traceback(tflaunch):
    sleep = marker()
    proc = tflaunch.start("--local", "2", "--", "python", TASK, "print:up", "sleep:2", "exit:0")
    run_dir = wait_for(tflaunch.latest_run, timeout=30, message="the run folder")
    wait_for(lambda: (run_dir / "merged.log").exists() and b"| up" in (run_dir / "merged.log").read_bytes(),
             timeout=30, message="the tasks' first output")
    shutil.rmtree(run_dir)
    out, err = proc.communicate(timeout=60)
    assert "Traceback" not in err, err
    assert proc.returncode in (0, 1)
    assert not sleeping(sleep)


def test_the_users_own_environment_wins_over_tflaunchs_defaults_and_env_sets_task_variables(tflaunch):
    done = tflaunch.run("--local", "2", "--env", "USER_COLOUR=blue", "--env", "TF_NUM_INTRAOP_THREADS=7", "--",
                        "python", TASK, "env", env={"PYTHONUNBUFFERED": "", "TF_USE_LEGACY_KERAS": "0"})
    assert done.returncode == 0, done.stderr
    envs = [env for name in ("worker-0", "worker-1") for env in env_lines_of(done.task_output(name))]
    assert len(envs) == 2
    assert all(e["USER_COLOUR"] == "blue" and e["TF_NUM_INTRAOP_THREADS"] == "7" for e in envs)
    assert all(e["PYTHONUNBUFFERED"] == "" for e in envs)  # the user's empty value, not tflaunch's 1
    assert "TF_USE_LEGACY_KERAS=1 set" not in done.stderr  # the user chose; no note about tflaunch's choice
    assert done.record["tasks"][0]["env"]["TF_USE_LEGACY_KERAS"] == "0"


def test_dry_run_names_the_layer_each_value_came_from(tflaunch):
    done = tflaunch.run("--local", "1", "--env", "A=1", "--dry-run", env={"OMP_NUM_THREADS": "3"})
    assert done.returncode == 0
    assert "  env: A=1  (--env)" in done.stdout
    assert "  env: TFLAUNCH_TASK=worker-0  (tflaunch)" in done.stdout


def test_env_cannot_set_a_variable_tflaunch_owns(tflaunch):
    done = tflaunch.run("--local", "1", "--env", "TF_CONFIG={}", "--dry-run")
    assert done.returncode == 2
    assert done.stderr == ("tflaunch: error: --env: TF_CONFIG: is set by tflaunch for every task and "
                           "cannot be overridden\n")


def test_runs_are_labelled_with_what_was_asked(tflaunch):
    done = tflaunch.run("--local", "2", "--chief", "--ps", "1", "--", "python", TASK, "exit:0")
    assert done.returncode == 0, done.stderr
    assert "4 tasks from --local 2 --chief --ps 1;" in done.stderr
    assert done.record["source"] == "--local 2 --chief --ps 1"
    listing = tflaunch.run("runs").stdout
    assert "--local 2 --chief --ps 1" in listing


def test_the_keras_note_appears_only_where_tflaunch_chose_legacy_keras_for_python(tflaunch):
    done = tflaunch.run("--local", "2", "--", "true")
    assert done.returncode == 0 and "TF_USE_LEGACY_KERAS" not in done.stderr


EVALUATOR_CLUSTER = """\
worker: [localhost:auto]
evaluator: [localhost:auto]
"""


@pytest.mark.parametrize("timeout, state", [("30", "succeeded"), ("1", "stopped")])
def test_an_evaluator_gets_time_to_finish_after_training(tflaunch, tmp_path, timeout, state):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(EVALUATOR_CLUSTER)
    done = tflaunch.run(str(cluster), "--evaluator-timeout", timeout, "--", "python", TASK,
                        "sleep-if:evaluator-0:4", "print:evaluated")
    assert done.returncode == 0, done.stderr
    evaluator = next(t for t in done.record["tasks"] if t["name"] == "evaluator-0")
    assert evaluator["state"] == state
    if state == "succeeded":
        assert evaluator["exit_code"] == 0 and "evaluated" in done.task_output("evaluator-0")
        assert "evaluator-0 finished on its own (exit code 0)" in done.stderr
    else:
        assert "still running 1 s after training ended: stopped (see --evaluator-timeout)" in done.stderr


# -- sealed runs: a task's own processes, network isolation, exposure -------------------------------

def test_a_task_killed_by_sigkill_takes_the_processes_it_detached_with_it(tflaunch):
    sleep = marker()
    escape = str(Path(TASK).with_name("escape.py"))
    proc = tflaunch.start("--local", "1", "--", "python", escape, sleep, "escape", "ready", "forever")
    wait_for(lambda: tflaunch.latest_run() and (tflaunch.latest_run() / "merged.log").exists()
             and "READY" in (tflaunch.latest_run() / "merged.log").read_text(), timeout=30, message="the task")
    (task,) = tflaunch.live_tasks()
    os.kill(task["pid"], signal.SIGKILL)  # as the OOM killer would: no chance to clean up
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGKILL and "Traceback" not in err
    assert [p.pid for p in descendants_alive(sleep) if p.pid != proc.pid] == []
    (task,) = record_of(tflaunch.latest_run())["tasks"]
    assert len(task["leftovers"]) == 2 and "worker-0 left 2 processes behind" in err


def test_isolation_without_unshare_is_one_line_and_starts_nothing(tflaunch, tmp_path):
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python").symlink_to(sys.executable)
    done = tflaunch.run("--local", "1", "--isolate-network", "--", "python", "-c", "pass",
                        env={"PATH": str(bare)})
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "tflaunch: error: --isolate-network: unshare not found (util-linux); nothing was started"]
    assert done.run_dir is None


def test_a_host_name_that_does_not_resolve_gets_no_exposure_warning_and_no_traceback(tflaunch, tmp_path):
    cluster = tmp_path / "unresolved.yaml"
    cluster.write_text("worker:\n  - no-such-host.invalid:2222\n  - 8.8.8.8:2222\n")
    done = tflaunch.run(str(cluster), "--dry-run", timeout=30)
    assert done.returncode == 0 and "Traceback" not in done.stderr
    warnings = [line for line in done.stderr.splitlines() if "public address" in line]
    assert len(warnings) == 1 and "8.8.8.8" in warnings[0] and "invalid" not in warnings[0]


@pytest.fixture
def silent_name_server(tmp_path):
    """The argv prefix that runs a command with this machine's /etc/resolv.conf replaced (in a mount
    namespace of its own) by one whose name server takes every query and answers none."""
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    # On a loopback address of its own (a name server listens on port 53): tests in parallel
    # workers each have theirs.
    for _ in range(50):
        address = f"127.{random.randrange(1, 255)}.{random.randrange(256)}.{random.randrange(1, 255)}"
        try:
            silent.bind((address, 53))  # takes the queries, answers none
            break
        except OSError:
            continue
    else:
        pytest.fail("no free loopback address for the silent name server")
    resolv = tmp_path / "resolv.conf"
    resolv.write_text(f"nameserver {address}\noptions timeout:5 attempts:1\n")
    yield ["unshare", "--mount", "--propagation", "private", "sh", "-c",
           'mount --bind "$0" /etc/resolv.conf && exec "$@"', str(resolv)]
    silent.close()


# The lookups wait on the silent name server far longer than the start takes on a loaded machine.
LOOKUPS_WAIT = {"TFLAUNCH_RESOLVE_TIMEOUT": "30"}


def test_a_name_server_that_never_answers_does_not_hold_the_start(tflaunch, tmp_path, silent_name_server):
    """The exposure check's lookups go to a name server that never answers: the task starts at once,
    rather than when the lookups give up (TFLAUNCH_RESOLVE_TIMEOUT, 8 s here), and the run ends
    cleanly, without a warning about a name that never resolved."""
    cluster = tmp_path / "unanswered.yaml"
    cluster.write_text("worker:\n  - {host: localhost, port: auto, address: tflaunch-unanswered.example}\n")
    argv = [*silent_name_server,
            *tflaunch.argv(str(cluster), "--log-dir", str(tflaunch.log_dir), "--", sys.executable, "-c", "print('up')")]
    launched = time.time()
    done = subprocess.run(argv, cwd=tflaunch.cwd, env=tflaunch.env({"TFLAUNCH_RESOLVE_TIMEOUT": "8"}),
                          capture_output=True, text=True, timeout=90)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "public address" not in done.stderr
    task = json.loads((tflaunch.latest_run() / "run.json").read_text())["tasks"][0]
    assert task["state"] == "succeeded"
    # Not held by the lookups: the task started long before they gave up, and the run ended
    # once it did (its exit waits for them, to show a late warning: hence not a bound on the run).
    assert datetime.fromisoformat(task["started_at"]).timestamp() - launched < 6


def test_a_launch_refused_while_its_names_are_looked_up_does_not_wait_for_the_lookups(tflaunch, tmp_path,
                                                                                        silent_name_server):
    busy = socket.socket()
    busy.bind(("0.0.0.0", 0))
    busy.listen()
    port = busy.getsockname()[1]
    cluster = tmp_path / "busy.yaml"
    cluster.write_text(f"worker:\n  - {{host: localhost, port: {port}, address: tflaunch-unanswered.example}}\n")
    # Unsealed: a sealed run's port is free inside its namespace, whatever holds it outside.
    argv = [*silent_name_server, *tflaunch.argv(str(cluster), "--no-seal", "--log-dir", str(tflaunch.log_dir), "--",
                                                 "true")]
    launched = time.monotonic()
    try:
        done = subprocess.run(argv, cwd=tflaunch.cwd, env=tflaunch.env(LOOKUPS_WAIT), capture_output=True,
                              text=True, timeout=90)
    finally:
        busy.close()
    assert done.returncode == 2 and "is already in use on this machine" in done.stderr, done.stderr
    assert time.monotonic() - launched < 15  # the lookups would have held it 30 s


@pytest.mark.parametrize("when, signum", [("run folder made", signal.SIGINT), ("task running", signal.SIGINT),
                                          ("task running", signal.SIGHUP)])
def test_ctrl_c_while_the_names_are_looked_up_ends_the_run_at_once(tflaunch, tmp_path, silent_name_server, when,
                                                                   signum):
    """Ctrl-C (or a hang-up) while the exposure check's lookups wait on a name server that never
    answers (they give up after TFLAUNCH_RESOLVE_TIMEOUT, 30 s here): tflaunch stops its task and exits
    128+N at once, without waiting for them, without a traceback, and leaves nothing running."""
    marker = f"tflaunch-lookups-{uuid.uuid4().hex[:8]}"
    ready = tmp_path / "ready"
    cluster = tmp_path / "unanswered.yaml"
    cluster.write_text("worker:\n  - {host: localhost, port: auto, address: tflaunch-unanswered.example}\n")
    task = f"import pathlib, time; pathlib.Path({str(ready)!r}).touch(); time.sleep(60)  # {marker}"
    argv = [*silent_name_server,
            *tflaunch.argv(str(cluster), "--log-dir", str(tflaunch.log_dir), "--", sys.executable, "-c", task)]
    launched = time.monotonic()
    proc = subprocess.Popen(argv, cwd=tflaunch.cwd, env=tflaunch.env(LOOKUPS_WAIT), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        if when == "task running":
            wait_for(ready.exists, timeout=15, message="the task to start while the names are looked up")
        else:  # the lookups began before the run folder, whose run.json comes before the task starts
            wait_for(lambda: any(Path(tflaunch.log_dir).glob("*/run.json")), timeout=15, interval=0.005,
                     message="the run folder")
        signalled = time.monotonic()
        assert signalled - launched < 15  # the lookups still wait: they give up 30 s after they began
        os.killpg(proc.pid, signum)  # as a terminal does: the whole foreground group
        out, err = proc.communicate(timeout=30)
        ended = time.monotonic()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + signum, err
    assert "Traceback" not in err and "public address" not in err, err
    assert ended - signalled < 1.0, f"exit {ended - signalled:.2f} s after the signal"
    wait_for(lambda: not descendants_alive(marker), timeout=5, message="nothing of the run left")


@pytest.mark.slow
def test_resource_figures_cover_every_attempt(tflaunch):
    script = 'sleep 2.5; [ "$TFLAUNCH_ATTEMPT" = 2 ]'  # attempt 1 fails, attempt 2 succeeds
    done = tflaunch.run("--local", "1", "--max-restarts", "1", "--restart-delay", "0", "--", "bash", "-c", script)
    assert done.returncode == 0, done.stderr
    figures = json.loads((done.run_dir / "resources.json").read_text())
    assert sorted(figures["attempts"]) == ["1", "2"]
    per_attempt = [figures["attempts"][k]["worker-0"]["samples"] for k in ("1", "2")]
    assert all(n >= 1 for n in per_attempt)
    assert figures["tasks"]["worker-0"]["samples"] == sum(per_attempt)


# worker-0 floods its output far faster than tflaunch can copy it into merged.log and notes when its
# SIGTERM came; worker-1 (when told to) notes when it fails, once the flood is well under way.
FLOOD_BESIDE_A_FAILURE = """\
import os, signal, sys, time
where, fail = sys.argv[1], sys.argv[2] == "fail"
if os.environ["TFLAUNCH_TASK"] == "worker-0":
    def stop(*_):
        open(os.path.join(where, "stopped"), "w").write(repr(time.time()))
        os._exit(143)
    signal.signal(signal.SIGTERM, stop)
    lines = b"a line of a flood that never ends\\n" * 2000
    while True:
        os.write(1, lines)
time.sleep(3 if fail else 3600)
open(os.path.join(where, "failed"), "w").write(repr(time.time()))
sys.exit(7)
"""


@pytest.mark.slow
def test_a_failure_beside_a_flood_stops_the_flooding_task_at_once(tflaunch, tmp_path):
    # tflaunch's own message that the cluster stops used to wait for the output pump, which never
    # caught up with the flood: the stop never came. Now it comes once the failure's status, behind
    # the flood's lines already on the channel, is read: 0.1 to 1.2 s here on a quiet machine and
    # beside four busy loops, 5.05 s once in a whole suite's run (a load average of about 8).
    done = tflaunch.run("--local", "2", "--log-max-size", "1M", "--", sys.executable, "-c", FLOOD_BESIDE_A_FAILURE,
                        str(tmp_path), "fail", timeout=120)
    assert done.returncode == 7, done.stderr[-2000:]
    stopped = float((tmp_path / "stopped").read_text()) - float((tmp_path / "failed").read_text())
    assert 0 <= stopped < 10.0, f"the flooding task was stopped {stopped:.2f} s after the failure"
    assert "failed (exit code 7): stopping the cluster" in done.stderr


@pytest.mark.slow
def test_sigterm_stops_a_run_whose_task_floods_its_output(tflaunch, tmp_path):
    proc = tflaunch.start("--local", "2", "--log-max-size", "1M", "--", sys.executable, "-c", FLOOD_BESIDE_A_FAILURE,
                          str(tmp_path), "sleep")
    merged = lambda: tflaunch.latest_run() and tflaunch.latest_run() / "merged.log"  # noqa: E731
    wait_for(lambda: merged() and merged().exists() and merged().stat().st_size > 1 << 20, timeout=60,
             message="the flood to be under way")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 143 and "Traceback" not in err, err[-2000:]
    assert (tmp_path / "stopped").exists()
    wait_for(lambda: not descendants_alive(str(tmp_path)), timeout=5, message="no task left")
