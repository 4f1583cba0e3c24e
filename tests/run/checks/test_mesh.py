"""The all-pairs mesh probe: pair planning and messages (pure), the probe script on this machine,
and the whole probe on real namespaced hosts over ssh (check, refused run, stalled run)."""

from __future__ import annotations

import json
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import TASK, descendants_alive
from polling import wait_for

from launcher.cluster.plan import TaskLaunch
from launcher.cluster.spec import DEFAULT_CONNECT_TIMEOUT, SshSettings
from launcher.run.checks.mesh import MeshReport, Pair, PairResult, applies, plan_pairs, probe_mesh


def launch(name: str, host: str, address: str, local: bool = False) -> TaskLaunch:
    role, index = name.rsplit("-", 1)
    return TaskLaunch(name, role, int(index), host, address, local, ("true",), {}, "/",
                      ssh=None if local else SshSettings(connect_timeout=3), python=sys.executable)


# ---- pure parts ----

def test_each_host_dials_every_task_but_a_lone_task_never_dials_itself():
    launches = [launch("worker-0", "node1", "node1:2222"), launch("worker-1", "node2", "node2:2222"),
                launch("worker-2", "node2", "10.0.0.2:2223")]
    assert plan_pairs(launches) == [
        Pair("node1", "worker-1", "node2:2222"), Pair("node1", "worker-2", "10.0.0.2:2223"),
        # node2 runs two tasks: each dials the other by its TF_CONFIG name, so node2 dials both.
        Pair("node2", "worker-0", "node1:2222"), Pair("node2", "worker-1", "node2:2222"),
        Pair("node2", "worker-2", "10.0.0.2:2223"),
    ]


def test_tasks_on_this_machine_are_dialled_from_localhost():
    launches = [launch("chief-0", "localhost", "vm:2222", local=True), launch("worker-0", "node1", "node1:2222")]
    assert plan_pairs(launches) == [Pair("localhost", "worker-0", "node1:2222"), Pair("node1", "chief-0", "vm:2222")]


def test_only_clusters_that_span_hosts_get_a_probe():
    assert not applies([launch("worker-0", "localhost", "localhost:1", local=True),
                        launch("worker-1", "localhost", "localhost:2", local=True)])
    assert applies([launch("worker-0", "localhost", "localhost:1", local=True), launch("worker-1", "node1", "node1:2")])


def test_pair_reads_name_and_port_as_tf_config_writes_them():
    assert (Pair("a", "worker-0", "node2:2222").name, Pair("a", "worker-0", "node2:2222").port) == ("node2", 2222)
    assert (Pair("a", "worker-0", "[::1]:2223").name, Pair("a", "worker-0", "[::1]:2223").port) == ("::1", 2223)


def test_failures_are_one_line_per_pair_and_one_per_unresolved_name():
    report = MeshReport(pairs=[
        PairResult(Pair("node1", "worker-1", "node2:2222"), False, "no route to host", "10.0.0.2"),
        PairResult(Pair("node1", "worker-2", "10.0.0.3:2222"), False, "connection refused", "10.0.0.3"),
        PairResult(Pair("node2", "worker-0", "n1:2222"), False, "cannot resolve"),
        PairResult(Pair("node2", "worker-3", "n1:2223"), False, "cannot resolve"),
        PairResult(Pair("node2", "worker-1", "node2:2222"), True, None, "10.0.0.2"),
    ], host_errors={"node3": "mesh probe: cannot reach node3 over ssh (Connection timed out)"})
    assert report.problems_by_host() == {
        "node3": ["mesh probe: cannot reach node3 over ssh (Connection timed out)"],
        "node2": ["cannot resolve 'n1' on node2 (the address of worker-0, worker-3 in TF_CONFIG)"],
        "node1": ["node1 -> node2:2222 (worker-1): no route to host (node2 is 10.0.0.2 on node1)",
                  "node1 -> 10.0.0.3:2222 (worker-2): connection refused"],
    }
    assert not report.ok and report.reached("node2") == 1
    assert MeshReport(pairs=[report.pairs[-1]]).ok


