"""Sealed local runs: a plain ``tflaunch --local N`` keeps its tasks' ports out of other users' reach.

TensorFlow's gRPC servers listen on every interface without authentication. Here a real second
user (``nobody``, through setpriv) tries every task's port on loopback and on every other address
of this machine, while the tasks reach each other; a sealed task reaches the outside network
through slirp4netns or pasta (a listener of the test's own on this machine's non-loopback
addresses stands in for the internet); and where the helper tools or namespaces are missing, one
line says what the run lacks, and the run goes on.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import psutil
import pytest

from conftest import ROOT
from launcher.cluster.reader import parse_cluster
from launcher.cluster.spec import Network
from launcher.errors import ConfigError, OptionsError
from launcher.options import RunOptions
from launcher.run.checks.isolation import choose_network
from launcher.run.checks.outside import loopback_name_servers
from polling import wait_for
from test_isolation import MESH_TASK, listening_ports, task_ports

SYSTEM_PYTHON = "/usr/bin/python3"
NOBODY = 65534
needs_nobody = pytest.mark.skipif(
    os.geteuid() != 0 or not (Path(SYSTEM_PYTHON).exists() and shutil.which("setpriv")),
    reason="needs root, setpriv and the system python3 to act as a second user")

# Run as nobody: connect to every address:port of argv[1] (JSON), print {address: "reached" or why not}.
KNOCK = r'''
import json, socket, sys
found = {}
for host, port in json.loads(sys.argv[1]):
    try:
        socket.create_connection((host, port), timeout=2).close()
        found[f"{host}:{port}"] = "reached"
    except OSError as exc:
        found[f"{host}:{port}"] = exc.strerror or type(exc).__name__
print(json.dumps(found))
'''

# A task that reaches for the test's listener on each address in argv[1:] and prints what it hears.
FETCH = r'''
import os, socket, sys
print("NETNS", os.readlink("/proc/self/ns/net"), flush=True)
port = int(sys.argv[1])
for host in sys.argv[2:]:
    try:
        with socket.create_connection((host, port), timeout=3) as conn:
            print("HEARD", conn.recv(64).decode(), flush=True)
            break
    except OSError as exc:
        print("NOT", host, exc, flush=True)
'''


def machine_addresses() -> list[str]:
    """Every address of this machine but link-local ones, loopback first."""
    found = ["127.0.0.1"]
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family in (socket.AF_INET, socket.AF_INET6) and not address.address.startswith(("fe80", "127.")):
                if address.address != "::1" and address.address not in found:
                    found.append(address.address.split("%")[0])
    return found


def outside_addresses() -> list[str]:
    """This machine's IPv4 addresses other than loopback: outside any namespace of a run's."""
    return [a for a in machine_addresses() if "." in a and not a.startswith("127.")]


def knock_as_nobody(ports: list[int]) -> dict[str, str]:
    pairs = [(host, port) for host in machine_addresses() for port in ports]
    done = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                           SYSTEM_PYTHON, "-c", KNOCK, json.dumps(pairs)], capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin"}, cwd="/")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def reached(found: dict[str, str]) -> list[str]:
    return [where for where, what in found.items() if what == "reached"]


class Listener:
    """A TCP listener of the test's on every address of this machine, answering each caller with a token."""

    def __init__(self):
        self.token = secrets.token_hex(8)
        self.socket = socket.create_server(("0.0.0.0", 0))
        self.port = self.socket.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.socket.accept()
            except OSError:
                return
            with conn:
                conn.sendall(self.token.encode())

    def close(self) -> None:
        self.socket.close()


@pytest.fixture
def listener():
    made = Listener()
    yield made
    made.close()


def bare_path(tmp_path: Path, *tools: str) -> str:
    """A PATH holding only python and ``tools`` (links to the real ones)."""
    bare = tmp_path / "bin"
    bare.mkdir(exist_ok=True)
    (bare / "python").symlink_to(sys.executable)
    for tool in tools:
        (bare / tool).symlink_to(shutil.which(tool))
    return str(bare)


def sealed(output: str) -> bool:
    """Whether FETCH's output says it ran in another network namespace than the test's."""
    (line,) = [line for line in output.splitlines() if line.startswith("NETNS ")]
    return line.split()[1] != os.readlink("/proc/self/ns/net")


def network_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("tflaunch: network:")]


