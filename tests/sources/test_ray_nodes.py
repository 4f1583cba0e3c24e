"""Runs on a real Ray cluster of several nodes on this machine (``--ray ADDRESS --nnodes N``), with
the stand-in worker: where the tasks run, and that nothing of a run is left in Ray or on the
machine however it ends (success, a failed task, Ctrl-C, tflaunch killed), a group that cannot be
placed, and a Ray node that dies mid-run."""

from __future__ import annotations

import ast
import contextlib
import json
import secrets
import signal
import subprocess
import sys
import time

import psutil
import pytest

from conftest import HELPERS, LOCKSTEP, ROOT, processes_of_run
from polling import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(240)]


def ray_args(raycluster, nnodes, *extra: str) -> list[str]:
    return ["--ray", raycluster.address, "--nnodes", str(nnodes), "--grace", "2", *extra]


def live_tasks(tflaunch) -> list[dict]:
    """The run's tasks once each has its pid: the run folder is made once the Ray nodes are in."""
    wait_for(tflaunch.latest_run, timeout=90, message="the run folder")
    return tflaunch.live_tasks(timeout=60)


def alive(pids: list[int]) -> list[psutil.Process]:
    """The processes of ``pids`` that run now (kept, so that a pid used again later is not them)."""
    found = []
    for pid in pids:
        try:
            found.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    return found


def gone(procs: list[psutil.Process]) -> bool:
    """Whether every one of ``procs`` ended (is_running also compares the start time: not a reused pid)."""
    def running(proc: psutil.Process) -> bool:
        try:
            return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
    return not any(running(proc) for proc in procs)


def actor_of(proc: psutil.Process) -> psutil.Process:
    """The Ray actor's worker process above ``proc``."""
    for parent in proc.parents():
        if parent.cmdline()[:1] and parent.cmdline()[0].startswith("ray::"):
            return parent
    raise AssertionError(f"no Ray actor above {proc.cmdline()}")


def test_three_ray_nodes_train_in_lock_step_and_run_json_names_each_node(raycluster, tflaunch):
    nodes = {node["id"]: node["address"] for node in raycluster.nodes()}
    done = tflaunch.run(*ray_args(raycluster, 3), "--", "python", LOCKSTEP, "--epochs", "2", "--steps", "3")
    assert done.returncode == 0, done.stderr[-3000:]
    tasks = done.record["tasks"]
    assert sorted(t["name"] for t in tasks) == ["worker-0", "worker-1", "worker-2"]
    assert len({t["host"] for t in tasks}) == 3  # STRICT_SPREAD: one Ray node each
    for task in tasks:
        assert task["host"] in nodes, (task["host"], nodes)  # the Ray node's id
        assert task["address"].rpartition(":")[0] == nodes[task["host"]]  # and its address
        assert task["state"] == "succeeded"
        cluster = json.loads(task["env"]["TF_CONFIG"])["cluster"]["worker"]
        assert sorted(cluster) == sorted(t["address"] for t in tasks)
    merged = done.merged.decode()
    for name in ("worker-0", "worker-1", "worker-2"):
        assert f"{name}: done" in merged
    assert f"--ray {raycluster.address} --nnodes 3" in done.record["source"]
    raycluster.wait_free(within=10)


def test_a_failed_task_ends_the_run_and_frees_every_actor_and_the_group(raycluster, tflaunch):
    done = tflaunch.run(*ray_args(raycluster, 3), "--env", "LOCKSTEP_CRASH=2:3", "--", "python", LOCKSTEP,
                        "--epochs", "3", "--steps", "3")
    assert done.returncode == 3, done.stderr[-3000:]
    assert all(t["pid"] for t in done.record["tasks"])
    assert processes_of_run(done.record["run_id"]) == []  # no task of the run is left on any Ray node
    raycluster.wait_free(within=10)


def test_ctrl_c_stops_the_tasks_and_frees_ray_before_tflaunch_exits(raycluster, tflaunch):
    proc = tflaunch.start(*ray_args(raycluster, 3), "--", "python", LOCKSTEP, "--epochs", "100", "--steps", "50",
                          "--step-seconds", "0.1")
    pids = alive([t["pid"] for t in live_tasks(tflaunch)])
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-3000:]
    assert gone(pids)
    state = raycluster.state()  # freed by tflaunch itself, not by Ray noticing the driver gone
    assert not state["actors"] and all(s == "REMOVED" for s in state["groups"].values()), state


