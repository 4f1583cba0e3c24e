"""What a run of many hosts costs tflaunch: TF_CONFIG kept once per cluster (in the plan, on the
wire and in run.json), heartbeats and samples spaced out as hosts grow while a silent host is still
lost within its keep-alive timeout, and descriptors that grow with hosts, not tasks.

The large runs use simulated hosts (``TFLAUNCH_SIMULATE_HOSTS=1``): every ssh host is the real
agent started here over pipes, with tflaunch's real links, hub, supervisor and run folder."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from launcher.cluster.plan import RunContext, TaskLaunch, plan_cluster
from launcher.cluster.tfconfig import ENV_STRING_MAX, TaskEnv, TfConfig
from launcher.cluster.reader import parse_cluster
from launcher.records.folder import RunFolder
from launcher.records.record import RunRecord
from launcher.records.states import TaskState
from launcher.run.console.writer import Console
from launcher.run.lifecycle.liverecord import LiveRecord
from launcher.run.lifecycle.task import Task
from launcher.run.lifecycle.wakeups import Wakeups
from launcher.agent.protocol import HEARTBEAT, beat_for, sample_for
from polling import wait_for

def hosts_file(path: Path, hosts: int, per_host: int, keepalive: float | None = None) -> Path:
    lines = [f"ssh: {{keepalive_timeout: {keepalive:g}}}"] if keepalive else []
    lines.append("worker:")
    for i in range(per_host):
        lines += [f"  - {{host: sim{h:04d}, port: {21000 + i}}}" for h in range(hosts)]
    path.write_text("\n".join(lines) + "\n")
    return path


def plan_of(text: str):
    spec = parse_cluster(text, "c.yaml", frozenset({"localhost"}))
    return plan_cluster(spec, RunContext("r", "/runs/r"), local_hosts=frozenset({"localhost"}),
                        cores_by_host={}, default_python="python3", default_workdir="/")


# -- TF_CONFIG once per cluster ------------------------------------------------------------------

def test_tf_config_in_parts_renders_the_text_tensorflow_reads():
    cluster = json.dumps({"chief": ["c:1"], "worker": ["a:1", "b:2"]}, separators=(",", ":"))
    config = TfConfig(cluster, "worker", 1)
    assert config.text() == json.dumps({"cluster": json.loads(cluster), "task": {"type": "worker", "index": 1}},
                                       separators=(",", ":"))
    assert config.task_text() == '{"task":{"type":"worker","index":1}}'
    assert cluster not in repr(config)  # a repr as long as the cluster would be quadratic again
    env = TaskEnv({"A": "1", "TF_CONFIG": config})
    assert list(env) == ["A", "TF_CONFIG"] and env["TF_CONFIG"] == config.text() and env.tf_config is config
    assert env.without_tf_config() == {"A": "1"}


def test_every_launch_of_a_cluster_shares_one_cluster_text():
    plan = plan_of("worker: [a:1, b:2, c:3]\nchief: [d:4]\nevaluator: [e:5]\n")
    texts = {launch.name: launch.env.tf_config.cluster for launch in plan.launches}
    trainers = [text for name, text in texts.items() if not name.startswith("evaluator")]
    assert all(text is trainers[0] for text in trainers)  # one string, not one copy per task
    assert "e:5" in texts["evaluator-0"] and "e:5" not in trainers[0]
    for launch in plan.launches:
        assert json.loads(launch.env["TF_CONFIG"])["task"] == {"type": launch.role, "index": launch.index}


def test_a_tf_config_longer_than_linux_allows_is_one_line_at_check_time(tflaunch, tmp_path):
    # 1,500 tasks of 100-character host names: each TF_CONFIG about 160 KB, over MAX_ARG_STRLEN.
    long = "n" * 90
    lines = ["worker:"] + [f"  - {{host: {long}{i:05d}, port: 2222}}" for i in range(1500)]
    path = tmp_path / "wide.yaml"
    path.write_text("\n".join(lines) + "\n")
    done = tflaunch.run(str(path), "--dry-run", "--", "true", timeout=120)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"tflaunch: error: {path}: 1500 tasks: their TF_CONFIG takes ")
    assert f"more than the {ENV_STRING_MAX:,} Linux lets one environment variable have" in done.stderr


def test_run_json_keeps_the_cluster_once_for_a_large_cluster(tflaunch):
    done = tflaunch.run("--local", "65", "--threads", "off", "--", "true", timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    record = done.record
    assert len(record["cluster"]["worker"]) == 65
    worker = record["tasks"][3]
    assert json.loads(worker["env"]["TF_CONFIG"]) == {"task": {"type": "worker", "index": 3}}
    small = tflaunch.run("--local", "2", "--threads", "off", "--", "true", timeout=120)
    assert json.loads(small.record["tasks"][1]["env"]["TF_CONFIG"])["cluster"] == small.record["cluster"]


# -- pacing --------------------------------------------------------------------------------------

def test_heartbeats_fit_the_keepalive_four_times_and_samples_space_out_with_hosts():
    # Four beats per keep-alive timeout at any size: a silent peer is noticed within it, no sooner
    # for more beats; a run of two hosts pays no more than one of a thousand.
    assert beat_for(1, 15) == beat_for(128, 15) == beat_for(1024, 15) == beat_for(100_000, 15) == 15 / 4
    assert beat_for(1, 2) == beat_for(100_000, 2) == HEARTBEAT  # never closer than one a second
    assert beat_for(1, None) == beat_for(128, None) == HEARTBEAT and beat_for(256, None) == 2.0  # no timeout
    assert sample_for(8) == 2.0 and sample_for(1024) == 8.0 and sample_for(100_000) == 10.0


# -- waking the supervisor -----------------------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Noted:
    """Changes as the link hub keeps them: the processes named since the last take."""

    def __init__(self) -> None:
        self.named: list[object] = []

    def fileno(self) -> int:
        return 0

    def take(self) -> list[object]:
        named, self.named = self.named, []
        return named


def tasks_with_processes(count: int) -> list[Task]:
    tasks = []
    for index in range(count):
        task = Task(TaskLaunch(f"worker-{index}", "worker", index, "h", "h:1", False, ("true",), {}, "/"))
        task.process = object()
        tasks.append(task)
    return tasks


def test_the_supervisor_polls_what_changed_and_every_task_only_now_and_then():
    clock, noted = Clock(), Noted()
    tasks = tasks_with_processes(1000)
    wakeups = Wakeups(tasks, noted, clock, tick=0.25, full_poll=10.0)
    for task in tasks:
        wakeups.started(task)
    assert len(wakeups.due()) == 1000  # the first turn: every task, just started
    clock.now = 1.0
    assert wakeups.due() == []  # nothing changed: nothing polled
    noted.named = [tasks[700].process, tasks[3].process, object()]  # a process of no task is ignored
    assert wakeups.due() == [tasks[3], tasks[700]]  # in the tasks' order
    assert wakeups.sleep(0.02, watching=False) == (0.25, (0,))  # then it sleeps on the changes
    clock.now = 10.5
    assert len(wakeups.due()) == 1000  # the net under a change that went unsaid
    clock.now = 11.0
    assert len(wakeups.due(tasks[:10], full_every=0.1)) == 10  # stopping: a shorter period at once
    clock.now = 11.05
    assert wakeups.due(tasks[:10], full_every=0.1) == []
    without = Wakeups(tasks, None, clock, tick=0.25, full_poll=10.0)
    assert len(without.due()) == 1000 and without.sleep(0.02, watching=True) == (0.02, ())


def test_without_a_hang_watchdog_the_supervisor_takes_a_turn_when_one_is_due():
    clock, noted = Clock(), Noted()
    due_in = [1.0]  # what the run asks: nothing waits, so the quiet turn
    wakeups = Wakeups(tasks_with_processes(3), noted, clock, tick=0.25, full_poll=10.0, watch_in=lambda: due_in[0])
    assert len(wakeups.due()) == 3 and wakeups.watch_due()  # the first turn comes at once
    assert wakeups.sleep(0.02, watching=True) == (1.0, (0,))  # a second, not a tick
    clock.now = 0.5
    assert not wakeups.watch_due()
    due_in[0] = 0.1  # a change came meanwhile and is due in 0.1 s: the turn comes forward
    assert wakeups.sleep(0.02, watching=True) == (pytest.approx(0.1), (0,))
    clock.now = 0.6
    assert wakeups.watch_due()
    due_in[0] = 1.0
    clock.now = 9.9
    assert wakeups.watch_due() and wakeups.sleep(0.02, watching=True) == (pytest.approx(0.1), (0,))  # the full poll
    ticking = Wakeups(tasks_with_processes(3), noted, clock, tick=0.25, full_poll=10.0)  # a hang watchdog looks
    assert ticking.due() and ticking.watch_due() and ticking.sleep(0.02, watching=True) == (0.25, (0,))  # every tick


def test_the_live_record_says_when_its_waiting_change_is_due(tmp_path):
    folder = RunFolder.create(tmp_path, "cluster.yaml")
    live = LiveRecord(RunRecord(run_id=folder.run_id, source="cluster.yaml"), folder,
                      Console(io.StringIO(), messages=io.StringIO(), quiet=True), tasks=64)
    assert live.due_in(1.0) == 1.0  # nothing waits
    plan = plan_of("worker:\n  - {host: localhost, port: 2222}\n")
    live.wrote()  # the first copy was just written: the next waits for its pace (1 s at 64 tasks)
    live.write(plan, [Task(plan.launches[0])])
    assert 0.9 < live.due_in(5.0) <= live.pace
    assert live.due_in(0.5) == 0.5



def test_the_live_record_has_the_ended_tasks_output_read_before_the_console_hears_they_ended(tmp_path):
    folder = RunFolder.create(tmp_path, "cluster.yaml")
    heard: list[tuple] = []

    class Listening(Console):
        def task_states(self, states, attempt):
            heard.append(("states", sorted(name for name, state in states.items() if state.ended)))

    live = LiveRecord(RunRecord(run_id=folder.run_id, source="cluster.yaml"), folder,
                      Listening(io.StringIO(), messages=io.StringIO(), quiet=True), tasks=2)
    live.read_out = lambda names, attempt: heard.append(("read", names, attempt))
    live.pace = 0.0  # every change shown at once
    plan = plan_of("worker:\n  - {host: localhost, port: 2222}\n  - {host: localhost, port: 2223}\n")
    tasks = [Task(launch) for launch in plan.launches]
    live.changed(plan, tasks)
    tasks[1].state = TaskState.FAILED
    live.changed(plan, tasks)
    tasks[0].state = TaskState.SUCCEEDED
    live.changed(plan, tasks)  # the last to end: shown at once
    assert heard == [("states", []), ("read", ["worker-1"], 1), ("states", ["worker-1"]),
                     ("read", ["worker-0"], 1), ("states", ["worker-0", "worker-1"])]

# -- simulated hosts -----------------------------------------------------------------------------

def all_up(tflaunch, count: int, before: Path | None) -> bool:
    """Whether a run newer than ``before`` has ``count`` tasks that printed "up"."""
    return tflaunch.latest_run() != before and tflaunch.merged_text().count("| up\n") >= count


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def run_until_up(tflaunch, path: Path, tasks: int, command: str, timeout: float = 240) -> subprocess.Popen:
    before = tflaunch.latest_run()
    proc = tflaunch.start(str(path), "--quiet", "--no-check", "--", "sh", "-c", command)
    wait_for(lambda: all_up(tflaunch, tasks, before) or proc.poll() is not None, timeout=timeout,
             message=lambda: f"{tasks} tasks up (seen {tflaunch.merged_text().count('| up')})")
    assert proc.poll() is None, proc.communicate()[1][-2000:]
    return proc


def release(fifo: Path, proc: subprocess.Popen) -> None:
    """End every task waiting to read ``fifo`` (``cat``): a writer opens and closes it, and each
    reader sees EOF; again until the run ends, for any reader that came to the FIFO late."""
    while proc.poll() is None:
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass  # no reader waiting at this moment
        try:
            proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            pass


# What a run needs before its first host connection starts, and only that: the name lookups, the
# session, the output pump and the modules of rare paths load while the hosts are being reached.
_FIRST_CONNECTION = """
import json, os, sys, threading
import launcher.__main__ as entry
import launcher.transports.simulated as simulated