# -- other users cannot reach the tasks ----------------------------------------------------------

@needs_nobody
def test_a_plain_local_run_reaches_its_own_tasks_and_no_other_user_reaches_them(tflaunch, tmp_path):
    script = tmp_path / "mesh_task.py"
    script.write_text(MESH_TASK)
    proc = tflaunch.start("--local", "3", "--", "python", str(script), "60")
    try:
        wait_for(lambda: tflaunch.merged_text().count("REACHED") == 6 or proc.poll() is not None, timeout=60,
                 message=lambda: f"every task to reach every other; so far:\n{tflaunch.merged_text()[-2000:]}")
        assert proc.poll() is None, proc.communicate()[1]
        tflaunch.live_tasks()
        ports = sorted(task_ports(tflaunch.latest_run()).values())
        assert set(ports) <= listening_ports(inside=tflaunch.latest_run())  # they are there, inside
        found = knock_as_nobody(ports)
        assert len(found) >= 3 * 2 and reached(found) == [], found
    finally:
        proc.send_signal(2)
        proc.communicate(timeout=30)


@needs_nobody
@pytest.mark.slow
@pytest.mark.tensorflow
@pytest.mark.timeout(300)
def test_real_tensorflow_servers_of_a_plain_local_run_are_out_of_other_users_reach(tflaunch, tmp_path, listener):
    stop = tmp_path / "stop"
    proc = tflaunch.start("--local", "2", "--", "python", str(ROOT / "tests" / "helpers" / "tf_servers.py"), str(stop))
    try:
        wait_for(lambda: "ANSWERED" in tflaunch.merged_text() or proc.poll() is not None, timeout=200, interval=0.2,
                 message=lambda: f"worker-0 to run an op on worker-1; so far:\n{tflaunch.merged_text()[-2000:]}")
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        ports = sorted(task_ports(tflaunch.latest_run()).values())
        assert set(ports) <= listening_ports(inside=tflaunch.latest_run())  # both gRPC servers are up, inside
        found = knock_as_nobody([*ports, listener.port])
        # The knock works: nobody reaches the test's own listener, on loopback and another address.
        heard = [w for w in reached(found) if w.endswith(f":{listener.port}")]
        assert f"127.0.0.1:{listener.port}" in heard and len(heard) >= 2, found
        assert [w for w in reached(found) if not w.endswith(f":{listener.port}")] == [], found
        stop.touch()
        out, err = proc.communicate(timeout=120)
    finally:
        stop.touch()
        if proc.poll() is None:
            proc.send_signal(2)
            proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]


# -- the outside network --------------------------------------------------------------------------

@pytest.mark.parametrize("tool", ["pasta", "slirp4netns"])
def test_a_sealed_task_reaches_the_outside_network(tflaunch, tmp_path, listener, tool):
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed")
    outside = outside_addresses()
    assert outside, "this machine has no address but loopback"
    # Only the tool under test (and what a sealed run needs) on PATH: slirp4netns is tried first otherwise.
    done = tflaunch.run("--local", "1", "--", "python", "-c", FETCH, str(listener.port), *outside,
                        env={"PATH": bare_path(tmp_path, "unshare", tool)})
    assert done.returncode == 0, done.stderr
    assert f"HEARD {listener.token}" in done.task_output("worker-0"), done.task_output("worker-0")
    assert network_lines(done.stderr) == []
    assert sealed(done.task_output("worker-0"))


NO_OUTSIDE = ("the sealed run has no outside network: neither slirp4netns nor pasta is installed; apt-get install "
              "slirp4netns (or passt, for pasta), or run with --no-seal")
# A download, as a script that fetches its data set does it.
DOWNLOAD = "import urllib.request; urllib.request.urlopen('http://example.com/data.npz', timeout=10)"


def test_without_slirp4netns_or_pasta_the_start_says_nothing_of_the_outside_network(tflaunch, tmp_path, listener):
    done = tflaunch.run("--local", "2", "--", "python", "-c", FETCH, str(listener.port), *outside_addresses(),
                        env={"PATH": bare_path(tmp_path, "unshare")})
    assert done.returncode == 0, done.stderr
    assert network_lines(done.stderr) == []  # a run that never needs the outside is not warned of it
    assert "HEARD" not in done.task_output("worker-0") and "NOT" in done.task_output("worker-0")
    assert sealed(done.task_output("worker-0"))
    assert "Traceback" not in done.stderr


