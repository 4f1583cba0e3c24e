"""Real-process tests of ``tflaunch`` on this machine, with tiny helper tasks (no TensorFlow)."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
import uuid

import psutil
import pytest

from conftest import TASK, descendants_alive, env_lines_of
from launcher.cluster.machine import gpu_count
from polling import wait_for

pytestmark = pytest.mark.timeout(120)


def test_tf_config_arrives_intact_in_every_task(tflaunch):
    done = tflaunch.run("--local", "3", "--chief", "--", "python", TASK, "env")
    assert done.returncode == 0, done.stderr
    manifest = done.record
    names = [t["name"] for t in manifest["tasks"]]
    assert names == ["chief-0", "worker-0", "worker-1", "worker-2"]
    clusters = []
    for task in manifest["tasks"]:
        (seen,) = env_lines_of(done.task_output(task["name"]))
        config = json.loads(seen["TF_CONFIG"])
        assert seen["TF_CONFIG"] == task["env"]["TF_CONFIG"]
        assert config["task"] == {"type": task["role"], "index": task["index"]}
        assert seen["TFLAUNCH_TASK"] == task["name"]
        assert seen["CUDA_VISIBLE_DEVICES"] == "-1"
        assert seen["PYTHONUNBUFFERED"] == "1"
        assert seen["TFLAUNCH_RUN_DIR"] == str(done.run_dir.resolve())
        # Ranks as TensorFlow numbers the tasks: the chief 0, then the workers by index; one host.
        rank = 0 if task["role"] == "chief" else task["index"] + 1
        assert [seen[f"TFLAUNCH_{k}"] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")] == [
            str(rank), "4", str(rank), "4"], task["name"]
        clusters.append(config["cluster"])
    assert all(c == clusters[0] for c in clusters)
    assert len(clusters[0]["worker"]) == 3 and len(clusters[0]["chief"]) == 1
    ports = [a.rsplit(":", 1)[1] for addrs in clusters[0].values() for a in addrs]
    assert len(set(ports)) == 4
    assert manifest["status"] == "succeeded" and manifest["exit_code"] == 0
    assert all(t["state"] == "succeeded" and t["exit_code"] == 0 for t in manifest["tasks"])


def test_tasks_failing_in_the_same_moment_are_failed_and_only_those_the_stop_ended_are_stopped(tflaunch):
    # Six tasks exit 1 within a few milliseconds: the first is the root cause, and the others whose
    # exit came while tflaunch was stopping the cluster failed on their own all the same.
    for _ in range(3):
        done = tflaunch.run("--local", "6", "--", "python", TASK, "sleep:0.5", "exit:1")
        assert done.returncode == 1, done.stderr
        for task in done.record["tasks"]:
            own = task["signal"] is None
            assert task["state"] == ("failed" if own and task["exit_code"] == 1 else "stopped"), task
        rows = [line.split() for line in done.stderr.splitlines() if re.match(r"tflaunch:   worker-", line)]
        assert rows and all(row[3:5] == ["failed", "exit"] or row[3:6] == ["stopped", "SIGTERM", "from"] for row in rows)


def test_a_closing_summary_counts_in_english_and_prints_no_empty_tail(tflaunch):
    done = tflaunch.run("--local", "1", "--", "python", TASK, "exit:1")
    assert done.returncode == 1
    lines = [line.removeprefix("tflaunch: ") for line in done.stderr.splitlines()]
    assert f"run {done.run_dir.name}: 1 task from --local 1; logs in {done.run_dir}" in lines
    assert "root cause: worker-0 (host localhost, exit code 1)" in lines  # and no "last 0 lines" header
    assert not any("last 0" in line or "1 tasks" in line for line in lines), lines
    done = tflaunch.run("--local", "1", "--", "python", TASK, "print:the only line", "exit:1")
    assert "root cause: worker-0 (host localhost, exit code 1); last line of its output:" in done.stderr
    done = tflaunch.run("--local", "1", "--", "python", TASK, "exit:0")
    assert re.search(r"^tflaunch: run \S+ succeeded in \d+\.\d s \(1 task\)$", done.stderr, re.M), done.stderr


def test_cluster_file_env_layers_reach_the_task(tflaunch, tmp_path):
    cluster = tmp_path / "c.yaml"
    cluster.write_text(
        "env: {USER_A: cluster, USER_B: cluster}\n"
        "worker:\n"
        "  - host: localhost\n    port: auto\n    env: {USER_B: task, USER_C: 'it''s $(x); y'}\n"
    )
    done = tflaunch.run(str(cluster), "--", "python", TASK, "env")
    assert done.returncode == 0, done.stderr
    (seen,) = env_lines_of(done.task_output("worker-0"))
    assert seen["USER_A"] == "cluster" and seen["USER_B"] == "task" and seen["USER_C"] == "it's $(x); y"


def test_first_failure_stops_everyone_and_sets_exit_code(tflaunch):
    done = tflaunch.run("--local", "3", "--", "python", TASK, "print:starting", "stderr:about to fail",
                        "exit-if:worker-1:3", "forever")
    assert done.returncode == 3
    lines = done.stderr.splitlines()
    root = next(i for i, line in enumerate(lines) if "root cause" in line)
    assert "worker-1" in lines[root] and "localhost" in lines[root] and "exit code 3" in lines[root]
    assert "about to fail" in "\n".join(lines[root:root + 4])
    assert lines.index(next(line for line in lines if "other tasks" in line)) > root
    manifest = done.record
    states = {t["name"]: t["state"] for t in manifest["tasks"]}
    assert states == {"worker-0": "stopped", "worker-1": "failed", "worker-2": "stopped"}
    assert manifest["root_cause"]["task"] == "worker-1"
    assert manifest["root_cause"]["exit_code"] == 3
    assert "about to fail" in manifest["root_cause"]["tail"]


def test_signal_death_exits_128_plus_n(tflaunch):
    done = tflaunch.run("--local", "2", "--", "python", TASK, "signal-if:worker-0:SIGKILL", "forever")
    assert done.returncode == 128 + signal.SIGKILL
    assert "killed by SIGKILL" in done.stderr
    assert "diagnosis (killed): killed by SIGKILL with no Python error" in done.stderr
    assert done.record["root_cause"]["diagnosis"]["rule"] == "killed"
    assert done.record["attempts"][0]["diagnosis"] == "killed"


def test_task_ignoring_sigterm_is_killed_after_grace(tflaunch):
    start = time.monotonic()
    done = tflaunch.run("--local", "2", "--grace", "1", "--", "python", TASK, "ignore-term",
                        "sleep-if:worker-0:1", "exit-if:worker-0:4", "forever")
    assert done.returncode == 4
    assert time.monotonic() - start < 30
    worker1 = next(t for t in done.record["tasks"] if t["name"] == "worker-1")
    assert worker1["state"] == "stopped" and worker1["signal"] == signal.SIGKILL


def test_failure_stop_does_not_wait_the_full_grace(tflaunch):
    start = time.monotonic()
    done = tflaunch.run("--local", "2", "--grace", "20", "--", "python", TASK, "ignore-term",
                        "sleep-if:worker-0:1", "exit-if:worker-0:4", "forever")
    elapsed = time.monotonic() - start
    assert done.returncode == 4
    worker1 = next(t for t in done.record["tasks"] if t["name"] == "worker-1")
    assert worker1["state"] == "stopped" and worker1["signal"] == signal.SIGKILL
    assert elapsed < 10  # 1 s of grace after the failure, not 20


def test_missing_program_fails_clearly(tflaunch):
    done = tflaunch.run("--local", "1", "--", "no-such-program-xyz")
    assert done.returncode == 127
    assert "no-such-program-xyz" in done.stderr and "not found" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupt_leaves_no_process_behind(tflaunch, signum, code):
    marker = f"marker-{uuid.uuid4().hex}"
    proc = tflaunch.start("--local", "2", "--", "python", TASK, f"print:{marker}", "child", "forever", marker)
    # Grandchildren do not carry the marker in their command line: follow them by pid.
    def both_children() -> list[int]:
        found = re.findall(r"CHILD (\d+)", tflaunch.merged_text())
        return [int(pid) for pid in found] if len(found) == 2 else []

    children = [psutil.Process(pid) for pid in wait_for(both_children, timeout=30, message="both tasks' children")]
    family = descendants_alive(marker)
    assert len(family) >= 2
    proc.send_signal(signum)
    proc.communicate(timeout=30)
    assert proc.returncode == code
    # tflaunch has killed them all before it exits; the kernel may still be tearing them down.
    wait_for(lambda: not living(family + children), timeout=5,
             message=lambda: f"every task and grandchild to end; alive: {living(family + children)}")
    assert json.loads((tflaunch.latest_run() / "run.json").read_text())["status"] == "stopped"


def test_successful_task_leftover_children_are_cleaned_up(tflaunch):
    done = tflaunch.run("--local", "1", "--", "python", TASK, "child", "exit:0")
    assert done.returncode == 0
    (pid,) = [int(m) for m in re.findall(r"CHILD (\d+)", done.task_output("worker-0"))]
    wait_for(lambda: not living([pid]), timeout=5, message=f"the leftover child {pid} to end")


def living(procs: list[psutil.Process | int]) -> list[int]:
    """The pids among ``procs`` (psutil handles, or pids) whose process still runs and is no zombie."""
    alive = []
    for proc in procs:
        try:
            proc = proc if isinstance(proc, psutil.Process) else psutil.Process(proc)
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc.pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def test_ps_cluster_succeeds_when_chief_exits_zero(tflaunch):
    done = tflaunch.run("--local", "2", "--ps", "1", "--", "python", TASK, "sleep-if:chief-0:1",
                        "exit-if:chief-0:0", "forever")
    assert done.returncode == 0, done.stderr
    states = {t["name"]: t["state"] for t in done.record["tasks"]}
    assert states == {"chief-0": "succeeded", "worker-0": "stopped", "worker-1": "stopped", "ps-0": "stopped"}


def test_port_in_use_is_reported_before_launch(tflaunch, tmp_path):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    try:
        cluster = tmp_path / "busy.yaml"
        cluster.write_text(f"worker:\n  - localhost:auto\n  - localhost:{port}\n")
        # Unsealed: in a sealed run's namespace of its own the port is free (tests/run/checks/test_isolation.py).
        done = tflaunch.run(str(cluster), "--no-seal", "--", "python", TASK, "env")
    finally:
        busy.close()
    assert done.returncode == 2
    assert f"localhost:{port}" in done.stderr and "worker-1" in done.stderr and "in use" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert done.run_dir is None  # nothing started, no run folder


@pytest.mark.parametrize("cluster", [["--local", "4"], ["-H", "localhost:3"]])
def test_concurrent_local_runs_do_not_collide(tflaunch, cluster):
    # Three runs at once pick their auto ports on this machine: every task binds its own.
    procs = [tflaunch.start(*cluster, "--quiet", "--", "python", TASK, "bind", "sleep:2") for _ in range(3)]
    results = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [r[1] for r in results]


def test_config_errors_are_one_line_with_exit_2(tflaunch, tmp_path):
    cluster = tmp_path / "bad.yaml"
    cluster.write_text("worker:\n  - host: localhost\n    prot: 2222\n")
    done = tflaunch.run(str(cluster))
    assert done.returncode == 2
    assert done.stderr.strip() == f"tflaunch: error: {cluster}: worker[0].prot: unknown key; did you mean 'port'?"
    missing = tflaunch.run(str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "no such cluster file" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_usage_errors_exit_2(tflaunch):
    both = tflaunch.run("--local", "2", "clusters/x.yaml")
    assert both.returncode == 2 and "Traceback" not in both.stderr
    bad = tflaunch.run("--local", "0")
    assert bad.returncode == 2


def test_dry_run_shows_plan_and_starts_nothing(tflaunch):
    done = tflaunch.run("--local", "2", "--chief", "--dry-run", "--", "python", "train.py", "--lr", "0.1")
    assert done.returncode == 0
    assert "chief-0: host localhost" in done.stdout and "worker-1: host localhost" in done.stdout
    assert f"command: {sys.executable} train.py --lr 0.1" in done.stdout
    assert "TF_CONFIG=" in done.stdout and "CUDA_VISIBLE_DEVICES=-1" in done.stdout
    assert "workdir: " in done.stdout
    assert done.run_dir is None


def test_console_task_filter_and_quiet(tflaunch):
    shown = tflaunch.run("--local", "2", "--tasks", "worker-1", "--", "python", TASK, "print:hello")
    assert "worker-1 | hello" in shown.stdout and "worker-0" not in shown.stdout
    assert shown.merged.count(b"| hello") == 2  # files keep everything
    quiet = tflaunch.run("--local", "2", "--quiet", "--", "python", TASK, "print:hello")
    assert quiet.stdout == "" and "succeeded" in quiet.stderr


def test_unknown_console_task_is_one_line_error_before_anything_starts(tflaunch, tmp_path):
    for extra in ((), ("--dry-run",)):
        done = tflaunch.run("--local", "2", "--tasks", "worker-0,worker-7", *extra, "--", "python", TASK, "forever")
        assert (done.returncode, done.stdout) == (2, "")
        assert done.stderr == ("tflaunch: error: --tasks worker-0,worker-7: --local 2 has no task 'worker-7'; "
                               "its tasks are: worker-0, worker-1\n")
        assert done.run_dir is None  # nothing started, no run folder
    cluster = tmp_path / "ps.yaml"
    cluster.write_text("chief:\n  - localhost:auto\nworker:\n  - localhost:auto\nps:\n  - localhost:auto\n")
    done = tflaunch.run(str(cluster), "--tasks", "evaluator-0,ps-0,ps-1", "--dry-run")
    assert done.returncode == 2
    assert done.stderr == (f"tflaunch: error: --tasks evaluator-0,ps-0,ps-1: {cluster} has no task 'evaluator-0', "
                           f"'ps-1'; its tasks are: chief-0, worker-0, ps-0\n")


def test_log_integrity_under_flood(tflaunch):
    lines_per_task = 40_000
    done = tflaunch.run("--local", "4", "--quiet", "--", "python", TASK, f"flood:{lines_per_task}",
                        "raw:6869ff0d70726f67726573733a20353025", "raw:0d70726f67726573733a20313030250a",
                        "partial:no newline at the end")
    assert done.returncode == 0, done.stderr
    merged = done.merged.split(b"\n")
    for n in range(4):
        name = f"worker-{n}"
        mine = [line.split(b" | ", 1)[1] for line in merged if line[24:].startswith(b"[1] " + name.encode() + b" ")]
        numbered = [line for line in mine if line.startswith(f"{name} line ".encode())]
        assert len(numbered) == lines_per_task
        assert len(set(numbered)) == lines_per_task
        # "hi\xff\rprogress: 50%\rprogress: 100%\n" is one line drawn in place: merged.log keeps what it shows.
        assert mine[-2:] == [b"progress: 100%", b"no newline at the end"]
        raw = (done.run_dir / f"{name}.log").read_bytes()
        assert raw.count(b"\n") == lines_per_task + 1 and raw.endswith(b"no newline at the end")


def test_crash_mid_line_keeps_the_partial_line(tflaunch):
    done = tflaunch.run("--local", "1", "--", "python", TASK, "partial:half a li", "signal-if:worker-0:SIGKILL")
    assert done.returncode == 137
    assert b"[1] worker-0 | half a li\n" in done.merged
    assert "half a li" in done.record["root_cause"]["tail"]


def test_python_dash_m_launcher_and_version():
    out = subprocess.run([sys.executable, "-m", "launcher", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and "tflaunch" in out.stdout


def test_the_closing_summary_of_forty_tasks_folds_alike_tasks_while_status_and_run_json_list_each(tflaunch):
    script = 'case "$TFLAUNCH_TASK" in worker-7) exit 3;; worker-20) exit 0;; *) exec sleep 600;; esac'
    done = tflaunch.run("--local", "40", "--", "bash", "-c", script)
    assert done.returncode == 3, done.stderr[-3000:]
    rows = [line.split() for line in done.stderr.splitlines() if re.match(r"tflaunch:   worker-", line)]
    assert [row[1:3] for row in rows] == [["worker-[0-6,8-19,21-39]", "(38"], ["worker-20", "localhost"]]
    assert rows[0][4:9] == ["localhost", "stopped", "SIGTERM", "from", "tflaunch"]
    record = done.record
    assert len(record["tasks"]) == 40 and record["root_cause"]["task"] == "worker-7"
    status = subprocess.run(tflaunch.argv("status", "--log-dir", str(tflaunch.log_dir)), cwd=tflaunch.cwd,
                            env=tflaunch.env(), capture_output=True, text=True, timeout=60)
    # The tasks' table ends at the first blank line; a table of resource use may follow it, when the
    # sampler caught some of the tasks before the run ended.
    tasks_table = status.stdout.split("\n\n", 1)[0]
    assert len(re.findall(r"^worker-\d+ ", tasks_table, re.M)) == 40, status.stdout


@pytest.mark.skipif(gpu_count() != 0, reason="needs a machine without GPUs")
def test_gpus_on_a_machine_without_gpus_is_one_warning_and_the_run_goes_on(tflaunch):
    done = tflaunch.run("--local", "2", "--chief", "--gpus", "0,1", "--", "python", TASK, "env")
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if "GPU" in line]
    assert warnings == ["tflaunch: warning: this machine has no GPU, but GPU 0,1 is given to chief-0, worker-0, "
                        "worker-1; they will run on the CPU"], done.stderr
    # The tasks get what was asked, as on a machine with GPUs.
    assert [env_lines_of(done.task_output(name))[0]["CUDA_VISIBLE_DEVICES"] for name in ("chief-0", "worker-0")] == \
        ["0", "1"]