# ---- the probe script, run here (no ssh): the same protocol and errno reading ----

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_probe_listens_before_anyone_connects_and_leaves_the_ports_free():
    ports = [free_port(), free_port()]
    launches = [launch(f"worker-{i}", "localhost", f"127.0.0.1:{p}", local=True) for i, p in enumerate(ports)]
    report = probe_mesh(launches)
    # Nothing listened on these ports but the probe's own listeners, so success proves the ordering.
    assert report.ok, report.problems()
    assert [(r.pair.target, r.ok, r.resolved) for r in report.pairs] == [("worker-0", True, "127.0.0.1"),
                                                                        ("worker-1", True, "127.0.0.1")]
    for port in ports:  # the listeners ended with the probe
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_live_probe_only_connects_and_names_refused_and_unresolved_targets():
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    try:
        name = f"tflaunch-{secrets.token_hex(3)}.invalid"  # .invalid never resolves (RFC 6761)
        launches = [launch("worker-0", "localhost", f"127.0.0.1:{held.getsockname()[1]}", local=True),
                    launch("worker-1", "localhost", f"127.0.0.1:{free_port()}", local=True),
                    launch("worker-2", "localhost", f"{name}:2222", local=True)]
        started = time.monotonic()
        report = probe_mesh(launches, listen=False)
        assert time.monotonic() - started < 5
    finally:
        held.close()
    assert report.problems() == [
        f"cannot resolve '{name}' on localhost (the address of worker-2 in TF_CONFIG)",
        f"localhost -> {launches[1].address} (worker-1): connection refused",
    ]


def test_a_port_the_probe_cannot_listen_on_is_named_and_not_dialled():
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    try:
        launches = [launch("worker-0", "localhost", f"127.0.0.1:{port}", local=True),
                    launch("worker-1", "localhost", f"127.0.0.1:{free_port()}", local=True)]
        report = probe_mesh(launches)
    finally:
        held.close()
    assert report.problems() == [f"cannot listen on localhost:{port} (worker-0) for the mesh "
                                 "probe: address already in use"]
    assert [(r.pair.target, r.ok) for r in report.pairs] == [("worker-1", True)]
    # Dialling the held port (it accepts, and never proves itself) would wait out the connect timeout.
    assert report.seconds < DEFAULT_CONNECT_TIMEOUT, report.seconds


def test_a_probe_whose_python_cannot_start_is_named():
    broken = TaskLaunch("worker-0", "worker", 0, "localhost", "127.0.0.1:1", True, ("true",), {}, "/",
                        python="/no/such/python")
    report = probe_mesh([broken, launch("worker-1", "localhost", "127.0.0.1:2", local=True)])
    assert report.host_errors == {"localhost": "mesh probe on localhost: cannot run /no/such/python"}


# ---- real hosts over ssh ----

def on_test_hosts(test):
    """Marks a test on the real test hosts: slow, over ssh, within 180 s."""
    return pytest.mark.slow(pytest.mark.ssh(pytest.mark.timeout(180)(test)))


def cluster_file(tmp_path: Path, testhosts, body: str, name: str = "cluster.yaml") -> Path:
    path = tmp_path / name
    path.write_text(f"ssh:\n  options: {json.dumps(testhosts.ssh_options)}\n  connect_timeout: 3\n"
                    f"  keepalive_timeout: 4\n{body}")
    return path


def two_workers(tmp_path: Path, testhosts) -> tuple[Path, int]:
    """A cluster file of one worker on node1 and one on node2, both on one fresh port; and the port."""
    node1, node2 = testhosts.hosts[:2]
    port = testhosts.port()
    body = (f"worker:\n  - host: node1\n    address: {node1.address}\n    port: {port}\n"
            f"  - host: node2\n    address: {node2.address}\n    port: {port}\n")
    return cluster_file(tmp_path, testhosts, body), port


def blackholed_pair(testhosts, port: int) -> tuple[str, str]:
    """What the mesh says of each way between the two workers while node1 is blackholed towards node2:
    node1 cannot send at all; node2's SYN reaches node1, but node1's answer is dropped."""
    node1, node2 = testhosts.hosts[:2]
    return (f"node1 -> {node2.address}:{port} (worker-1): no route to host",
            f"node2 -> {node1.address}:{port} (worker-0): timed out")


def rows(stdout: str, check: str) -> dict[str, list[str]]:
    """The result column of ``tflaunch check``'s table rows for one check, by host."""
    found: dict[str, list[str]] = {}
    for line in stdout.splitlines():
        parts = line.split(None, 2)
        if len(parts) == 3 and parts[1] == check:
            found.setdefault(parts[0], []).append(parts[2])
    return found


def mesh_rows(stdout: str) -> dict[str, list[str]]:
    return rows(stdout, "mesh")


def leftovers(testhosts) -> dict[str, list[str]]:
    """Command lines of processes on each host other than sshd's own."""
    found: dict[str, list[str]] = {}
    for host in testhosts.hosts:
        for pid in testhosts.pids(host.name):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            except OSError:
                continue  # exited meanwhile
            if cmdline and not cmdline.startswith("sshd"):
                found.setdefault(host.name, []).append(f"{pid}: {cmdline[:100]}")
    return found


