"""--isolate-network with real namespaces and real tasks, and the exposure warning for clusters
with public addresses (run, --dry-run and check)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT
from launcher.cluster.exposure import exposure_text, public_addresses, unique_names
from polling import wait_for

# Each task listens on its own TF_CONFIG port, connects to every other task's port on loopback
# and says so, waits until every other task has connected to it, then sleeps argv[1] seconds.
MESH_TASK = r'''
import json, os, socket, sys, time
config = json.loads(os.environ["TF_CONFIG"])
me = config["cluster"][config["task"]["type"]][config["task"]["index"]]
server = socket.socket()
server.bind(("", int(me.rsplit(":", 1)[1])))
server.listen()
print("LISTENING", me, flush=True)
peers = [a for addresses in config["cluster"].values() for a in addresses if a != me]
for address in peers:
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            print("REACHED", address, flush=True)
            break
        except OSError:
            if time.monotonic() > deadline:
                print("UNREACHABLE", address, flush=True)
                sys.exit(3)
            time.sleep(0.05)
server.settimeout(20)
for _ in peers:  # stay until every peer has reached this task too
    server.accept()[0].close()
time.sleep(float(sys.argv[1]))
'''


def listening_ports(inside: Path | None = None) -> set[int]:
    """TCP ports listening in tflaunch's (the root) network namespace, or in the namespace of the
    first task of the run in ``inside``."""
    enter = []
    if inside is not None:
        pid = json.loads((inside / "run.json").read_text())["tasks"][0]["pid"]
        enter = ["nsenter", f"--net=/proc/{pid}/ns/net"]
    out = subprocess.run([*enter, "ss", "-Hltn"], capture_output=True, text=True, timeout=10, check=True).stdout
    return {int(line.split()[3].rsplit(":", 1)[1]) for line in out.splitlines() if line.strip()}


def task_ports(run_dir: Path) -> dict[str, int]:
    tasks = json.loads((run_dir / "run.json").read_text())["tasks"]
    return {t["name"]: int(t["address"].rsplit(":", 1)[1]) for t in tasks}


def merged_text(tflaunch) -> str:
    run_dir = tflaunch.latest_run()
    merged = run_dir / "merged.log" if run_dir else None
    return merged.read_text() if merged and merged.exists() else ""


def test_isolated_tasks_reach_each_other_and_nothing_outside_sees_their_ports(tflaunch, tmp_path):
    script = tmp_path / "mesh_task.py"
    script.write_text(MESH_TASK)
    proc = tflaunch.start("--local", "3", "--isolate-network", "--", "python", str(script), "60")
    try:
        wait_for(lambda: merged_text(tflaunch).count("REACHED") == 6 or proc.poll() is not None, timeout=60,
                 message=lambda: f"every task to reach every other; so far:\n{merged_text(tflaunch)[-2000:]}")
        assert proc.poll() is None, proc.communicate()[1]
        tflaunch.live_tasks()
        ports = task_ports(tflaunch.latest_run())
        assert set(ports.values()).isdisjoint(listening_ports())
        # The ports are there, inside the tasks' namespace: the check above is not vacuous.
        assert set(ports.values()) <= listening_ports(inside=tflaunch.latest_run())
    finally:
        proc.send_signal(2)
        proc.communicate(timeout=30)
    assert proc.returncode == 130


def test_isolate_network_key_in_an_all_local_cluster_file(tflaunch, tmp_path):
    script = tmp_path / "mesh_task.py"
    script.write_text(MESH_TASK)
    cluster = tmp_path / "local.yaml"
    cluster.write_text("isolate_network: true\nworker:\n  - localhost:auto\n  - localhost:auto\n")
    done = tflaunch.run(str(cluster), "--", "python", str(script), "0")
    assert done.returncode == 0, done.stderr
    assert "REACHED" in done.task_output("worker-0") and "REACHED" in done.task_output("worker-1")
    argv = done.record["tasks"][0]["argv"]
    assert argv[-2:] == [str(script), "0"] and "nsenter" not in argv  # the agent joins the task to it


def test_the_outside_network_is_not_reachable_from_inside(tflaunch):
    probe = ("import socket, sys\nfor family, address in ((socket.AF_INET, ('10.255.255.53', 53)),):\n"
             "    s = socket.socket(family, socket.SOCK_DGRAM)\n"
             "    try:\n        s.connect(address); print('ROUTE', flush=True)\n"
             "    except OSError as exc:\n        print('NO ROUTE', exc.errno, flush=True)\n")
    done = tflaunch.run("--local", "1", "--isolate-network", "--", "python", "-c", probe)
    assert done.returncode == 0, done.stderr
    assert "NO ROUTE" in done.task_output("worker-0")
    plain = tflaunch.run("--local", "1", "--no-seal", "--", "python", "-c", probe)
    assert "ROUTE" in plain.task_output("worker-0").splitlines()


def test_isolation_refuses_clusters_with_remote_hosts(tflaunch, tmp_path):
    cluster = tmp_path / "mixed.yaml"
    cluster.write_text("worker:\n  - localhost:auto\n  - host: 10.123.0.9\n    port: 2222\n")
    done = tflaunch.run(str(cluster), "--isolate-network", "--", "true")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        f"tflaunch: error: {cluster}: --isolate-network: needs every task on this machine; worker[1] runs on "
        "'10.123.0.9' (a network namespace cannot span hosts)")
    assert done.run_dir is None
    cluster.write_text(cluster.read_text() + "isolate_network: true\n")
    done = tflaunch.run(str(cluster), "--", "true")
    assert done.returncode == 2 and f"{cluster}: isolate_network: needs every task" in done.stderr


UNPRIVILEGED = r'''
import subprocess
from launcher.run.checks.isolation import NetworkNamespace
network = NetworkNamespace.create()
user, net = network.paths
inside = subprocess.run(["nsenter", f"--user={user}", f"--net={net}", "--preserve-credentials", "cat", "/proc/net/dev"],
                        capture_output=True, text=True, timeout=10)
print(network.unprivileged, [line.split(":")[0].strip() for line in inside.stdout.splitlines()[2:]])
network.close()
'''


@pytest.mark.skipif(not (Path("/usr/bin/python3").exists() and Path("/usr/bin/setpriv").exists()),
                    reason="needs the system python3 and setpriv to run as another user")
def test_a_user_without_root_gets_an_unprivileged_namespace(tmp_path):
    # The project's venv lives under /root here, out of nobody's reach: the system python3 runs the module.
    done = subprocess.run(["setpriv", "--reuid", "nobody", "--regid", "nogroup", "--clear-groups",
                           "/usr/bin/python3", "-c", UNPRIVILEGED], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True ['lo']"


def test_where_no_namespace_can_be_made_one_line_says_so_and_nothing_starts(tflaunch, tmp_path):
    # A user namespace of the test's own whose limits allow no further user or network namespaces:
    # the kernel refuses both kinds, as on a host without user namespaces.
    marker = tmp_path / "started"
    inner = " ".join(tflaunch.argv("--local", "2", "--isolate-network", "--log-dir", str(tflaunch.log_dir),
                                   "--", "touch", str(marker)))
    script = ("echo 0 > /proc/sys/user/max_user_namespaces && echo 0 > /proc/sys/user/max_net_namespaces && "
              f"exec {inner}")
    done = subprocess.run(["unshare", "--user", "--map-root-user", "sh", "-c", script], cwd=tmp_path,
                          env=tflaunch.env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("tflaunch: error: --isolate-network: cannot create a network namespace here (")
    assert "No space left on device" in line and "nothing was started" in line
    assert not marker.exists()
    assert not tflaunch.log_dir.exists() or not any(tflaunch.log_dir.iterdir())


@pytest.mark.slow
@pytest.mark.tensorflow
@pytest.mark.timeout(360)  # its run waits up to 300 s
def test_builtin_trainer_trains_inside_the_namespace_and_its_ports_stay_inside(tflaunch):
    proc = tflaunch.start("--local", "2", "--isolate-network", "--", "python", "-m", "trainer", "--epochs", "3")

    def first_epoch() -> bool:
        run_dir = tflaunch.latest_run()
        metrics = run_dir / "metrics.jsonl" if run_dir else None
        if proc.poll() is not None:
            pytest.fail(f"tflaunch ended before the first epoch:\n{proc.communicate()[1][-3000:]}")
        return bool(metrics and metrics.exists() and '"epoch"' in metrics.read_text())

    try:
        wait_for(first_epoch, timeout=200, interval=0.2, message="the first epoch")
        # Training is under way, so both gRPC servers are listening, in the tasks' namespace only.
        ports = task_ports(tflaunch.latest_run())
        assert set(ports.values()).isdisjoint(listening_ports())
        assert set(ports.values()) <= listening_ports(inside=tflaunch.latest_run())
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.send_signal(2)
            proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    metrics = [json.loads(line) for line in (tflaunch.latest_run() / "metrics.jsonl").read_text().splitlines()]
    epochs = sorted({m["epoch"] for m in metrics if m.get("kind") == "epoch"})
    assert epochs == [1, 2, 3]
    assert any("test_accuracy" in m for m in metrics)


# -- exposure -------------------------------------------------------------------------------------

def fake_resolver(table: dict[str, list[str]]):
    return lambda name: table.get(name, [])


def test_public_addresses_are_found_and_private_ones_are_not():
    table = {"gpu1.example.org": ["8.8.4.4", "10.0.0.4"], "node1": ["10.124.3.11"], "v6": ["2001:4860:4860::8888"],
             "doc": ["203.0.113.9"], "link": ["fe80::1%eth0"], "cgnat": ["100.64.0.1"]}
    found = public_addresses(["gpu1.example.org", "node1", "v6", "doc", "link", "cgnat", "unknown", "localhost"],
                             fake_resolver(table))
    assert found == {"gpu1.example.org": ["8.8.4.4"], "v6": ["2001:4860:4860::8888"]}


def test_exposure_text_names_each_host_once():
    text = exposure_text(unique_names(["8.8.8.8", "[2001:4860:4860::8888]", "8.8.8.8", "node1"]),
                         fake_resolver({"8.8.8.8": ["8.8.8.8"], "2001:4860:4860::8888": ["2001:4860:4860::8888"]}))
    assert text.startswith("8.8.8.8, 2001:4860:4860::8888 have public addresses: TensorFlow's gRPC servers")
    assert exposure_text(["node1", "localhost"], fake_resolver({"node1": ["10.0.0.1"]})) is None


def test_a_resolver_that_hangs_does_not_hold_the_launch():
    import threading
    import time

    never = threading.Event()

    def slow(name):
        never.wait(30)
        return ["8.8.8.8"]

    start = time.monotonic()
    assert public_addresses(["slow.example"], slow, timeout=0.3) == {}
    assert time.monotonic() - start < 10  # the resolver would hold it for 30 s
    never.set()


def public_cluster(tmp_path: Path) -> Path:
    cluster = tmp_path / "public.yaml"
    cluster.write_text("ssh:\n  connect_timeout: 1\nworker:\n  - 8.8.8.8:2222\n  - host: 10.123.0.9\n    port: 2222\n")
    return cluster


def test_dry_run_warns_once_about_public_hosts(tflaunch, tmp_path):
    done = tflaunch.run(str(public_cluster(tmp_path)), "--dry-run")
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if "public address" in line]
    assert warnings == ["tflaunch: warning: 8.8.8.8 has a public address: TensorFlow's gRPC servers listen on every "
                        "interface without authentication and run whatever reaches them; run this cluster on a "
                        "private network or behind a firewall that admits only its own hosts"]


def test_run_and_check_warn_about_public_hosts(tflaunch, tmp_path):
    cluster = public_cluster(tmp_path)
    done = tflaunch.run(str(cluster), "--no-check", "--", "true", timeout=60)
    assert [line for line in done.stderr.splitlines() if "public address" in line][0].startswith(
        "tflaunch: warning: 8.8.8.8 has a public address")
    assert sum("public address" in line for line in done.stderr.splitlines()) == 1
    checked = tflaunch.run("check", str(cluster), timeout=60)
    rows = [row for row in checked.stdout.splitlines() if "exposure" in row]
    assert len(rows) == 1 and "WARN" in rows[0] and "8.8.8.8 has a public address" in rows[0]


def test_local_and_private_clusters_get_no_warning(tflaunch, tmp_path):
    cluster = tmp_path / "private.yaml"
    cluster.write_text("worker:\n  - 10.123.0.8:2222\n  - 192.168.7.9:2222\n  - host: localhost\n    port: auto\n")
    for args in ([str(cluster), "--dry-run"], ["--local", "2", "--dry-run"], ["--local", "1", "--", "true"]):
        done = tflaunch.run(*args)
        assert done.returncode == 0, done.stderr
        assert "public address" not in done.stderr and "warning" not in done.stderr



def test_a_fixed_port_busy_on_the_machine_is_free_inside_an_isolated_run(tflaunch, tmp_path):
    import socket
    import sys

    from conftest import TASK

    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cluster = tmp_path / "cluster.yaml"
        cluster.write_text(f"worker: [localhost:{port}]\nisolate_network: true\n")
        done = tflaunch.run(str(cluster), "--", sys.executable, TASK, "bind", "print:bound")
        assert done.returncode == 0, done.stderr
        assert "bound" in done.task_output("worker-0")
        cluster.write_text(f"worker: [localhost:{port}]\n")  # sealed by default: free inside too
        done = tflaunch.run(str(cluster), "--", sys.executable, TASK, "bind", "print:bound")
        assert done.returncode == 0 and "bound" in done.task_output("worker-0"), done.stderr
        refused = tflaunch.run(str(cluster), "--no-seal", "--", sys.executable, TASK, "bind")
        assert refused.returncode == 2 and "is already in use on this machine" in refused.stderr


def test_dry_run_says_the_tasks_would_be_isolated(tflaunch):
    done = tflaunch.run("--local", "2", "--isolate-network", "--dry-run")
    assert done.returncode == 0
    assert done.stdout.splitlines()[1].startswith("network: isolated")
    assert "network: isolated" not in tflaunch.run("--local", "2", "--dry-run").stdout