def test_tflaunch_killed_leaves_no_task_actor_or_group(raycluster, tflaunch):
    proc = tflaunch.start(*ray_args(raycluster, 3), "--", "python", LOCKSTEP, "--epochs", "100", "--steps", "50",
                          "--step-seconds", "0.1")
    pids = alive([t["pid"] for t in live_tasks(tflaunch)])
    assert len(pids) == 3 and raycluster.state()["actors"]
    proc.kill()
    proc.communicate(timeout=30)
    # Ray ends the dead driver's actors, and each agent its tasks (or its channel's end does):
    # on a loaded machine that takes Ray's own detection, then the agents' grace.
    wait_for(lambda: gone(pids), timeout=60,
             message=lambda: f"every task gone after tflaunch was killed; still there: "
                             f"{[p.pid for p in pids if not gone([p])]}")
    raycluster.wait_free(within=60)


def test_an_agent_slow_to_see_tflaunch_killed_still_stops_its_tasks_after_ray_ends_its_actor(raycluster, tflaunch):
    """Ray SIGKILLs an actor's own children as the actor's process exits (its driver gone): each agent
    is held stopped until that has happened, so it cannot have seen its channel end first; it lives
    (its tie took the SIGKILL), and once it runs again it stops its tasks."""
    proc = tflaunch.start(*ray_args(raycluster, 3), "--", "python", LOCKSTEP, "--epochs", "100", "--steps", "50",
                          "--step-seconds", "0.1")
    pids = alive([t["pid"] for t in live_tasks(tflaunch)])
    assert len(pids) == 3
    agents = [pid.parent() for pid in pids]
    actors = [actor_of(agent) for agent in agents]
    for agent in agents:
        agent.suspend()
    try:
        proc.kill()
        proc.communicate(timeout=30)
        wait_for(lambda: gone(actors), timeout=60, message="Ray ending the actors of a killed tflaunch")
        assert not gone(agents), "Ray killed an agent before it could stop its tasks"
    finally:
        for agent in agents:
            with contextlib.suppress(psutil.NoSuchProcess):
                agent.resume()
    wait_for(lambda: gone(pids), timeout=30,
             message=lambda: f"every task gone; still there: {[p.pid for p in pids if not gone([p])]}")
    wait_for(lambda: gone(agents), timeout=30, message="every agent gone")
    raycluster.wait_free(within=60)


def test_a_group_the_cluster_cannot_place_is_one_line_and_leaves_nothing(raycluster, tflaunch):
    started = time.monotonic()
    done = tflaunch.run(*ray_args(raycluster, 5), "--start-timeout", "2", "--", "python", LOCKSTEP)
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert "could not be placed within 2 s" in lines[0] and "needs 5 nodes with 1 CPU each" in lines[0], lines
    assert "the cluster has 3 nodes" in lines[0], lines
    assert time.monotonic() - started < 60
    raycluster.wait_free(within=10)


@pytest.mark.parametrize("shape", ["spare", "shrink"])
def test_a_ray_node_that_dies_is_a_lost_host(raycluster, tflaunch, shape):
    extra = ("--spares", "1") if shape == "spare" else ()
    nnodes = "2" if shape == "spare" else "2:3"
    proc = tflaunch.start(*ray_args(raycluster, nnodes, "--max-restarts", "1", "--restart-delay", "0",
                                    "--keepalive-timeout", "5", *extra),
                          "--", "python", LOCKSTEP, "--epochs", "4", "--steps", "10", "--step-seconds", "0.3")
    try:
        tasks = live_tasks(tflaunch)
        assert len(tasks) == (2 if shape == "spare" else 3)
        victim = next(t["host"] for t in tasks if t["name"] == "worker-1")
        raycluster.remove(victim)
        out, err = proc.communicate(timeout=150)
    finally:
        raycluster.add()  # the next tests find three nodes again
    assert proc.returncode == 0, err[-3000:]
    record = json.loads((tflaunch.latest_run() / "run.json").read_text())
    assert [e["host"] for e in record["excluded"]] == [victim], record["excluded"]
    assert len(record["attempts"]) == 2
    ran = [t for t in record["tasks"] if t["state"] == "succeeded"]
    assert victim not in {t["host"] for t in ran}
    assert len(ran) == 2  # the spare took worker-1's place, or the cluster shrank to its floor
    assert f"lost Ray node {victim}" in err, err[-3000:]
    raycluster.wait_free(within=10)