def nothing_left(testhosts, seconds: float = 5) -> None:
    wait_for(lambda: not leftovers(testhosts), timeout=seconds, interval=0.2,
             message=lambda: f"the hosts to be empty; left: {leftovers(testhosts)}")


class Blackhole:
    """``ip route add blackhole`` inside one host's namespace: that host alone cannot send to the address."""

    def __init__(self, testhosts, on: str, to: str):
        self.args = ["ip", "netns", "exec", testhosts.host(on).netns, "ip", "route"]
        self.address = testhosts.host(to).address

    def __enter__(self):
        subprocess.run([*self.args, "add", "blackhole", f"{self.address}/32"], check=True, timeout=10)
        return self

    def __exit__(self, *exc):
        subprocess.run([*self.args, "del", "blackhole", f"{self.address}/32"], check=True, timeout=10)


@on_test_hosts
def test_healthy_pair_passes_check(tflaunch, testhosts, tmp_path):
    cluster, _ = two_workers(tmp_path, testhosts)
    started = time.monotonic()
    done = tflaunch.run("check", str(cluster), timeout=60)
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr
    rows = mesh_rows(done.stdout)
    assert list(rows) == ["node1", "node2"]
    assert all(r[0].startswith("ok  reaches all 1 task address it dials") for r in rows.values()), rows
    # How long it took is for the benchmarks (a busy machine made it 10 s once, against 1 s idle): every
    # pair answered, so nothing was waited out.
    print(f"check with mesh, 2 healthy hosts: {elapsed:.2f} s")
    nothing_left(testhosts)


@on_test_hosts
def test_one_way_blackhole_is_named_with_its_direction_and_refuses_the_run(tflaunch, testhosts, tmp_path):
    cluster, port = two_workers(tmp_path, testhosts)
    there, back = blackholed_pair(testhosts, port)
    with Blackhole(testhosts, on="node1", to="node2"):
        started = time.monotonic()
        checked = tflaunch.run("check", str(cluster), timeout=60)
        elapsed = time.monotonic() - started
        print(f"check with mesh, node1 blackholed towards node2: {elapsed:.2f} s")
        assert checked.returncode == 1, checked.stdout
        assert mesh_rows(checked.stdout) == {"node1": [f"FAIL  {there} (blackhole route)"],
                                             "node2": [f"FAIL  {back} after 3 s"]}
        # The probe's bound is its row's "after 3 s", measured by the prober (with the default connect
        # timeout it would say 10 s). The wall clock only guards against a wait beyond the probes (a
        # second round, a stuck login): the check adds two ssh logins and the agents' start, which
        # took 7 s and more on a loaded machine (10.3 s in all once in a whole run).
        assert elapsed < 3 + 15, "the probe is bounded by the connect timeout (3 s) plus ssh and start-up"
        nothing_left(testhosts)

        refused = tflaunch.run(str(cluster), "--", "python", TASK, "print:started", "forever", timeout=60)
    assert refused.returncode == 2, refused.stderr
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith(f"tflaunch: error: {cluster}: preflight failed: ")
    assert there in line and back in line
    assert tflaunch.latest_run() is None  # refused before any task started: no run folder
    nothing_left(testhosts)


