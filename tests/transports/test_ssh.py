"""Multi-host runs over real ssh, to real sshds on namespaced hosts (see scripts/testhosts)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import TASK, env_lines_of
from polling import wait_for
from watching import ATTEMPTS, Console, live_record, watch_rounds

pytestmark = [pytest.mark.slow, pytest.mark.ssh, pytest.mark.timeout(240)]


def cluster_file(tmp_path: Path, testhosts, body: str, name: str = "cluster.yaml", keepalive: float = 4) -> Path:
    """A cluster file reaching the test hosts through their ssh config."""
    options = json.dumps(testhosts.ssh_options)
    path = tmp_path / name
    path.write_text(f"ssh:\n  options: {options}\n  connect_timeout: 3\n  keepalive_timeout: {keepalive}\n{body}")
    return path


def two_workers(testhosts, port: int | None = None, extra: str = "") -> str:
    """Two tasks, on node1 and node2, at a port no other test used (``testhosts.port()``) unless given."""
    node1, node2 = testhosts.hosts[:2]
    port = testhosts.port() if port is None else port
    return ("worker:\n"
            f"  - host: node1\n    address: {node1.address}\n    port: {port}\n{extra}"
            f"  - host: node2\n    address: {node2.address}\n    port: {port}\n{extra}")


def run_processes(testhosts, host: str) -> list[str]:
    """Command lines of the processes on ``host`` other than sshd's own (listener and sessions)."""
    found = []
    for pid in testhosts.pids(host):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue  # exited meanwhile
        if cmdline and not cmdline.startswith("sshd"):
            found.append(f"{pid}: {cmdline[:120]}")
    return found


def wait_until_empty(testhosts, seconds: float) -> dict[str, list[str]]:
    deadline = time.monotonic() + seconds
    while True:
        left = {h.name: run_processes(testhosts, h.name) for h in testhosts.hosts[:2]}  # the hosts these tests use
        if not any(left.values()) or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


@pytest.mark.tensorflow
def test_two_host_mwms_training_through_ssh(tflaunch, testhosts, tmp_path):
    # The setup line runs in the remote login shell, so its output names the host the task ran on.
    placed = "hosts:\n" + "".join(f"  {h}:\n    setup: echo ran-on-$(hostname)\n" for h in ("node1", "node2"))
    cluster = cluster_file(tmp_path, testhosts, placed + two_workers(testhosts))
    done = tflaunch.run(str(cluster), "--", "python", "-m", "trainer", "--epochs", "3", timeout=200)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ran-on-node1" in done.task_output("worker-0").splitlines()
    assert "ran-on-node2" in done.task_output("worker-1").splitlines()
    metrics = [json.loads(line) for line in (done.run_dir / "metrics.jsonl").read_text().splitlines()]
    epochs = {(m["task"], m["epoch"]): m["loss"] for m in metrics if m["kind"] == "epoch"}
    assert sorted(epochs) == [(t, e) for t in ("worker-0", "worker-1") for e in (1, 2, 3)]
    assert all(epochs[("worker-0", e)] == epochs[("worker-1", e)] for e in (1, 2, 3))
    for name in ("worker-0", "worker-1"):
        assert (done.run_dir / f"{name}.log").stat().st_size > 0
    assert {t["host"] for t in done.record["tasks"]} == {"node1", "node2"}
    assert wait_until_empty(testhosts, 5) == {"node1": [], "node2": []}


def test_awkward_env_and_arguments_arrive_intact(tflaunch, testhosts, tmp_path):
    awkward = "it's \"quoted\" $(touch /tmp/pwned-{m}) `touch /tmp/pwned-{m}`; touch /tmp/pwned-{m} & | > <"
    marker = uuid.uuid4().hex[:8]
    value = awkward.format(m=marker)
    workdir = tmp_path / "work dir $(x) ;"
    workdir.mkdir()
    body = (f"env:\n  USER_AWKWARD: {json.dumps(value)}\n  USER_SPACES: '  two  spaces  '\n"
            f"workdir: {json.dumps(str(workdir))}\n" + two_workers(testhosts))
    cluster = cluster_file(tmp_path, testhosts, body)
    done = tflaunch.run(str(cluster), "--", "python", TASK, "env", f"print:{value}")
    assert done.returncode == 0, done.stderr
    for task in done.record["tasks"]:
        output = done.task_output(task["name"])
        (seen,) = env_lines_of(output)
        assert seen["USER_AWKWARD"] == value
        assert seen["USER_SPACES"] == "  two  spaces  "
        assert seen["TF_CONFIG"] == task["env"]["TF_CONFIG"]
        assert json.loads(seen["TF_CONFIG"])["task"] == {"type": "worker", "index": task["index"]}
        assert value in output.splitlines()
    assert not list(Path("/tmp").glob(f"pwned-{marker}*"))
    for host in testhosts.hosts:
        assert testhosts.run(host.name, f"ls /tmp/pwned-{marker} 2>/dev/null | wc -l").stdout.strip() == "0"


