"""One agent per host at the scale people run: many tasks on hosts whose sshd keeps OpenSSH's stock
limits, a host lost under 8 tasks, a flood beside a failure, a task restarted in place among
neighbours that keep running, SIGKILL of tflaunch with 64 tasks on 4 hosts, a thousand local tasks
under a common open-files limit, and a run refused when it cannot fit that limit."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from launcher.records.logformat import MARKER
from polling import wait_for
from test_ssh import cluster_file, run_processes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def workers(testhosts, per_host: int, hosts: int, extra: str = "") -> str:
    lines, port_base = ["worker:"], testhosts.port(span=per_host)
    for i in range(per_host):
        for host in testhosts.hosts[:hosts]:
            lines.append(f"  - {{host: {host.name}, address: {host.address}, port: {port_base + i}{extra}}}")
    return "\n".join(lines) + "\n"


def ssh_sessions(testhosts, host: str) -> int:
    """sshd session processes on ``host`` that serve a connection (the listener excluded)."""
    count = 0
    for pid in testhosts.pids(host):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if cmdline.startswith("sshd:") and "[priv]" in cmdline or cmdline.startswith("sshd: root@notty"):
            count += 1
    return count


def empty(testhosts) -> dict[str, list[str]]:
    return {h.name: run_processes(testhosts, h.name) for h in testhosts.hosts if run_processes(testhosts, h.name)}


@pytest.mark.ssh
@pytest.mark.parametrize("tasks", [16, 32])
def test_many_tasks_start_on_one_host_whose_sshd_keeps_stock_limits(tflaunch, testhosts, tmp_path, tasks):
    cluster = cluster_file(tmp_path, testhosts, workers(testhosts, tasks, hosts=1))
    done = tflaunch.run(str(cluster), "--", "sh", "-c", 'echo "$TFLAUNCH_TASK on $(hostname)"')
    assert done.returncode == 0, done.stderr[-2000:]
    assert [t["state"] for t in done.record["tasks"]] == ["succeeded"] * tasks
    for task in done.record["tasks"]:
        assert done.task_output(task["name"]) == f"{task['name']} on node1\n"


def sleepers_up(tflaunch, cluster: Path, tasks: int, timeout: float) -> subprocess.Popen:
    """tflaunch running ``cluster`` with each task saying "up", then sleeping 120 s; returned once all
    ``tasks`` have said it (the tflaunch fixture interrupts it if the wait fails)."""
    proc = tflaunch.start(str(cluster), "--", "sh", "-c", "echo up; exec sleep 120")
    wait_for(lambda: tflaunch.merged_text().count("| up") == tasks, timeout=timeout,
             message=f"all {tasks} tasks to be up")
    return proc


@pytest.mark.ssh
def test_a_remote_host_costs_one_connection_for_the_checks_and_the_run(tflaunch, testhosts, tmp_path):
    cluster = cluster_file(tmp_path, testhosts, workers(testhosts, 8, hosts=2))
    proc = sleepers_up(tflaunch, cluster, 16, timeout=60)
    try:
        assert {h: ssh_sessions(testhosts, h) for h in ("node1", "node2")} == {"node1": 1, "node2": 1}
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    assert proc.returncode == 130


@pytest.mark.ssh
def test_a_host_lost_under_8_tasks_fails_them_naming_the_host_once(tflaunch, testhosts, tmp_path):
    cluster = cluster_file(tmp_path, testhosts, workers(testhosts, 8, hosts=2), keepalive=3)
    proc = sleepers_up(tflaunch, cluster, 16, timeout=60)
    try:
        testhosts.cut("node2")
        cut_at = time.monotonic()
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - cut_at
    finally:
        testhosts.restore("node2")
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode != 0
    assert took < 15, f"the lost host was noticed after {took:.1f} s (keep-alive 3 s)"
    record = json.loads((tflaunch.latest_run() / "run.json").read_text())
    on_node2 = [t for t in record["tasks"] if t["host"] == "node2"]
    assert len(on_node2) == 8 and record["root_cause"]["host"] == "node2"
    assert all(t["error"] and t["error"].startswith("lost connection to node2") for t in on_node2
               if t["state"] == "failed"), on_node2
    # The console names the lost host in the root cause, and folds the tasks that went with it
    # into one row of the summary's table.
    summary = [line for line in err.splitlines() if "lost connection to node2" in line]
    rows = [line for line in summary if re.search(r"worker-\[[\d,]+\] \(7 tasks\) +node2 +failed", line)]
    assert len(rows) == 1 and 1 <= len(summary) - len(rows) <= 3, err
    assert wait_until_gone(testhosts, "node1") == []


def wait_until_gone(testhosts, host: str, seconds: float = 5) -> list[str]:
    deadline = time.monotonic() + seconds
    while run_processes(testhosts, host) and time.monotonic() < deadline:
        time.sleep(0.1)
    return run_processes(testhosts, host)


@pytest.mark.ssh
def test_a_failure_beside_a_flooding_task_stops_the_cluster(tflaunch, testhosts, tmp_path):
    port = testhosts.port(span=2)
    body = ("worker:\n"
            f"  - {{host: node1, address: {testhosts.hosts[0].address}, port: {port}}}\n"
            f"  - {{host: node1, address: {testhosts.hosts[0].address}, port: {port + 1}}}\n")
    cluster = cluster_file(tmp_path, testhosts, body)
    marker = uuid.uuid4().hex
    # worker-0 floods its output and notes when its SIGTERM came; worker-1 notes when it fails, once
    # the flood is well under way.
    code = ("import os, signal, sys, time\n"
            "where, marker = sys.argv[1], sys.argv[2]\n"
            "if os.environ['TFLAUNCH_TASK'] == 'worker-0':\n"
            "    def stop(*_):\n"
            "        open(os.path.join(where, 'stopped'), 'w').write(repr(time.time()))\n"
            "        os._exit(143)\n"
            "    signal.signal(signal.SIGTERM, stop)\n"
            "    lines = (marker + '\\n').encode() * 2000\n"
            "    while True:\n"
            "        os.write(1, lines)\n"
            "time.sleep(3)\n"
            "print('failing', flush=True)\n"
            "open(os.path.join(where, 'failed'), 'w').write(repr(time.time()))\n"
            "sys.exit(7)\n")
    done = tflaunch.run(str(cluster), "--log-max-size", "1M", "--", "python", "-c", code, str(tmp_path), marker,
                        timeout=120)
    assert done.returncode == 7, done.stderr[-2000:]
    # The failure summary comes out whole after the flood's lines, however far behind the console fell.
    assert "worker-1 on node1 failed (exit code 7)" in done.stderr
    assert done.stderr.rstrip().splitlines()[-1].startswith(f"tflaunch: logs in {done.run_dir}")
    # Fail-fast is about the tasks: the stop reaches the flooding task soon after the failure (well under
    # a second here; 5 s allows for a busy machine), however much of its flood is still on its way
    # (writing that into the logs may take tflaunch longer). The flood alone would never end.
    stopped = float((tmp_path / "stopped").read_text()) - float((tmp_path / "failed").read_text())
    assert 0 <= stopped < 5.0, f"the flooding task was stopped {stopped:.2f} s after the failure"
    # The flood came over the channel into a log kept within its limit: its start, one marker line
    # counting what was left out, its latest lines; merged.log within four times that.
    flood = (done.run_dir / "worker-0.log").read_bytes()
    cut = list(MARKER.finditer(flood))
    assert len(cut) == 1 and int(cut[0][1].replace(b",", b"")) > 1 << 20 and len(flood) <= (1 << 20) + 80
    kept = flood[:cut[0].start()] + flood[cut[0].end():]
    assert set(kept.split(b"\n")[:-1]) == {marker.encode()}
    assert len(done.merged) <= (4 << 20) + 80 and len(MARKER.findall(done.merged)) == 1
    assert done.task_output("worker-1") == "failing\n"


@pytest.mark.ssh
def test_one_task_restarted_in_place_leaves_its_neighbours_on_the_host_running(tflaunch, testhosts, tmp_path):
    body = ("restart_policy:\n  worker: task\ntask_restarts: 2\n" + workers(testhosts, 4, hosts=1))
    cluster = cluster_file(tmp_path, testhosts, body)
    proc = tflaunch.start(str(cluster), "--", "sh", "-c", "echo up $$; exec sleep 120")
    try:
        wait_for(lambda: tflaunch.merged_text().count("| up") == 4,
                 timeout=60, message="all 4 tasks to be up")
        log = (tflaunch.latest_run() / "merged.log").read_text()
        pids = {m.group(1): int(m.group(2)) for m in re.finditer(r"(worker-\d) \| up (\d+)", log)}
        subprocess.run(["ip", "netns", "exec", testhosts.host("node1").netns, "kill", "-9", str(pids["worker-2"])],
                       check=True)
        wait_for(lambda: tflaunch.merged_text().count("| up") == 5, timeout=30,
                 message="worker-2 to come back")
        still = set(testhosts.pids("node1"))
        assert all(pids[name] in still for name in ("worker-0", "worker-1", "worker-3"))
        assert pids["worker-2"] not in still
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert "worker-2 on node1 failed (killed by SIGKILL): restarting it alone, in place" in err
    record = json.loads((tflaunch.latest_run() / "run.json").read_text())
    assert {t["name"]: t["restarts"] for t in record["tasks"]} == {"worker-0": 0, "worker-1": 0, "worker-2": 1,
                                                                   "worker-3": 0}


@pytest.mark.ssh
def test_sigkill_of_tflaunch_with_64_tasks_on_4_hosts_leaves_nothing(tflaunch, testhosts, tmp_path):
    cluster = cluster_file(tmp_path, testhosts, workers(testhosts, 16, hosts=4))
    proc = sleepers_up(tflaunch, cluster, 64, timeout=90)
    try:
        assert all(len(run_processes(testhosts, h.name)) >= 16 for h in testhosts.hosts[:4])
        proc.kill()
        killed_at = time.monotonic()
        proc.communicate(timeout=10)
        # The tasks sleep 120 s: only tflaunch's death can empty the hosts this soon.
        wait_for(lambda: not empty(testhosts), timeout=10, interval=0.05,
                 message=lambda: f"every host to be empty; left: {empty(testhosts)}")
        assert time.monotonic() - killed_at < 5.0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_a_thousand_local_tasks_run_under_a_common_open_files_limit(tmp_path):
    logs = tmp_path / "logs"
    script = (f"ulimit -n 1024 && exec {sys.executable} -m launcher --local 1000 --quiet --log-dir {logs} "
              "-- sh -c 'echo $TFLAUNCH_TASK'")
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=240,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert done.returncode == 0, done.stderr[-2000:]
    (run_dir,) = [p for p in logs.iterdir() if p.is_dir()]
    record = json.loads((run_dir / "run.json").read_text())
    assert len(record["tasks"]) == 1000 and {t["state"] for t in record["tasks"]} == {"succeeded"}
    assert (run_dir / "worker-999.log").read_text() == "worker-999\n"
    assert "worker-[0-999] (1,000 tasks)" in done.stderr  # one folded row, not a thousand
    merged = (run_dir / "merged.log").read_text()
    assert all(f"worker-{i} | worker-{i}\n" in merged for i in range(0, 1000, 37))


def test_a_run_that_cannot_fit_the_open_files_limit_is_refused_before_anything_starts(tmp_path):
    logs = tmp_path / "logs"
    marker = uuid.uuid4().hex
    script = f"ulimit -n 56 && exec {sys.executable} -m launcher --local 20 --log-dir {logs} -- sleep 30 {marker}"
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and re.search(r"needs about \d+ open files \(20 tasks on 1 host\), but the limit is 56",
                                         lines[0]), done.stderr
    assert "ulimit -n" in lines[0] and "Traceback" not in done.stderr
    assert not logs.exists() or not any(logs.iterdir())


def test_tasks_keep_the_users_open_files_limit(tflaunch):
    done = subprocess.run(["bash", "-c", f"ulimit -S -n 333 && exec {sys.executable} -m launcher --local 2 "
                                         f"--log-dir {tflaunch.log_dir} -- sh -c 'ulimit -n'"],
                          capture_output=True, text=True, timeout=60, cwd=tflaunch.cwd, env=tflaunch.env())
    assert done.returncode == 0, done.stderr
    run_dir = sorted(p for p in tflaunch.log_dir.iterdir() if p.is_dir())[-1]
    assert [(run_dir / f"worker-{i}.log").read_text() for i in range(2)] == ["333\n", "333\n"]
