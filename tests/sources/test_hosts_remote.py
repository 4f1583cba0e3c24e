"""``-H host:slots`` across real namespaced hosts, with ``port: auto`` picked by each host's agent:
TF_CONFIG names the ports the agents hold, two runs at once on the same hosts never collide, the
checks probe those ports, and MultiWorkerMirroredStrategy trains on them.

``-H`` reaches hosts the way ssh does for the user (their ~/.ssh/config), so each test runs tflaunch
in a mount namespace of its own whose ~/.ssh holds a config that includes the test hosts'. The hosts
are named by address: the test hosts' names resolve nowhere but in that config (the mesh probe
would rightly refuse them), as names do on a real cluster's DNS."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import LOCKSTEP, MACHINE_FILES

# In the group of the tests that compare this machine's files before and after: each test here makes
# ~/.ssh, where there is none, for the time it runs.
pytestmark = [pytest.mark.slow, pytest.mark.ssh, pytest.mark.timeout(300), pytest.mark.xdist_group(MACHINE_FILES)]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def hosts(testhosts):
    """-H for the first two test hosts, by address: ``hosts(2, 1)`` is 'ADDR1:2,ADDR2:1'."""
    return lambda *slots: ",".join(f"{h.address}:{n}" for h, n in zip(testhosts.hosts, slots))


@pytest.fixture
def as_user(testhosts, tmp_path):
    """argv prefix that runs a command with ~/.ssh/config reaching the test hosts by name."""
    ssh_dir = tmp_path / "dot-ssh"
    ssh_dir.mkdir(mode=0o700)
    (ssh_dir / "config").write_text(f"Include {testhosts.ssh_config}\n")
    home_ssh = Path(os.path.expanduser("~")) / ".ssh"
    made = not home_ssh.exists()
    home_ssh.mkdir(mode=0o700, exist_ok=True)  # a mount point (its contents are never touched)

    def wrap(argv: list[str]) -> list[str]:
        inner = f"mount --bind {shlex.quote(str(ssh_dir))} {shlex.quote(str(home_ssh))} && exec {shlex.join(argv)}"
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", inner]

    yield wrap
    if made:
        home_ssh.rmdir()


def tflaunch_argv(log_dir: Path | None, *args: str) -> list[str]:
    return [sys.executable, "-m", "launcher", *(["--log-dir", str(log_dir)] if log_dir else []), *args]


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def configs(run_dir: Path) -> dict[str, dict]:
    record = json.loads((run_dir / "run.json").read_text())
    return {t["name"]: json.loads((run_dir / f"{t['name']}.log").read_text().splitlines()[0]) for t in record["tasks"]}


def test_hosts_option_runs_on_each_host_with_ports_its_agent_picked(as_user, hosts, testhosts, tmp_path):
    logs = tmp_path / "logs"
    done = subprocess.run(as_user(tflaunch_argv(logs, "-H", hosts(2, 2), "--", "sh", "-c",
                                                'echo "$TF_CONFIG"; hostname; echo "$TFLAUNCH_RANK '
                                                '$TFLAUNCH_WORLD_SIZE $TFLAUNCH_LOCAL_RANK $TFLAUNCH_LOCAL_WORLD_SIZE"')),
                          capture_output=True, text=True, timeout=120, env=env(), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    (run_dir,) = logs.iterdir()
    seen = configs(run_dir)
    addresses = seen["worker-0"]["cluster"]["worker"]
    assert len(addresses) == 4 and len(set(addresses)) == 4
    assert all(int(a.rsplit(":", 1)[1]) > 1024 for a in addresses)
    assert all(c["cluster"]["worker"] == addresses for c in seen.values())
    record = json.loads((run_dir / "run.json").read_text())
    node1, node2 = testhosts.hosts[:2]
    assert [t["host"] for t in record["tasks"]] == [node1.address, node1.address, node2.address, node2.address]
    for task in record["tasks"]:
        ran_on, ranks = (run_dir / f"{task['name']}.log").read_text().splitlines()[1:3]
        assert ran_on == (node1 if task["host"] == node1.address else node2).name
        # rank, world size, and the place among the tasks of its host (two on each)
        assert ranks == f"{task['index']} 4 {task['index'] % 2} 2", task["name"]


def test_two_runs_at_once_on_the_same_hosts_never_collide(as_user, hosts, tmp_path):
    script = 'echo "$TF_CONFIG"; sleep 3'
    runs = [subprocess.Popen(as_user(tflaunch_argv(tmp_path / f"logs{i}", "-H", hosts(4, 4), "--no-check",
                                                   "--", "sh", "-c", script)),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(), cwd=tmp_path)
            for i in range(2)]
    outputs = [proc.communicate(timeout=120) for proc in runs]
    assert [proc.returncode for proc in runs] == [0, 0], [err[-1500:] for _, err in outputs]
    taken: list[str] = []
    for i in range(2):
        (run_dir,) = (tmp_path / f"logs{i}").iterdir()
        taken += configs(run_dir)["worker-0"]["cluster"]["worker"]
    assert len(taken) == 16 and len(set(taken)) == 16, taken


def test_check_probes_the_ports_the_agents_picked(as_user, hosts, testhosts, tmp_path):
    done = subprocess.run(as_user(tflaunch_argv(None, "check", "-H", hosts(2, 1))),
                          capture_output=True, text=True, timeout=120, env=env(), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    # node1's two tasks dial each other too; node2's task alone does not dial itself.
    for host, dialled in zip(testhosts.hosts[:2], (3, 2)):
        assert re.search(rf"{re.escape(host.address)}\s+mesh\s+ok\s+reaches all {dialled} task addresses",
                         done.stdout), done.stdout


def test_dry_run_says_who_picks_the_ports_and_when(as_user, hosts, testhosts, tmp_path):
    done = subprocess.run(as_user(tflaunch_argv(tmp_path / "logs", "-H", hosts(1, 1), "--dry-run")),
                          capture_output=True, text=True, timeout=60, env=env(), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    node1, node2 = testhosts.hosts[:2]
    assert (f"port auto: worker-0 on {node1.address}; worker-1 on {node2.address}: each host's agent picks free "
            "ports there when the run starts") in done.stdout


def test_lock_step_tasks_meet_across_hosts_on_agent_picked_ports(as_user, hosts, tmp_path):
    logs = tmp_path / "logs"
    done = subprocess.run(as_user(tflaunch_argv(logs, "-H", hosts(1, 1), "--", "python", LOCKSTEP, "--epochs", "2")),
                          capture_output=True, text=True, timeout=240, env=env(), cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = logs.iterdir()
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = {(m["task"], m["epoch"]): m["loss"] for m in metrics if m.get("kind") == "epoch"}
    assert sorted(losses) == [(t, e) for t in ("worker-0", "worker-1") for e in (1, 2)]
    assert losses[("worker-0", 2)] == losses[("worker-1", 2)]  # the two hosts trained in lock-step