def test_a_hosts_tasks_share_their_agents_session_each_in_its_own_process_group(tflaunch, testhosts, tmp_path):
    # The agent leads a session of its own on the host (ssh gives it the shell's), and its tasks
    # share it: one autogroup for the host's scheduler (see launcher.agent.trees.lead_session).
    node1 = testhosts.hosts[0]
    body = "worker:\n" + "".join(f"  - host: node1\n    address: {node1.address}\n    port: {testhosts.port()}\n"
                                  for _ in range(2))
    cluster = cluster_file(tmp_path, testhosts, body)
    report = "import os; print('ids', os.getsid(0), os.getpgid(0), os.getpid(), os.getppid())"
    done = tflaunch.run(str(cluster), "--", "python", "-c", report)
    assert done.returncode == 0, done.stderr
    ids = [[int(n) for n in line.split()[1:]] for task in done.record["tasks"]
           for line in done.task_output(task["name"]).splitlines() if line.startswith("ids ")]
    assert len(ids) == 2, ids
    (sid_a, pgid_a, pid_a, parent_a), (sid_b, pgid_b, pid_b, parent_b) = ids
    assert sid_a == sid_b == parent_a == parent_b  # the agent, their parent, leads their session
    assert (pgid_a, pgid_b) == (pid_a, pid_b) and sid_a not in (pid_a, pid_b)


def test_awkward_host_name_is_not_executed(tflaunch, testhosts, tmp_path):
    marker = uuid.uuid4().hex[:8]
    body = f"worker:\n  - host: 'node1;touch /tmp/pwned-{marker}'\n    port: {testhosts.port()}\n"
    cluster = cluster_file(tmp_path, testhosts, body)
    done = tflaunch.run(str(cluster), "--no-check", "--", "python", TASK, "env")
    assert done.returncode == 255
    assert "cannot reach" in done.stderr
    assert not Path(f"/tmp/pwned-{marker}").exists()


def test_remote_exit_code_propagates_and_summary_names_host(tflaunch, testhosts, tmp_path):
    cluster = cluster_file(tmp_path, testhosts, two_workers(testhosts))
    done = tflaunch.run(str(cluster), "--", "python", TASK, "print:remote says bye", "exit-if:worker-1:3", "forever")
    assert done.returncode == 3
    root = next(line for line in done.stderr.splitlines() if "root cause" in line)
    assert "worker-1" in root and "node2" in root and "exit code 3" in root
    assert "remote says bye" in done.stderr
    states = {t["name"]: t["state"] for t in done.record["tasks"]}
    assert states == {"worker-0": "stopped", "worker-1": "failed"}
    assert wait_until_empty(testhosts, 5) == {"node1": [], "node2": []}


@pytest.mark.parametrize("how", ["SIGINT", "SIGKILL"])
def test_no_remote_process_survives_tflaunch(tflaunch, testhosts, tmp_path, how):
    cluster = cluster_file(tmp_path, testhosts, two_workers(testhosts))
    proc = tflaunch.start(str(cluster), "--", "python", TASK, "child", "forever")
    wait_for(lambda: tflaunch.merged_text().count("CHILD ") == 2, timeout=30, message="both tasks' children")
    assert all(len(run_processes(testhosts, h.name)) >= 3 for h in testhosts.hosts[:2])  # agent, task, grandchild
    proc.send_signal(getattr(signal, how))
    proc.communicate(timeout=30)
    assert proc.returncode == (130 if how == "SIGINT" else -signal.SIGKILL)
    assert wait_until_empty(testhosts, 5) == {"node1": [], "node2": []}