def test_without_slirp4netns_or_pasta_a_task_that_fails_to_download_is_diagnosed(tflaunch, tmp_path):
    done = tflaunch.run("--local", "1", "--", "python", "-c", DOWNLOAD, env={"PATH": bare_path(tmp_path, "unshare")})
    assert done.returncode == 1, done.stderr
    assert "Temporary failure in name resolution" in done.task_output("worker-0")
    lines = done.stderr.splitlines()
    assert ("tflaunch: diagnosis (no-outside-network): a name or network error ([Errno -3] Temporary failure in "
            f"name resolution): {NO_OUTSIDE.split('; ')[0]}") in lines, done.stderr
    assert f"tflaunch: fix: {NO_OUTSIDE.split('; ')[1]}" in lines
    assert done.record["attempts"][0]["diagnosis"] == "no-outside-network"
    assert network_lines(done.stderr) == []


def test_dry_run_and_check_say_what_a_sealed_run_has_of_the_outside_network(tflaunch, tmp_path):
    bare = {"PATH": bare_path(tmp_path, "unshare")}
    planned = tflaunch.run("--local", "2", "--dry-run", "--", "true", env=bare)
    assert planned.returncode == 0, planned.stderr
    assert f"note: network: {NO_OUTSIDE}" in planned.stdout.splitlines()
    checked = tflaunch.run("check", "--local", "2", env=bare)
    assert checked.returncode == 0, checked.stdout + checked.stderr  # a warning: the run may never need it
    assert check_row(checked.stdout, "outside") == ["WARN", NO_OUTSIDE], checked.stdout
    assert check_row(checked.stdout, "network") == ["ok", "sealed: inside the run's namespace the tasks dial each "
                                                    "other at localhost (the namespace's own loopback): no task's "
                                                    "connection to a peer leaves the run"]
    tool = next((tool for tool in ("slirp4netns", "pasta") if shutil.which(tool)), None)
    if tool is None:
        return
    outside = f"outside network through {tool} (downloads, name servers; nothing comes in)"
    with_tool = {"PATH": bare_path(Path(tempfile.mkdtemp(dir=tmp_path)), "unshare", tool)}
    planned = tflaunch.run("--local", "2", "--dry-run", "--", "true", env=with_tool)
    assert f"note: network: {outside}" in planned.stdout.splitlines(), planned.stdout
    checked = tflaunch.run("check", "--local", "2", env=with_tool)
    assert checked.returncode == 0 and check_row(checked.stdout, "outside") == ["ok", outside], checked.stdout


def check_row(table: str, check: str) -> list[str]:
    """The result and detail of this machine's ``check`` row in ``tflaunch check``'s table."""
    (row,) = [line.split(None, 3)[2:] for line in table.splitlines() if line.split()[1:2] == [check]]
    return row


