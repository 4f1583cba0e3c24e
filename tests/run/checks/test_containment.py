"""Sealed runs, with real processes: whatever a task starts, also in a session of its own or by
double-forking, ends with the run (success, failure, Ctrl-C, SIGTERM, before a restart), on this
machine and on the namespaced ssh test hosts, and a SIGKILLed tflaunch takes its tasks with it."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
import uuid
from pathlib import Path

import psutil
import pytest

from conftest import HELPERS, marked
from launcher.transports.local import AGENT_BOOT
from polling import wait_for

ESCAPE = str(HELPERS / "escape.py")



def new_marker() -> str:
    return f"m-{uuid.uuid4().hex}"


def merged_text(tflaunch) -> str:
    run_dir = tflaunch.latest_run()
    merged = run_dir / "merged.log" if run_dir else None
    return merged.read_text() if merged and merged.exists() else ""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def leftovers_of(manifest: dict) -> dict[str, list[str]]:
    return {t["name"]: t.get("leftovers", []) for t in manifest["tasks"]}


def assert_leftovers_named(manifest: dict) -> None:
    """Each task that ran to its own end names both its escapees; one stopped early (its peer
    failed first) may not have started them all yet."""
    for task in manifest["tasks"]:
        items = task.get("leftovers", [])
        expected = range(3) if task["state"] == "stopped" and task["signal"] else range(2, 3)
        assert len(items) in expected and all(re.fullmatch(r"python[\d.]* \(pid \d+\)", i) for i in items), task


@pytest.mark.parametrize("ending, code", [("exit:0", 0), ("exit:3", 3)])
def test_escaped_processes_end_with_the_run_and_are_named(tflaunch, ending, code):
    marker = new_marker()
    done = tflaunch.run("--local", "2", "--", "python", ESCAPE, marker, "escape", ending)
    assert done.returncode == code, done.stderr
    assert marked(marker) == []
    assert_leftovers_named(done.record)
    for task in done.record["tasks"]:
        if task["leftovers"]:
            count = len(task["leftovers"])
            assert (f"{task['name']} left {count} process{'es' if count > 1 else ''} behind: "
                    f"{', '.join(task['leftovers'])}, stopped") in done.stderr


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_escaped_processes_end_when_tflaunch_is_stopped(tflaunch, signum, code):
    marker = new_marker()
    proc = tflaunch.start("--local", "2", "--", "python", ESCAPE, marker, "escape", "ready", "forever")
    try:
        wait_for(lambda: merged_text(tflaunch).count("READY") == 2, timeout=30, message="both tasks to be ready")
        assert len(set(marked(marker)) - {proc.pid}) == 6  # two tasks, each with two escapees
        proc.send_signal(signum)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == code
    assert marked(marker) == []
    manifest = json.loads((tflaunch.latest_run() / "run.json").read_text())
    assert all(len(items) == 2 for items in leftovers_of(manifest).values()), manifest["tasks"]


def test_a_detached_port_holder_is_gone_before_the_restart(tflaunch):
    marker, port = new_marker(), free_port()
    # Attempt 1 leaves a detached process listening on the port, then fails; attempt 2 must bind it.
    done = tflaunch.run("--local", "1", "--max-restarts", "1", "--restart-delay", "0", "--",
                        "python", ESCAPE, marker, f"hold-port:{port}", "fail-first:4", f"bind:{port}", "exit:0")
    assert done.returncode == 0, done.stderr
    assert [a["outcome"] for a in done.record["attempts"]] == ["failed", "succeeded"]
    second = (done.run_dir / "worker-0.log").read_text()
    assert f"BOUND {port}" in second
    assert re.search(r"worker-0 left 1 process behind in attempt 1: python[\d.]* \(pid \d+\), stopped",
                     done.stderr), done.stderr
    assert marked(marker) == []


def test_sigkilled_tflaunch_takes_its_tasks_and_their_groups_with_it(tflaunch):
    marker = new_marker()
    proc = tflaunch.start("--local", "2", "--", "python", ESCAPE, marker, "escape", "ready", "forever")
    try:
        wait_for(lambda: merged_text(tflaunch).count("READY") == 2, timeout=30, message="both tasks to be ready")
        tasks = tflaunch.live_tasks()
        task_pids = [t["pid"] for t in tasks]
        groups = [os.getpgid(pid) for pid in task_pids]
        assert len(set(marked(marker)) - {proc.pid}) == 6
        proc.kill()
        killed_at = time.monotonic()
        proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)

    def group_members() -> list[int]:
        members = []
        for p in psutil.process_iter(["pid"]):
            try:
                if os.getpgid(p.pid) in groups and p.status() != psutil.STATUS_ZOMBIE:
                    members.append(p.pid)
            except (ProcessLookupError, psutil.NoSuchProcess):
                pass
        return members

    # The tasks sleep "forever" (600 s): only tflaunch's death can end them this soon.
    wait_for(lambda: not marked(marker) and not group_members(), timeout=10, interval=0.02,
             message=lambda: f"the tasks to end; left: {marked(marker)} {group_members()}")
    assert time.monotonic() - killed_at < 5.0


def test_task_pid_is_the_task_not_its_agent(tflaunch):
    proc = tflaunch.start("--local", "1", "--", "python", ESCAPE, new_marker(), "ready", "forever")
    try:
        wait_for(lambda: "READY" in merged_text(tflaunch), timeout=30, message="the task to be ready")
        (task,) = tflaunch.live_tasks()
        cmdline = psutil.Process(task["pid"]).cmdline()
        assert cmdline[1] == ESCAPE, cmdline
        agent = psutil.Process(task["pid"]).parent()
        assert agent.pid != proc.pid and AGENT_BOOT in agent.cmdline()
        assert agent.parent().pid == proc.pid
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
    assert proc.returncode == 130


# -- the same on the namespaced ssh test hosts ----------------------------------------------------

def remote_cluster(tmp_path: Path, testhosts) -> Path:
    node1, node2 = testhosts.hosts[:2]
    port = testhosts.port()
    path = tmp_path / "remote.yaml"
    path.write_text(f"ssh:\n  options: {json.dumps(testhosts.ssh_options)}\n  connect_timeout: 3\n"
                    f"  keepalive_timeout: 4\n"
                    f"worker:\n  - host: node1\n    address: {node1.address}\n    port: {port}\n"
                    f"  - host: node2\n    address: {node2.address}\n    port: {port}\n")
    return path


def remote_marked(testhosts, marker: str) -> dict[str, list[str]]:
    found = {}
    for host in testhosts.hosts[:2]:
        pids = []
        for pid in testhosts.pids(host.name):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if marker.encode() in cmdline:
                pids.append(pid)
        found[host.name] = pids
    return found


@pytest.mark.slow
@pytest.mark.ssh
@pytest.mark.parametrize("ending", ["exit:0", "exit:3", "SIGINT", "SIGTERM", "SIGHUP"])
def test_escaped_processes_end_on_remote_hosts(tflaunch, testhosts, tmp_path, ending):
    marker = new_marker()
    cluster = remote_cluster(tmp_path, testhosts)
    if ending.startswith("exit"):
        done = tflaunch.run(str(cluster), "--", "python", ESCAPE, marker, "escape", ending, timeout=90)
        assert done.returncode == int(ending[5:]), done.stderr
        manifest = done.record
    else:
        proc = tflaunch.start(str(cluster), "--", "python", ESCAPE, marker, "escape", "ready", "forever")
        try:
            wait_for(lambda: merged_text(tflaunch).count("READY") == 2, timeout=60, message="both tasks to be ready")
            assert {h: len(p) for h, p in remote_marked(testhosts, marker).items()} == {"node1": 3, "node2": 3}  # each task and its two escapees
            proc.send_signal(getattr(signal, ending))
            proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=10)
        assert proc.returncode == 128 + getattr(signal, ending)
        manifest = json.loads((tflaunch.latest_run() / "run.json").read_text())
    assert remote_marked(testhosts, marker) == {"node1": [], "node2": []}
    assert_leftovers_named(manifest)


@pytest.mark.slow
@pytest.mark.ssh
def test_sigkilled_tflaunch_takes_remote_escapees_too(tflaunch, testhosts, tmp_path):
    marker = new_marker()
    proc = tflaunch.start(str(remote_cluster(tmp_path, testhosts)), "--", "python", ESCAPE, marker, "escape",
                          "ready", "forever")
    try:
        wait_for(lambda: merged_text(tflaunch).count("READY") == 2, timeout=60, message="both tasks to be ready")
        assert {h: len(p) for h, p in remote_marked(testhosts, marker).items()} == {"node1": 3, "node2": 3}  # each task and its two escapees
    finally:
        proc.kill()
        proc.communicate(timeout=10)
    wait_for(lambda: remote_marked(testhosts, marker) == {"node1": [], "node2": []}, timeout=8,
             message=lambda: f"the remote escapees to end; left: {remote_marked(testhosts, marker)}")