def test_unreachable_host_reported_within_connect_timeout(tflaunch, testhosts, tmp_path):
    node1 = testhosts.hosts[0]
    port = testhosts.port()
    body = (f"worker:\n  - host: node1\n    address: {node1.address}\n    port: {port}\n"
            f"  - host: {node1.address.rsplit('.', 1)[0]}.250\n    port: {port}\n")
    cluster = cluster_file(tmp_path, testhosts, body)
    start = time.monotonic()
    checked = tflaunch.run(str(cluster), "--", "python", TASK, "forever")
    assert checked.returncode == 2
    assert "preflight failed" in checked.stderr and ".250" in checked.stderr and "cannot reach" in checked.stderr
    assert time.monotonic() - start < 15
    start = time.monotonic()
    unchecked = tflaunch.run(str(cluster), "--no-check", "--", "python", TASK, "forever")
    assert unchecked.returncode == 255
    root = next(line for line in unchecked.stderr.splitlines() if "root cause" in line)
    assert "worker-1" in root and "cannot reach" in root and ".250" in root
    assert time.monotonic() - start < 15
    assert wait_until_empty(testhosts, 5) == {"node1": [], "node2": []}


def while_node2_is_cut(tflaunch, testhosts, proc, timeout: float, check=lambda: True) -> tuple[str, float]:
    """Once both tasks printed 'up', node2 is cut off until tflaunch has ended and ``check`` held;
    returns tflaunch's stderr and the seconds from the cut to its end."""
    wait_for(lambda: len(re.findall(r" worker-\d \| up$", tflaunch.merged_text(), re.M)) == 2, timeout=30,
             message="both tasks to be up")
    testhosts.cut("node2")
    try:
        cut_at = time.monotonic()
        _, err = proc.communicate(timeout=timeout)
        ended = time.monotonic() - cut_at
        assert check(), "the check while node2 is cut"
    finally:
        testhosts.restore("node2")
    return err, ended


def test_host_cut_off_mid_run_is_detected(tflaunch, testhosts, tmp_path):
    cluster = cluster_file(tmp_path, testhosts, two_workers(testhosts), keepalive=3)
    proc = tflaunch.start(str(cluster), "--", "python", TASK, "print:up", "forever")
    # The agent on the cut-off host stops its task by itself when heartbeats stop.
    err, detected = while_node2_is_cut(tflaunch, testhosts, proc, 60,
                                       lambda: wait_until_empty(testhosts, 8)["node2"] == [])
    assert proc.returncode == 255, err
    root = next(line for line in err.splitlines() if "root cause" in line)
    assert "worker-1" in root and "node2" in root and "lost connection" in root
    assert detected < 12
    assert wait_until_empty(testhosts, 5) == {"node1": [], "node2": []}