def test_each_task_gets_the_gpus_ray_gave_its_bundle(raycluster, tflaunch):
    """Logical GPUs (Ray hands them out without checking hardware): two nodes of 2 each, two tasks
    per node with one GPU each; each task's CUDA_VISIBLE_DEVICES is its own of its bundle's."""
    added = [raycluster.add(cpus=2, gpus=2) for _ in range(2)]
    try:
        done = tflaunch.run(*ray_args(raycluster, 2, "--tasks-per-node", "2", "--gpus-per-task", "1"), "--",
                            "python", "-c", "import os; print('CUDA', os.environ['CUDA_VISIBLE_DEVICES'])")
    finally:
        for node in added:
            raycluster.remove(node)
    assert done.returncode == 0, done.stderr[-3000:]
    tasks = done.record["tasks"]
    assert {t["host"] for t in tasks} == set(added)
    for host in added:
        mine = [t for t in tasks if t["host"] == host]
        assert len(mine) == 2 and sorted(g for t in mine for g in t["gpus"]) == [0, 1], mine
        for task in mine:
            assert f"CUDA {task['gpus'][0]}" in done.task_output(task["name"])
    raycluster.wait_free(within=10)


def test_launch_runs_on_ray_from_python(raycluster, tmp_path):
    code = ("import sys; from launcher import launch; "
            f"r = launch(ray={raycluster.address!r}, nnodes=2, log_dir={str(tmp_path)!r}, grace=2, "
            f"command=[sys.executable, {LOCKSTEP!r}, '--epochs', '1', '--steps', '2']); "
            "print('RESULT', r.exit_code, r.record.source, sorted(t.host for t in r.record.tasks))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=180)
    result = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
    assert result, done.stderr[-3000:]
    nodes = {node["id"] for node in raycluster.nodes()}
    assert result[0].startswith(f"RESULT 0 launch(ray={raycluster.address!r}, nnodes=2)"), result
    hosts = ast.literal_eval(result[0].split(")", 1)[1].strip())
    assert len(set(hosts)) == 2 and set(hosts) <= nodes, (hosts, nodes)
    raycluster.wait_free(within=10)


def test_a_cluster_file_with_a_ray_section_runs_on_ray(raycluster, tflaunch, tmp_path):
    path = tmp_path / "ray.yaml"
    path.write_text(f"ray:\n  address: {raycluster.address}\n  nnodes: 2\n  start_timeout: 60\n"
                    f"command: [python, {LOCKSTEP}, --epochs, '1', --steps, '2']\nenv: {{FROM_FILE: yes-it-is}}\n")
    done = tflaunch.run(str(path), "--grace", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    record = done.record
    assert record["source"] == str(path)
    nodes = {node["id"] for node in raycluster.nodes()}
    assert len({t["host"] for t in record["tasks"]}) == 2 and {t["host"] for t in record["tasks"]} <= nodes
    assert all(t["env"]["FROM_FILE"] == "yes-it-is" for t in record["tasks"])
    raycluster.wait_free(within=10)


def test_a_cluster_with_ray_token_authentication(tflaunch):
    """A cluster of its own, started with RAY_AUTH_MODE=token: tflaunch connects with the token Ray
    reads (the tasks never see it), and without it says so in one line."""
    from testray_fixture import RayCluster

    token = secrets.token_hex(16)
    cluster = RayCluster(nodes=2, env={"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token})
    try:
        command = ["--", "python", "-c", "import os; print('TOKEN', os.environ.get('RAY_AUTH_TOKEN'))"]
        done = tflaunch.run("--ray", cluster.address, "--nnodes", "2", *command,
                            env={"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token})
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.merged.decode().count("TOKEN None") == 2
        assert token not in done.merged.decode()
        refused = tflaunch.run("--ray", cluster.address, "--nnodes", "2", *command,
                               env={"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "not-" + token})
        lines = refused.stderr.splitlines()
        assert refused.returncode == 2 and len(lines) == 1, refused.stderr
        assert f"--ray {cluster.address}: cannot connect to the Ray cluster" in lines[0]
        assert "it refused this machine's Ray token" in lines[0]
        cluster.wait_free(within=10)
    finally:
        cluster.close()


@pytest.mark.tensorflow
@pytest.mark.timeout(400)
def test_three_ray_nodes_train_the_built_in_trainer_in_lock_step(raycluster, tflaunch):
    done = tflaunch.run(*ray_args(raycluster, 3), "--", "python", "-m", "trainer", "--epochs", "2",
                        "--steps-per-epoch", "2", timeout=360)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len({t["host"] for t in done.record["tasks"]}) == 3
    metrics = [json.loads(line) for line in (done.run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = {(m["task"], m["epoch"]): m["loss"] for m in metrics if m["kind"] == "epoch"}
    assert {task for task, _ in losses} == {"worker-0", "worker-1", "worker-2"}, metrics
    for epoch in (1, 2):  # lock-step: every worker reports the same loss
        assert len({losses[(task, epoch)] for task in ("worker-0", "worker-1", "worker-2")}) == 1
    raycluster.wait_free(within=10)


@pytest.mark.tensorflow
@pytest.mark.timeout(400)
def test_a_plain_keras_script_trains_across_three_ray_nodes(raycluster, tflaunch):
    done = tflaunch.run(*ray_args(raycluster, 3), "--", "python", str(HELPERS / "keras_fit.py"), "2", timeout=360)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = [json.loads(line) for line in (done.run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = {(m["task"], m["epoch"]): m["loss"] for m in metrics if m["kind"] == "epoch"}
    tasks = ("worker-0", "worker-1", "worker-2")
    assert sorted(losses) == [(task, n) for task in tasks for n in (1, 2, 3)], metrics
    assert all(len({losses[(task, n)] for task in tasks}) == 1 for n in (1, 2, 3))  # lock-step
    assert done.merged.decode().count("trained") == 3
    raycluster.wait_free(within=10)


def test_a_hang_on_ray_nodes_names_its_culprit_from_every_tasks_stacks(raycluster, tflaunch):
    done = tflaunch.run(*ray_args(raycluster, 3), "--hang-timeout", "6", "--env", "LOCKSTEP_HANG=worker-1=4", "--",
                        "python", LOCKSTEP, "--epochs", "1000", "--step-metrics", timeout=180)
    assert done.returncode == 124, done.stderr[-3000:]
    record = done.record
    assert record["attempts"][0]["blamed_tasks"] == ["worker-1"], record["attempts"][0]
    assert "worker-1 differs from the rest" in record["attempts"][0]["reason"]
    hosts = {t["name"]: t["host"] for t in record["tasks"]}
    assert record["root_cause"]["task"] == "worker-1" and record["root_cause"]["host"] == hosts["worker-1"]
    for name in hosts:  # each task's stacks, taken on its Ray node by its agent
        assert "lockstep.py" in (done.run_dir / "attempt-1" / "stacks" / f"{name}.txt").read_text()
    raycluster.wait_free(within=10)


def test_ctrl_c_while_the_group_waits_to_be_placed_ends_at_once_and_removes_it(raycluster, tflaunch):
    before = set(raycluster.state()["groups"])
    proc = tflaunch.start(*ray_args(raycluster, 5), "--start-timeout", "120", "--", "python", LOCKSTEP)
    wait_for(lambda: set(raycluster.state()["groups"]) - before, timeout=60, interval=0.5,
             message="the run's placement group asked of Ray")
    started = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-3000:]
    assert time.monotonic() - started < 10  # not the placement's 120 s
    state = raycluster.state()
    assert not state["actors"] and all(s == "REMOVED" for s in state["groups"].values()), state


@pytest.mark.favoured  # step times: its tasks, which mostly wait, must get the CPU as soon as they wake
@pytest.mark.timeout(300)
def test_a_straggler_on_a_ray_node_is_named_once_with_its_node(raycluster, tflaunch):
    # worker-1's input thread sleeps 0.2 s per step, in lock step with worker-0 and worker-2 on
    # Ray nodes of their own: its agent, run by its actor, watches its threads as over ssh.
    # An 8 s window: named about 14 s in, of a run of 35 s or so.
    done = tflaunch.run(*ray_args(raycluster, 3), "--straggler-warm-up", "2", "--straggler-window", "8",
                        "--env", "LOCKSTEP_INPUT_SLEEP=worker-1=0.2", "--",
                        "python", LOCKSTEP, "--epochs", "14", "--steps", "10", "--step-seconds", "0.1", timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    hosts = {t["name"]: t["host"] for t in done.record["tasks"]}
    lines = done.stderr.splitlines()
    named = [line for line in lines if "straggler: worker-1 on " in line and "holds the others back" in line]
    assert len(named) == 1 and f"worker-1 on {hosts['worker-1']} holds" in named[0], done.stderr[-3000:]
    assert "its threads sleep or wait for a disk" in named[0]
    assert not [line for line in lines if "straggler: worker-0" in line or "straggler: worker-2" in line]
    (entry,) = done.record["stragglers"]
    assert (entry["task"], entry["host"], entry["attempt"]) == ("worker-1", hosts["worker-1"], 1), entry
    raycluster.wait_free(within=10)
