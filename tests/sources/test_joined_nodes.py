"""Every node runs the same command (``--nnodes --node-rank --rdzv-endpoint``), on the namespaced
test hosts, each node's tflaunch started in its host's network namespace; ssh is never used: an
``ssh`` on PATH that leaves a mark fails the test."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import HELPERS, TASK
from polling import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.ssh, pytest.mark.timeout(180)]


class Nodes:
    """Each node's tflaunch, started in a test host's network namespace with the run's token."""

    def __init__(self, testhosts, tmp_path: Path, nnodes: int = 3, timeout: float = 30):
        self.hosts = testhosts.hosts
        self.tmp = tmp_path
        self.nnodes = nnodes
        self.timeout = timeout
        self.port = testhosts.port()
        self.endpoint = f"{self.hosts[0].address}:{self.port}"
        self.token = secrets.token_hex(16)
        fake = tmp_path / "bin"
        fake.mkdir()
        self.ssh_mark = tmp_path / "ssh-was-used"
        (fake / "ssh").write_text(f"#!/bin/sh\necho \"$@\" >> {self.ssh_mark}\nexit 255\n")
        (fake / "ssh").chmod(0o755)
        self.env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "TFLAUNCH_RDZV_TOKEN": self.token}
        self.procs: dict[int, subprocess.Popen] = {}

    def start(self, rank: int, *command: str, token: str | None = None, extra: tuple[str, ...] = (),
              host: int | None = None, endpoint: str | None = None) -> subprocess.Popen:
        netns = self.hosts[rank if host is None else host].netns
        argv = ["ip", "netns", "exec", netns, sys.executable, "-m", "launcher", "--nnodes", str(self.nnodes),
                "--node-rank", str(rank), "--rdzv-endpoint", endpoint or self.endpoint, "--rdzv-timeout", str(self.timeout),
                "--log-dir", str(self.tmp / "logs"), "--grace", "2", *extra, "--", *command]
        env = self.env if token is None else {**self.env, "TFLAUNCH_RDZV_TOKEN": token}
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                cwd=self.tmp, start_new_session=True)
        if token is None:
            self.procs[rank] = proc
        return proc

    def finish(self, proc: subprocess.Popen, timeout: float = 90) -> tuple[int, str]:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out

    def record(self) -> dict:
        (run,) = (self.tmp / "logs").iterdir()
        return json.loads((run / "run.json").read_text())

    def running(self) -> bool:
        runs = list((self.tmp / "logs").glob("*/run.json"))
        try:
            tasks = json.loads(runs[0].read_text())["tasks"] if runs else []
        except ValueError:  # being replaced
            return False
        running = [t for t in tasks if t["state"] == "running" and t.get("pid")]
        return len(running) == self.nnodes

    def wait_running(self) -> None:
        wait_for(self.running, timeout=60, message="every task running")

    def merged(self) -> str:
        (run,) = (self.tmp / "logs").iterdir()
        return (run / "merged.log").read_text()

    def stop_all(self) -> None:
        for proc in self.procs.values():
            kill_tree(proc.pid)

    def no_ssh(self) -> None:
        assert not self.ssh_mark.exists(), self.ssh_mark.read_text()


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and everything under it (a node dying)."""
    try:
        parent = psutil.Process(pid)
        family = [parent, *parent.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for proc in family:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass


@pytest.fixture
def nodes(testhosts, tmp_path):
    made = Nodes(testhosts, tmp_path)
    yield made
    made.stop_all()
    made.no_ssh()


def test_three_nodes_started_in_any_order_one_late_train_and_succeed_without_ssh(nodes):
    # Rank 2 first, then the owner, rank 1 three seconds later: TF_CONFIG follows rank, not arrival.
    nodes.start(2, "python", str(TASK), "env")
    time.sleep(1)
    owner = nodes.start(0, "python", str(TASK), "env", "sleep:1", "print:trained")
    time.sleep(3)
    nodes.start(1, "python", str(TASK), "env")
    code, out = nodes.finish(owner)
    assert code == 0, out
    for rank in (1, 2):
        code, text = nodes.finish(nodes.procs[rank])
        assert code == 0, text
        assert f"node rank {rank}: the run ended with exit code 0" in text
        assert f"worker-{rank} | ENV " in text  # a node shows its own tasks' lines
    assert nodes.merged().count("trained") == 3
    record = nodes.record()
    addresses = [task["address"].rsplit(":", 1)[0] for task in record["tasks"]]
    assert addresses == [host.address for host in nodes.hosts[:3]], addresses
    assert nodes.token not in nodes.merged()  # no task inherits the token (``env`` prints TFLAUNCH_*)
    assert [task["name"] for task in record["tasks"]] == ["worker-0", "worker-1", "worker-2"]
    assert all(task["state"] == "succeeded" for task in record["tasks"])


def test_a_joining_node_is_one_process_its_agent_which_keeps_the_terminal_as_it_was(testhosts, tmp_path):
    nodes = Nodes(testhosts, tmp_path, nnodes=2)
    try:
        owner = nodes.start(0, "python", str(TASK), "print:up", "forever")
        node = nodes.start(1, "python", str(TASK))
        nodes.wait_running()
        task = next(t for t in nodes.record()["tasks"] if t["name"] == "worker-1")
        # The node's tflaunch became its agent: the task's parent, no second interpreter beside it.
        assert psutil.Process(task["pid"]).ppid() == node.pid
        assert psutil.Process(node.pid).cmdline()[1:4] == ["-I", "-S", "-c"]
        assert psutil.Process(node.pid).children() == [psutil.Process(task["pid"])]
        assert b"TFLAUNCH_RDZV_TOKEN" not in Path(f"/proc/{node.pid}/environ").read_bytes()
        # Its tasks' lines go to a description of its stderr of its own: the shared one stays blocking.
        flags = int(re.search(r"flags:\s+(\d+)", Path(f"/proc/{node.pid}/fdinfo/2").read_text()).group(1), 8)
        assert not flags & os.O_NONBLOCK
        # Running is not printing: the task's line is in before the run is stopped.
        wait_for(lambda: "worker-1 | up" in nodes.merged(), timeout=60, message="worker-1's line")
        os.killpg(owner.pid, signal.SIGINT)
        code, out = nodes.finish(owner)
        code1, text = nodes.finish(node)
        assert code1 == code == 130, (out, text)
        assert "worker-1 | up" in text and "node rank 1: the run ended with exit code 130" in text
    finally:
        nodes.stop_all()
        nodes.no_ssh()


def test_a_stranger_with_a_wrong_token_joining_first_takes_no_rank(nodes):
    stranger = nodes.start(1, "python", str(TASK), "env", token=secrets.token_hex(16), host=3)
    time.sleep(1)
    owner = nodes.start(0, "python", str(TASK), "print:trained")
    time.sleep(2)  # the stranger has tried (and failed) at least once by now
    nodes.start(1, "python", str(TASK))
    nodes.start(2, "python", str(TASK))
    code, out = nodes.finish(owner)
    assert code == 0, out
    assert nodes.merged().count("trained") == 3
    assert [t["host"] for t in nodes.record()["tasks"]] == [nodes.hosts[0].address, "rank-1", "rank-2"]
    assert nodes.record()["tasks"][1]["address"].startswith(nodes.hosts[1].address + ":")
    kill_tree(stranger.pid)
    stranger.wait()


def test_a_node_whose_endpoint_name_resolves_late_joins_once_it_does(testhosts, tmp_path):
    nodes = Nodes(testhosts, tmp_path, nnodes=2)
    # ip netns exec mounts /etc/netns/NETNS/* over /etc/*: rank 1's own hosts file, without the name yet.
    etc = Path("/etc/netns") / nodes.hosts[1].netns
    etc.mkdir(parents=True)
    try:
        (etc / "hosts").write_text("127.0.0.1 localhost\n")
        (etc / "resolv.conf").write_text("")  # no name server: only the hosts file answers
        name = "rank0.tflaunch.test"
        nodes.start(1, "python", str(TASK), endpoint=f"{name}:{nodes.port}")
        owner = nodes.start(0, "python", str(TASK), "print:trained")
        time.sleep(2)  # rank 1 has tried the name, and failed, more than once by now
        with open(etc / "hosts", "a") as hosts:  # the same file: the mount shows the new line
            hosts.write(f"{nodes.hosts[0].address} {name}\n")
        code, out = nodes.finish(owner)
        assert code == 0, out
        assert nodes.merged().count("trained") == 2
        code, text = nodes.finish(nodes.procs[1])
        assert code == 0, text
    finally:
        shutil.rmtree(etc, ignore_errors=True)
        nodes.stop_all()
        nodes.no_ssh()


def test_a_node_that_never_comes_is_named_by_rank_in_one_line(testhosts, tmp_path):
    nodes = Nodes(testhosts, tmp_path, timeout=4)
    try:
        owner = nodes.start(0, "python", str(TASK))
        nodes.start(1, "python", str(TASK))
        code, out = nodes.finish(owner)
        assert code == 1, out
        lines = [line for line in out.splitlines() if "did not join" in line]
        assert lines == ["tflaunch: error: node rank 2 did not join within --rdzv-timeout 4 s"], out
        code, text = nodes.finish(nodes.procs[1])
        assert code == 1, text  # the node that came exits with the run's code
    finally:
        nodes.stop_all()
        nodes.no_ssh()


def test_nnodes_min_max_runs_with_the_nodes_that_came_within_the_timeout(testhosts, tmp_path):
    nodes = Nodes(testhosts, tmp_path, timeout=4)
    try:
        owner = nodes.start(0, "python", str(TASK), "print:trained", extra=("--nnodes", "2:3"))
        nodes.start(2, "python", str(TASK))  # rank 1 never comes
        code, out = nodes.finish(owner)
        assert code == 0, out
        assert [t["host"] for t in nodes.record()["tasks"]] == [nodes.hosts[0].address, "rank-2"]
        assert nodes.merged().count("trained") == 2
    finally:
        nodes.stop_all()
        nodes.no_ssh()


def test_a_node_killed_mid_run_is_a_lost_host_and_every_node_ends(nodes):
    owner = nodes.start(0, "python", str(TASK), "print:up", "forever")
    nodes.start(1, "python", str(TASK))
    nodes.start(2, "python", str(TASK))
    nodes.wait_running()
    kill_tree(nodes.procs[2].pid)  # the node dies: its tflaunch, its agent and its task
    code, out = nodes.finish(owner)
    assert code != 0, out
    assert "rank-2" in out and "lost node 2" in out, out
    code1, text = nodes.finish(nodes.procs[1])
    assert code1 == code, text


def test_a_node_killed_mid_run_is_replaced_by_a_spare_node(testhosts, tmp_path):
    nodes = Nodes(testhosts, tmp_path, nnodes=2)
    try:
        extra = ("--spares", "1", "--max-restarts", "1", "--restart-delay", "0")
        owner = nodes.start(0, "python", str(TASK), "print:up", "sleep:8", extra=extra)
        nodes.start(1, "python", str(TASK))
        nodes.start(2, "python", str(TASK))  # rank 2 of --nnodes 2: the spare
        nodes.wait_running()
        kill_tree(nodes.procs[1].pid)
        code, out = nodes.finish(owner)
        assert code == 0, out
        tasks = nodes.record()["tasks"]
        assert {t["host"] for t in tasks if t["state"] == "succeeded"} == {nodes.hosts[0].address, "rank-2"}, tasks
        code, text = nodes.finish(nodes.procs[2])
        assert code == 0, text
    finally:
        nodes.stop_all()
        nodes.no_ssh()


def test_a_node_that_restarts_rejoins_the_run_at_the_next_attempt(nodes):
    extra = ("--max-restarts", "1", "--restart-delay", "0")
    owner = nodes.start(0, "python", str(TASK), "print:up", "sleep:6", extra=extra)
    nodes.start(1, "python", str(TASK))
    nodes.start(2, "python", str(TASK))
    nodes.wait_running()
    kill_tree(nodes.procs[2].pid)
    nodes.start(2, "python", str(TASK))  # the platform's retry: the same command, the same rank
    code, out = nodes.finish(owner)
    assert code == 0, out
    assert "restarting the whole cluster" in out, out
    tasks = nodes.record()["tasks"]
    assert [(t["host"], t["state"]) for t in tasks] == [(nodes.hosts[0].address, "succeeded"),
                                                         ("rank-1", "succeeded"), ("rank-2", "succeeded")], tasks
    for rank in (1, 2):
        code, text = nodes.finish(nodes.procs[rank])
        assert code == 0, text


def test_the_owner_killed_ends_every_nodes_tasks(nodes):
    owner = nodes.start(0, "python", str(TASK), "print:up", "forever")
    nodes.start(1, "python", str(TASK))
    nodes.start(2, "python", str(TASK))
    nodes.wait_running()
    pids = [t["pid"] for t in nodes.record()["tasks"]]
    os.killpg(owner.pid, signal.SIGKILL)
    owner.wait()
    for rank in (1, 2):
        code, text = nodes.finish(nodes.procs[rank], timeout=30)
        assert code == 255, text
        assert "the run's owner (node rank 0) went away" in text
    wait_for(lambda: not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                             for pid in pids if pid), timeout=20, message="every node's task gone")


@pytest.mark.tensorflow
@pytest.mark.timeout(400)
def test_two_nodes_train_the_built_in_trainer_in_lockstep(testhosts, tmp_path):
    nodes = Nodes(testhosts, tmp_path, nnodes=2, timeout=60)
    try:
        owner = nodes.start(0, "python", "-m", "trainer", "--epochs", "1")
        nodes.start(1, "python", "-m", "trainer", "--epochs", "1")
        code, out = nodes.finish(owner, timeout=300)
        assert code == 0, out[-3000:]
        code, text = nodes.finish(nodes.procs[1])
        assert code == 0, text
        (run,) = (tmp_path / "logs").iterdir()
        metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        losses = {m["task"]: m["loss"] for m in metrics if m["kind"] == "epoch" and m["epoch"] == 1}
        assert sorted(losses) == ["worker-0", "worker-1"] and losses["worker-0"] == losses["worker-1"]
    finally:
        nodes.stop_all()
        nodes.no_ssh()


@pytest.mark.tensorflow
@pytest.mark.timeout(400)
def test_a_plain_keras_script_trains_across_two_joined_nodes(testhosts, tmp_path):
    nodes = Nodes(testhosts, tmp_path, nnodes=2, timeout=60)
    try:
        script = str(HELPERS / "keras_fit.py")
        owner = nodes.start(0, "python", script, "2")
        nodes.start(1, "python", script, "2")
        code, out = nodes.finish(owner, timeout=300)
        assert code == 0, out[-3000:]
        code, text = nodes.finish(nodes.procs[1])
        assert code == 0, text
        assert "worker-1 | trained" in text  # the node's own task's lines, on its own console
        (run,) = (tmp_path / "logs").iterdir()
        metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        losses = {(m["task"], m["epoch"]): m["loss"] for m in metrics if m["kind"] == "epoch"}
        assert sorted(losses) == [(task, n) for task in ("worker-0", "worker-1") for n in (1, 2, 3)], metrics
        assert all(losses[("worker-0", n)] == losses[("worker-1", n)] for n in (1, 2, 3))  # lock-step
        assert nodes.merged().count("trained") == 2
    finally:
        nodes.stop_all()
        nodes.no_ssh()