def test_no_seal_keeps_the_machine_network_and_says_nothing(tflaunch, tmp_path, listener):
    done = tflaunch.run("--local", "1", "--no-seal", "--", "python", "-c", FETCH, str(listener.port), "127.0.0.1",
                        env={"PATH": bare_path(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert f"HEARD {listener.token}" in done.task_output("worker-0")  # this machine's loopback: not sealed
    assert network_lines(done.stderr) == [] and not sealed(done.task_output("worker-0"))
    both = tflaunch.run("--local", "1", "--no-seal", "--isolate-network", "--", "true")
    assert both.returncode == 2
    assert both.stderr.strip().splitlines()[-1] == (
        "tflaunch: error: --isolate-network and --no-seal cannot be combined")


# -- where namespaces are refused -------------------------------------------------------------------

def test_where_namespaces_are_refused_one_line_says_why_and_the_run_goes_on_unsealed(tflaunch, tmp_path):
    # A user namespace of the test's own whose limits allow no further user or network namespaces:
    # the kernel refuses both kinds, as on a host that restricts unprivileged namespaces.
    marker = tmp_path / "started"
    inner = " ".join(tflaunch.argv("--local", "2", "--log-dir", str(tflaunch.log_dir), "--", "touch", str(marker)))
    script = ("echo 0 > /proc/sys/user/max_user_namespaces && echo 0 > /proc/sys/user/max_net_namespaces && "
              f"exec {inner}")
    done = subprocess.run(["unshare", "--user", "--map-root-user", "sh", "-c", script], cwd=tmp_path,
                          env=tflaunch.env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    (line,) = network_lines(done.stderr)
    assert line.startswith("tflaunch: network: not sealed: cannot create a network namespace here (")
    assert "No space left on device" in line and "other users of this machine can reach the tasks' ports" in line
    assert "Traceback" not in done.stderr
    assert marker.exists()
    (run_dir,) = tflaunch.log_dir.iterdir()
    record = json.loads((run_dir / "run.json").read_text())
    assert record["sealed"] is False and record["unsealed_because"] == line.removeprefix("tflaunch: ")


# launch() of one task, sealed unless the first argument says "open"; prints the result's sealed,
# and run.json's sealed and unsealed_because.
SEALED_OR_NOT = r'''
import io, json, sys
from launcher import launch
result = launch(local=1, command=["true"], log_dir=sys.argv[2], no_seal=sys.argv[1] == "open", output=io.StringIO())
record = json.loads((result.run_dir / "run.json").read_text())
print(json.dumps([result.sealed, record["sealed"], record["unsealed_because"]]))
'''


@pytest.mark.parametrize("network, expected", [("sealed", [True, True, None]), ("open", [False, False, None])])
def test_run_json_and_launchs_result_say_whether_the_run_was_sealed(tmp_path, network, expected):
    done = subprocess.run([sys.executable, "-c", SEALED_OR_NOT, network, str(tmp_path / "logs")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == expected


# -- an ordinary user ---------------------------------------------------------------------------------

@needs_nobody
def test_an_ordinary_user_gets_a_sealed_run_too(folder_for_others, tmp_path):
    """nobody runs tflaunch (the system python3 with the project's dependencies on its path) in a
    folder of its own: the run is sealed in an unprivileged namespace, its tasks reach each other,
    and the ports are not reachable from this machine's network."""
    home = folder_for_others(0o755)
    os.chown(home, NOBODY, NOBODY)
    script = home / "mesh_task.py"
    script.write_text(MESH_TASK)
    site = next(Path(sys.prefix, "lib").glob("python3*/site-packages"))
    env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "HOME": str(home), "PYTHONPATH": f"{ROOT}:{site}"}
    proc = subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", SYSTEM_PYTHON,
                             "-m", "launcher", "--local", "2", "--log-dir", str(home / "logs"), "--", "python",
                             str(script), "30"], cwd=home, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        def merged() -> str:
            runs = list((home / "logs").glob("*/merged.log")) if (home / "logs").exists() else []
            return runs[0].read_text() if runs else ""

        wait_for(lambda: merged().count("REACHED") == 2 or proc.poll() is not None, timeout=60,
                 message=lambda: f"both tasks to reach each other; so far:\n{merged()[-2000:]}")
        assert proc.poll() is None, proc.communicate()[1]
        (run_dir,) = (home / "logs").iterdir()
        wait_for(lambda: all(t["pid"] for t in json.loads((run_dir / "run.json").read_text())["tasks"]), timeout=30,
                 message="the tasks' pids")
        pid = json.loads((run_dir / "run.json").read_text())["tasks"][0]["pid"]
        assert os.readlink(f"/proc/{pid}/ns/user") != os.readlink("/proc/self/ns/user")  # an unprivileged one
        ports = sorted(task_ports(run_dir).values())
        assert set(ports) <= listening_ports(inside=run_dir) and set(ports).isdisjoint(listening_ports())
        for host in machine_addresses():
            for port in ports:
                with pytest.raises(OSError):
                    socket.create_connection((host, port), timeout=2).close()
    finally:
        proc.send_signal(2)
        out, err = proc.communicate(timeout=60)
    assert "Traceback" not in err, err
    assert len(network_lines(err)) <= 1  # at most the line about the outside network


# -- who decides: choose_network ---------------------------------------------------------------------

HERE = frozenset({"localhost", "127.0.0.1"})


def cluster(text: str):
    return parse_cluster(text, "c.yaml", HERE)


@pytest.mark.unit
@pytest.mark.parametrize("text, options, expected", [
    ("worker: [localhost:auto, localhost:auto]\n", {}, Network.SEALED),
    ("worker: [localhost:auto, 10.0.0.9:2222]\n", {}, Network.OPEN),  # a namespace cannot span hosts
    ("worker: [localhost:auto]\n", {"no_seal": True}, Network.OPEN),
    ("worker: [localhost:auto]\n", {"isolate_network": True}, Network.ISOLATED),
    ("isolate_network: false\nworker: [localhost:auto]\n", {}, Network.OPEN),
    ("isolate_network: true\nworker: [localhost:auto]\n", {}, Network.ISOLATED),
    ("isolate_network: true\nworker: [localhost:auto]\n", {"no_seal": True}, Network.OPEN),  # the option wins
    ("isolate_network: false\nworker: [localhost:auto]\n", {"isolate_network": True}, Network.ISOLATED),
])
def test_the_network_is_the_options_choice_else_the_files_else_sealed_when_every_task_is_here(text, options,
                                                                                               expected):
    assert choose_network(cluster(text), RunOptions(**options), HERE) is expected


@pytest.mark.unit
def test_isolation_of_a_cluster_with_remote_tasks_and_both_options_are_refused():
    with pytest.raises(ConfigError, match="needs every task on this machine"):
        choose_network(cluster("isolate_network: true\nworker: [localhost:auto, 10.0.0.9:2222]\n"), RunOptions(),
                       HERE)
    with pytest.raises(OptionsError, match="cannot be combined"):
        RunOptions(isolate_network=True, no_seal=True)


def test_a_sealed_runs_ports_are_reserved_inside_its_namespace(tflaunch):
    """No connection in the namespace takes a task's port as its local port before the task binds it:
    the kernel hands out no reserved port (the run's ports were picked free outside)."""
    show = "print('RESERVED', open('/proc/sys/net/ipv4/ip_local_reserved_ports').read().strip())"
    done = tflaunch.run("--local", "2", "--", "python", "-c", show)
    assert done.returncode == 0, done.stderr
    ports = set(task_ports(done.run_dir).values())
    for name in ("worker-0", "worker-1"):
        (line,) = [line for line in done.task_output(name).splitlines() if line.startswith("RESERVED")]
        reserved = set()
        for item in line.split()[1].split(","):  # the kernel writes neighbours as a range, 34000-34001
            first, _, last = item.partition("-")
            reserved.update(range(int(first), int(last or first) + 1))
        assert reserved == ports


@pytest.mark.unit
@pytest.mark.parametrize("text, expected", [
    ("nameserver 127.0.0.53\noptions edns0 trust-ad\nsearch lan\n", ["127.0.0.53"]),  # systemd-resolved
    ("nameserver ::1\nnameserver 127.0.0.1\n", ["::1", "127.0.0.1"]),
    ("nameserver 127.0.0.53\nnameserver 10.255.255.53\n", []),  # one reachable from inside is enough
    ("nameserver 10.255.255.53\n", []),
    ("# nameserver 127.0.0.1\n", []),
])
def test_name_servers_on_loopback_alone_are_out_of_a_sealed_runs_reach(text, expected):
    assert loopback_name_servers(text) == expected


def test_a_loopback_name_server_is_said_by_dry_run_not_at_the_start(tflaunch, tmp_path):
    """This machine's resolv.conf replaced, in a mount namespace of the test's own, by one naming
    systemd-resolved's 127.0.0.53 alone."""
    if not (shutil.which("slirp4netns") or shutil.which("pasta")):
        pytest.skip("neither slirp4netns nor pasta is installed")
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.53\n")
    def run(*args: str) -> subprocess.CompletedProcess:
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                'mount --bind "$0" /etc/resolv.conf && exec "$@"', str(resolv),
                *tflaunch.argv("--local", "1", "--log-dir", str(tflaunch.log_dir), *args)]
        return subprocess.run(argv, cwd=tflaunch.cwd, env=tflaunch.env(), capture_output=True, text=True, timeout=60)

    done = run("--", "true")
    assert done.returncode == 0, done.stderr
    assert network_lines(done.stderr) == []
    planned = run("--dry-run", "--", "true")
    assert ("note: network: names do not resolve inside the sealed run (addresses do): this machine's name server "
            "(127.0.0.53) is on its loopback, out of the tasks' reach; name a name server off loopback in "
            "/etc/resolv.conf, or run with --no-seal") in planned.stdout.splitlines(), planned.stdout