@on_test_hosts
def test_name_that_resolves_on_one_host_only_is_named(tflaunch, testhosts, tmp_path):
    """Two machines whose /etc/hosts differ, made real with ``ip netns exec``.

    ``ip netns exec NS cmd`` runs cmd with /etc/netns/NS/hosts bind-mounted over /etc/hosts in a
    private mount namespace, so glibc's ordinary resolver sees a different hosts file there. The
    python that node2's probes run under is a wrapper that does exactly that; node1 keeps the
    machine's own /etc/hosts, which does not know the name. worker-1's TF_CONFIG address is that
    name; node2 runs a second task, so node2 dials it too (and can), while node1 cannot.
    """
    node1, node2 = testhosts.hosts[:2]
    name = f"tfl-{secrets.token_hex(3)}"
    etc = Path("/etc/netns") / node2.netns
    wrapper = tmp_path / "python-with-node2-hosts"
    wrapper.write_text(f'#!/bin/sh\nexec ip netns exec {node2.netns} {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    port = testhosts.port(span=2)
    body = (f"hosts:\n  node2:\n    python: {wrapper}\n"
            f"worker:\n  - host: node1\n    address: {node1.address}\n    port: {port}\n"
            f"  - host: node2\n    address: {name}\n    port: {port}\n"
            f"  - host: node2\n    address: {node2.address}\n    port: {port + 1}\n")
    cluster = cluster_file(tmp_path, testhosts, body)
    made_parent = not etc.parent.exists()
    etc.mkdir(parents=True, exist_ok=False)
    try:
        (etc / "hosts").write_text(f"127.0.0.1\tlocalhost\n{node2.address}\t{name}\n")
        done = tflaunch.run("check", str(cluster), timeout=60)
    finally:
        (etc / "hosts").unlink()
        etc.rmdir()
        if made_parent:
            etc.parent.rmdir()
    assert done.returncode == 1, done.stdout
    rows = mesh_rows(done.stdout)
    assert rows["node1"] == [f"FAIL  cannot resolve '{name}' on node1 (the address of worker-1 in TF_CONFIG)"]
    assert rows["node2"] == ["ok  reaches all 3 task addresses it dials" + rows["node2"][0].split("dials", 1)[1]]
    nothing_left(testhosts)


@on_test_hosts
def test_auto_ports_get_no_mesh_probe(tflaunch, testhosts, tmp_path):
    node1 = testhosts.hosts[0]
    body = f"worker:\n  - localhost:auto\n  - host: node1\n    address: {node1.address}\n    port: {testhosts.port()}\n"
    done = tflaunch.run("check", str(cluster_file(tmp_path, testhosts, body)), timeout=60)
    assert rows(done.stdout, "ssh")["node1"][0].startswith("ok  reachable"), done.stdout
    assert mesh_rows(done.stdout) == {}


@on_test_hosts
def test_stalled_start_names_the_broken_pair(tflaunch, testhosts, tmp_path):
    cluster, port = two_workers(tmp_path, testhosts)
    with Blackhole(testhosts, on="node1", to="node2"):
        # Each task holds its TF_CONFIG port, as a TensorFlow server does, and never makes progress.
        done = tflaunch.run(str(cluster), "--no-check", "--start-timeout", "3", "--",
                            "python", TASK, "bind", "print:up", "forever", timeout=90)
    assert done.returncode == 124, done.stderr
    named = [line for line in done.stderr.splitlines() if "start timeout" in line and "the mesh is broken" in line]
    assert named, done.stderr
    failed = named[-1]
    there, back = blackholed_pair(testhosts, port)
    assert there in failed and f"{back} after 3 s" in failed
    assert "the mesh is broken" in done.record["attempts"][0]["reason"]
    nothing_left(testhosts)


@on_test_hosts
def test_probes_end_with_their_ssh_sessions_when_tflaunch_is_killed(tflaunch, testhosts, tmp_path):
    cluster, _ = two_workers(tmp_path, testhosts)

    def probes() -> dict[str, int]:
        found = {}
        for host in testhosts.hosts:
            for pid in testhosts.pids(host.name):
                try:
                    if b"The mesh probe" in Path(f"/proc/{pid}/cmdline").read_bytes():
                        found[host.name] = pid
                except OSError:
                    continue
        return found

    def both() -> bool:
        if proc.poll() is not None:  # it ended before its probes were seen: say why, not a timeout
            out, err = proc.communicate()
            pytest.fail(f"tflaunch check ended ({proc.returncode}) before a mesh probe ran on both hosts:\n"
                        f"{out[-2000:]}{err[-2000:]}")
        return len(probes()) == 2

    with Blackhole(testhosts, on="node1", to="node2"):  # node2's connect then waits 3 s: time to kill
        proc = tflaunch.start("check", str(cluster))
        try:
            wait_for(both, timeout=30, interval=0.05, message="a mesh probe on both hosts")
            assert len(local_probe_clients(testhosts)) == 2  # what must end below, seen while it runs
        finally:
            proc.kill()
            proc.communicate(timeout=30)
        nothing_left(testhosts, seconds=5)
        # The orphaned ssh clients end too, once their remote probes have.
        wait_for(lambda: not local_probe_clients(testhosts), timeout=5,
                 message=lambda: f"the local ssh clients of the probes to end: {local_probe_clients(testhosts)}")


def local_probe_clients(testhosts) -> list[int]:
    """Pids of ssh clients on this machine that carry a host agent (and so the probes) to this session's
    test hosts: one per host."""
    found = []
    for proc in descendants_alive(testhosts.ssh_config):
        try:
            if "tflaunch-agent" in " ".join(proc.cmdline()):  # the agent's boot line
                found.append(proc.pid)
        except psutil.Error:
            continue  # exited meanwhile
    return found