def test_check_reports_busy_port_and_missing_workdir(tflaunch, testhosts, tmp_path):
    # The listener exits when its stdin closes: killing a local ssh client leaves the remote process.
    port = testhosts.port()
    listener = subprocess.Popen(testhosts.ssh_argv(
        "node1", f"exec python3 -c 'import socket,sys; s=socket.socket(); s.bind((\"\",{port})); s.listen(); "
                 "print(\"listening\", flush=True); sys.stdin.read()'"),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout.readline().strip() == "listening"
        body = two_workers(testhosts, port=port).replace(
            "  - host: node2\n", "  - host: node2\n    workdir: /no/such/dir\n")
        cluster = cluster_file(tmp_path, testhosts, body)
        done = tflaunch.run("check", str(cluster))
        assert done.returncode == 1
        rows = done.stdout.splitlines()
        assert any("node1" in r and f"port {port}" in r and "FAIL" in r and "in use" in r for r in rows)
        assert any("node2" in r and f"port {port}" in r and " ok " in r for r in rows)
        assert any("node2" in r and "workdir" in r and "FAIL" in r and "/no/such/dir" in r for r in rows)
        assert any("node1" in r and "tensorflow" in r and " ok " in r for r in rows)
        as_json = json.loads(tflaunch.run("check", str(cluster), "--json").stdout)
        assert as_json["ok"] is False
    finally:
        listener.stdin.close()
        listener.wait(timeout=10)
    assert wait_until_empty(testhosts, 5) == {"node1": [], "node2": []}


def test_hang_watchdog_collects_remote_stacks(tflaunch, testhosts, tmp_path):
    cluster = cluster_file(tmp_path, testhosts, two_workers(testhosts))
    done = tflaunch.run(str(cluster), "--hang-timeout", "2", "--", "python", TASK, "print:started", "forever")
    assert done.returncode == 124, done.stderr
    for name in ("worker-0", "worker-1"):
        text = (done.run_dir / "attempt-1" / "stacks" / f"{name}.txt").read_text()
        assert "task.py" in text and "main" in text, text
        assert "TFLAUNCH_AGENT" not in done.task_output(name) and "stacks-begin" not in done.task_output(name)
    assert wait_until_empty(testhosts, 5) == {"node1": [], "node2": []}


def test_ssh_settings_and_setup_line_without_an_ssh_config(tflaunch, testhosts, tmp_path):
    node1, node2 = testhosts.hosts[:2]
    venv_bin = Path(sys.executable).parent
    body = (
        "ssh:\n"
        "  user: root\n"
        "  port: 22\n"
        f"  identity_file: {testhosts.identity_file}\n"
        "  options: ['-F', '/dev/null', '-o', 'StrictHostKeyChecking=no', '-o', 'UserKnownHostsFile=/dev/null']\n"
        "  connect_timeout: 5\n"
        "hosts:\n"
        f"  {node1.address}:\n"
        f"    setup: export USER_FROM_SETUP=node1-setup PATH={venv_bin}:$PATH\n"
        "    python: python3\n"
        f"    workdir: {tmp_path}\n"
        f"  {node2.address}:\n"
        "    env: {USER_FROM_HOST: node2-env}\n"
        f"worker:\n  - {node1.address}:{testhosts.port()}\n  - {node2.address}:{testhosts.port()}\n"
    )
    cluster = tmp_path / "plain.yaml"
    cluster.write_text(body)
    done = tflaunch.run(str(cluster), "--", "python", TASK, "env", "print:cwd-check")
    assert done.returncode == 0, done.stderr
    (first,) = env_lines_of(done.task_output("worker-0"))
    (second,) = env_lines_of(done.task_output("worker-1"))
    assert first["USER_FROM_SETUP"] == "node1-setup" and "USER_FROM_HOST" not in first
    assert second["USER_FROM_HOST"] == "node2-env" and "USER_FROM_SETUP" not in second
    launches = {t["name"]: t for t in done.record["tasks"]}
    assert launches["worker-0"]["argv"][0] == "python3" and launches["worker-0"]["workdir"] == str(tmp_path)


def test_attempts_two_and_three_over_ssh_are_live(tflaunch, testhosts, tmp_path):
    gates = tmp_path / "gates"
    gates.mkdir()
    cluster = cluster_file(tmp_path, testhosts, two_workers(testhosts))
    proc = tflaunch.start(str(cluster), "--max-restarts", "2", "--restart-delay", "0", "--",
                          "python", ATTEMPTS, str(gates), "3")
    console = Console(proc)
    run_dir = watch_rounds(console, tflaunch.latest_run, gates, lambda _: {"worker-0", "worker-1"}, 3)
    assert proc.wait(timeout=60) == 0, console.text()[-3000:]
    assert [a["outcome"] for a in live_record(run_dir)["attempts"]] == ["failed", "failed", "succeeded"]


def test_a_host_lost_for_good_costs_no_restart(tflaunch, testhosts, tmp_path):
    cluster = cluster_file(tmp_path, testhosts, two_workers(testhosts), keepalive=3)
    proc = tflaunch.start(str(cluster), "--max-restarts", "3", "--restart-delay", "0", "--", "python", TASK,
                          'print:TFLAUNCH_METRIC {"kind": "epoch", "epoch": 1, "loss": 0.5}', "print:up", "forever")
    err, ended = while_node2_is_cut(tflaunch, testhosts, proc, 90)
    assert proc.returncode == 255, err
    # Lost after the keep-alive timeout (3 s), then not answering within the connect timeout (3 s)
    # and the answer's slack (5 s): one line, and no attempt spent dialling it.
    lost = [line for line in err.splitlines() if "node2 lost" in line]
    assert len(lost) == 1 and lost[0].startswith("tflaunch: node2 lost (") and lost[0].endswith(
        "): attempt 2 cannot run: no spare left for worker-1, and no min_workers to shrink to; not restarting"), err
    assert "restarting the whole cluster" not in err
    assert ended < 3 + 2 + 8 + 6, ended
    run_dir = tflaunch.latest_run()
    record = json.loads((run_dir / "run.json").read_text())
    assert [a["outcome"] for a in record["attempts"]] == ["failed"]
    assert record["attempts"][0]["hosts"] == {"worker-0": "node1", "worker-1": "node2"}
    assert [(e["host"], e["attempt"]) for e in record["excluded"]] == [("node2", 2)]
    assert record["status"] == "failed" and record["exit_code"] == 255
    for command in ("status", "report"):  # both say where the run could not go on
        shown = tflaunch.run(command, str(run_dir))
        excluded = [line for line in shown.stdout.splitlines() if line.startswith("excluded: ")]
        assert len(excluded) == 1 and excluded[0].startswith("excluded: node2 left out of attempt 2: lost (cannot reach node2"), \
            shown.stdout + shown.stderr
    assert wait_until_empty(testhosts, 8) == {"node1": [], "node2": []}