def first_connection(*args, **kwargs):
    print(json.dumps({"modules": sorted(sys.modules), "threads": [t.name for t in threading.enumerate()]}))
    sys.stdout.flush()
    os._exit(0)

simulated.spawn_carrier = first_connection
sys.argv = ["tflaunch", *sys.argv[1:]]
entry.main()
"""


def test_every_host_connection_starts_before_what_it_does_not_need_is_loaded(tmp_path):
    path = hosts_file(tmp_path / "h4.yaml", 4, 2)
    done = subprocess.run([sys.executable, "-c", _FIRST_CONNECTION, str(path), "--no-check", "--log-dir",
                           str(tmp_path / "logs"), "--", "true"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "TFLAUNCH_SIMULATE_HOSTS": "1"}, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout)
    loaded = set(seen["modules"])
    assert "launcher.transports.simulated" in loaded and "yaml" in loaded  # the cluster file was read
    later = {"launcher.run.lifecycle.session", "launcher.run.output.pump", "launcher.run.lifecycle.supervisor", "launcher.cluster.exposure",
             "tempfile", "difflib"}
    assert not loaded & later, sorted(loaded & later)
    assert "tflaunch-exposure" not in seen["threads"]
    assert not (tmp_path / "logs").exists()  # nor is the run folder made yet


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_many_simulated_hosts_run_and_cost_descriptors_per_host_not_per_task(tflaunch, tmp_path, monkeypatch):
    monkeypatch.setenv("TFLAUNCH_SIMULATE_HOSTS", "1")
    fifo = tmp_path / "release"
    os.mkfifo(fifo)
    counts = {}
    for hosts, per_host in ((64, 1), (64, 8), (256, 1)):
        path = hosts_file(tmp_path / f"h{hosts}x{per_host}.yaml", hosts, per_host)
        proc = run_until_up(tflaunch, path, hosts * per_host, f"echo up; exec cat {fifo}")
        counts[hosts, per_host] = descriptors(proc.pid)
        release(fifo, proc)
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-2000:]
        record = json.loads((tflaunch.latest_run() / "run.json").read_text())
        assert {t["state"] for t in record["tasks"]} == {"succeeded"} and len(record["tasks"]) == hosts * per_host
    # 448 more tasks on the same 64 hosts: a few more descriptors at most (the bounded caches of
    # open log files), where one descriptor per task would be 448.
    assert counts[64, 8] - counts[64, 1] < 64, counts
    # 192 more hosts: about three descriptors each (the agent's two pipe ends and its stderr file).
    per_host = (counts[256, 1] - counts[64, 1]) / 192
    assert 2.5 <= per_host <= 4, counts


def agent_of(task_pid: int) -> psutil.Process:
    return psutil.Process(task_pid).parent()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_silent_host_among_256_is_lost_within_its_keepalive_timeout(tflaunch, tmp_path, monkeypatch):
    monkeypatch.setenv("TFLAUNCH_SIMULATE_HOSTS", "1")
    keepalive = 5.0
    assert beat_for(256, keepalive) > HEARTBEAT  # heartbeats are spaced out in this run
    path = hosts_file(tmp_path / "h256.yaml", 256, 1, keepalive=keepalive)
    proc = run_until_up(tflaunch, path, 256, "echo up; exec sleep 300")
    run_dir = tflaunch.latest_run()

    def pid_of(name: str) -> int | None:
        try:
            return next(t["pid"] for t in json.loads((run_dir / "run.json").read_text())["tasks"] if t["name"] == name)
        except (OSError, ValueError):
            return None

    wait_for(lambda: pid_of("worker-77") is not None, timeout=30, message="worker-77's pid in run.json")
    task = psutil.Process(pid_of("worker-77"))
    agent = agent_of(task.pid)
    family = [agent.pid, *(p.pid for p in psutil.Process(proc.pid).children(recursive=True))]
    stopped = time.monotonic()
    agent.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: "lost connection to sim0077" in tflaunch.merged_text(), timeout=60,
                 message="sim0077 to be declared lost")
        lost_after = time.monotonic() - stopped
    finally:
        try:
            agent.send_signal(signal.SIGCONT)
        except psutil.NoSuchProcess:
            pass
    out, err = proc.communicate(timeout=120)
    # Silence is counted from the agent's last frame, before the stop; the hub looks once a second.
    assert lost_after <= keepalive + 2.0, lost_after
    assert proc.returncode == 255, err[-2000:]
    assert "no word from its agent within the 5 s keep-alive timeout" in tflaunch.merged_text()
    record = json.loads((run_dir / "run.json").read_text())
    assert record["root_cause"]["task"] == "worker-77" and record["root_cause"]["host"] == "sim0077"
    wait_for(lambda: not [p for p in family if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"],
             timeout=30, message="every agent and task of the run to be gone")
