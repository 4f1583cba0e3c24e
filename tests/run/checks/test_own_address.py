"""A sealed run whose cluster names this machine by an address of its own or by its host name.

TF_CONFIG keeps the names the cluster gives; the run's namespace carries the addresses they
resolve to on its loopback, so each task's dial to a peer reaches the run's own task. Here
tflaunch runs in a network, UTS and mount namespace of the test's own that plays "this machine":
an interface with 10.77.0.1, the host name ``thishost`` and an /etc/hosts that names it. A second
user (``nobody``) listens on this machine's 10.77.0.1 at the tasks' ports: no task may reach it.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import time
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import Finished
from launcher.cluster.reader import parse_cluster
from launcher.run.checks import isolation
from launcher.cluster.spec import Network
from launcher.run.checks.inside import Offline, carried, dial_line, missing_outside, outside_line, own_names
from test_sealed import NOBODY, SYSTEM_PYTHON, bare_path, needs_nobody

ADDRESS, NAME = "10.77.0.1", "thishost"
PORTS = (23001, 23002)  # free in the test's own network namespace, whoever else runs beside it

# Each task answers every caller with its own name on its TF_CONFIG port, dials every other task's
# TF_CONFIG address and prints who answered: a peer's name, or anyone else's.
PEER = r'''
import json, os, socket, sys, threading, time
config = json.loads(os.environ["TF_CONFIG"])
mine = config["cluster"][config["task"]["type"]][config["task"]["index"]]
server = socket.create_server(("", int(mine.rsplit(":", 1)[1])), family=socket.AF_INET6, dualstack_ipv6=True)
def serve():
    while True:
        conn, _ = server.accept()
        with conn:
            conn.sendall(os.environ["TFLAUNCH_TASK"].encode())
threading.Thread(target=serve, daemon=True).start()
print("INTERFACES", " ".join(sorted(line.split(":")[0].strip() for line in open("/proc/self/net/dev").readlines()[2:])))
for address in [a for addresses in config["cluster"].values() for a in addresses if a != mine]:
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=2) as conn:
                print("HEARD", address, conn.recv(64).decode(), flush=True)
                break
        except OSError as exc:
            if time.monotonic() > deadline:
                print("FAILED", address, exc, flush=True)
                sys.exit(3)
            time.sleep(0.05)
time.sleep(1)  # the peer's dial may come after this task's
'''

# Run as nobody: listen on argv[1] at each port of argv[2:], answer "impostor", for at most a minute.
IMPOSTOR = r'''
import socket, sys, threading, time
servers = [socket.create_server((sys.argv[1], int(port))) for port in sys.argv[2:]]
def serve(server):
    while True:
        conn, _ = server.accept()
        with conn:
            conn.sendall(b"impostor")
for server in servers:
    threading.Thread(target=serve, args=(server,), daemon=True).start()
print("listening", flush=True)
time.sleep(60)
'''

# What dials the impostor from this machine, outside the run: proof that it answers there.
CONTROL = r'''
import socket, sys
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2) as conn:
    print("CONTROL", conn.recv(64).decode(), flush=True)
'''

# Make "this machine" (lo, a veth pair with ADDRESS and a default route for pasta's template,
# thishost in /etc/hosts), start the impostor when asked, then tflaunch with the PATH given.
MACHINE = r'''
set -e
ip link set lo up
ip link add this0 type veth peer name this1
ip address add {address}/24 dev this0
ip link set this1 up && ip link set this0 up
ip route add default via 10.77.0.254 dev this0
hostname {name}
mount --bind {hosts} /etc/hosts
if [ -n "{impostor}" ]; then
    setpriv --reuid={nobody} --regid={nobody} --clear-groups {system_python} -c {impostor} {address} {ports} > {ready} &
    impostor=$!
    while ! grep -q listening {ready}; do sleep 0.05; done
    {python} -c {control} {address} {port}
fi
set +e
env PATH={path} {tflaunch}
status=$?
[ -z "{impostor}" ] || kill $impostor
exit $status
'''


def on_this_machine(tflaunch, tmp_path: Path, args: list[str], tools: tuple[str, ...], impostor: bool = False):
    """tflaunch ``args`` in the namespaces that play this machine, with only ``tools`` of slirp4netns and
    pasta on its PATH, finished."""
    hosts = tmp_path / "hosts"
    hosts.write_text(f"127.0.0.1 localhost\n{ADDRESS} {NAME}\n")
    ready = tmp_path / "impostor.out"
    script = MACHINE.format(
        address=ADDRESS, name=NAME, hosts=shlex.quote(str(hosts)), nobody=NOBODY, system_python=SYSTEM_PYTHON,
        impostor=shlex.quote(IMPOSTOR) if impostor else "", ports=" ".join(map(str, PORTS)), ready=ready,
        python=sys.executable, control=shlex.quote(CONTROL), port=PORTS[1],
        path=shlex.quote(bare_path(Path(tempfile.mkdtemp(dir=tmp_path)), "unshare", *tools)),
        tflaunch=shlex.join(tflaunch.argv(*tflaunch._with_log_dir(tuple(args)))))
    done = subprocess.run(["unshare", "--net", "--uts", "--mount", "--propagation", "private", "sh", "-c", script],
                          cwd=tmp_path, env=tflaunch.env(), capture_output=True, text=True, timeout=120)
    return Finished(done.returncode, done.stdout, done.stderr, tflaunch.latest_run())


TOOLS = [pytest.param((), id="no-outside"), pytest.param(("slirp4netns",), id="slirp4netns"),
         pytest.param(("pasta",), id="pasta")]


def installed(tools: tuple[str, ...]) -> None:
    for tool in tools:
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")


def heard(output: str) -> dict[str, str]:
    """{dialled address: who answered} from PEER's output."""
    return {line.split()[1]: line.split()[2] for line in output.splitlines() if line.startswith("HEARD ")}


def interfaces(output: str) -> list[str]:
    (line,) = [line for line in output.splitlines() if line.startswith("INTERFACES")]
    return line.split()[1:]


@pytest.mark.parametrize("tools", TOOLS)
def test_tasks_given_this_machines_address_reach_each_other_inside_the_run(tflaunch, tmp_path, tools):
    installed(tools)
    done = on_this_machine(tflaunch, tmp_path, ["-H", f"{ADDRESS}:2", "--", "python", "-c", PEER], tools)
    assert done.returncode == 0, done.stderr[-3000:]
    ports = {t["name"]: t["address"] for t in done.record["tasks"]}
    assert all(address.startswith(f"{ADDRESS}:") for address in ports.values())  # TF_CONFIG keeps it
    assert heard(done.task_output("worker-0")) == {ports["worker-1"]: "worker-1"}
    assert heard(done.task_output("worker-1")) == {ports["worker-0"]: "worker-0"}
    # The outside network came up with the tool asked for (and only then), beside the carried address.
    assert len(interfaces(done.task_output("worker-0"))) == (2 if tools else 1)
    assert not [line for line in done.stderr.splitlines() if line.startswith("tflaunch: network:")]


def test_an_isolated_run_given_this_machines_address_keeps_it_inside_too(tflaunch, tmp_path):
    done = on_this_machine(tflaunch, tmp_path, ["-H", f"{ADDRESS}:2", "--isolate-network", "--", "python", "-c",
                                                PEER], ("slirp4netns",))
    assert done.returncode == 0, done.stderr[-3000:]
    ports = {t["name"]: t["address"] for t in done.record["tasks"]}
    assert heard(done.task_output("worker-0")) == {ports["worker-1"]: "worker-1"}
    assert interfaces(done.task_output("worker-0")) == ["lo"]  # no outside network, as asked


@needs_nobody
@pytest.mark.parametrize("tools", TOOLS)
def test_a_cluster_file_naming_this_machine_never_reaches_another_users_listener(tflaunch, tmp_path, tools):
    installed(tools)
    cluster = tmp_path / "here.yaml"
    cluster.write_text(f"worker:\n  - {NAME}:{PORTS[0]}\n  - {NAME}:{PORTS[1]}\n")
    done = on_this_machine(tflaunch, tmp_path, [str(cluster), "--", "python", "-c", PEER], tools, impostor=True)
    assert "CONTROL impostor" in done.stdout, done.stderr[-3000:]  # it answers at that address, outside the run
    assert done.returncode == 0, done.stderr[-3000:]
    assert heard(done.task_output("worker-0")) == {f"{NAME}:{PORTS[1]}": "worker-1"}
    assert heard(done.task_output("worker-1")) == {f"{NAME}:{PORTS[0]}": "worker-0"}


def test_dry_run_shows_where_the_tasks_dial_each_other(tflaunch, tmp_path):
    by_address = on_this_machine(tflaunch, tmp_path, ["-H", f"{ADDRESS}:2", "--dry-run", "--", "true"],
                                 ("slirp4netns",))
    assert by_address.returncode == 0, by_address.stderr
    assert (f"note: network: inside the run's namespace the tasks dial each other at {ADDRESS} (carried on the "
            "namespace's loopback): no task's connection to a peer leaves the run") in by_address.stdout.splitlines()
    cluster = tmp_path / "here.yaml"
    cluster.write_text(f"worker:\n  - {NAME}:{PORTS[0]}\n  - localhost:{PORTS[1]}\n")
    by_name = on_this_machine(tflaunch, tmp_path, [str(cluster), "--dry-run", "--", "true"], ())
    assert by_name.returncode == 0, by_name.stderr
    assert (f"note: network: inside the run's namespace the tasks dial each other at {NAME} ({ADDRESS}, carried on "
            "the namespace's loopback); localhost (the namespace's own loopback): no task's connection to a peer "
            "leaves the run") in by_name.stdout.splitlines()


# -- the namespace's own addresses ---------------------------------------------------------------------

@pytest.mark.parametrize("holder", ["shell", "python"])
def test_the_namespace_carries_the_addresses_it_is_given_on_its_loopback(monkeypatch, holder):
    if holder == "python":  # the holder where there is no iproute2
        monkeypatch.setattr(isolation, "_holder", lambda: [sys.executable, "-I", "-S", "-c", isolation.HOLDER])
    network = isolation.NetworkNamespace.create([23001], ["192.0.2.77", "fd00::77"])
    try:
        shown = subprocess.run(["nsenter", f"--net={network.paths[-1]}", "ip", "-o", "address", "show", "dev", "lo"],
                               capture_output=True, text=True, timeout=10, check=True).stdout
    finally:
        network.close()
    found = {line.split()[3] for line in shown.splitlines()}
    assert {"127.0.0.1/8", "192.0.2.77/32", "fd00::77/128"} <= found, shown


@pytest.mark.unit
def test_the_names_a_cluster_gives_this_machine_and_the_addresses_carried():
    spec = parse_cluster("worker:\n  - localhost:2222\n  - 127.0.0.2:2223\n  - vm:2224\n  - 192.0.2.2:2225\n"
                         "  - host: localhost\n    port: 2226\n    address: '[fd00::2]'\n  - gone:2227\n",
                         "c.yaml", frozenset({"localhost", "vm", "192.0.2.2", "gone"}))
    table = {"vm": ["127.0.1.1", "198.51.100.4", "fe80::1"], "gone": []}
    names = own_names(spec, resolver=lambda host: table[host])
    assert names == {"vm": ("127.0.1.1", "198.51.100.4", "fe80::1"), "192.0.2.2": ("192.0.2.2",),
                     "fd00::2": ("fd00::2",), "gone": ()}
    # Loopback is every namespace's own, and a link-local address needs an interface the namespace lacks.
    kept = carried(names)
    assert kept == ["192.0.2.2", "fd00::2", "198.51.100.4"]
    assert dial_line(spec, names, kept) == (
        "inside the run's namespace the tasks dial each other at localhost (the namespace's own loopback); "
        "127.0.0.2 (the namespace's own loopback); vm (127.0.1.1, 198.51.100.4, fe80::1, carried on the namespace's "
        "loopback); 192.0.2.2 (carried on the namespace's loopback); fd00::2 (carried on the namespace's "
        "loopback); gone (it does not resolve here: no task can dial it): no task's connection to a peer leaves "
        "the run")
    # At a run's start a name that does not resolve in time is left out, and the line says so.
    def silent(host):
        time.sleep(5 if host == "vm" else 0)
        return table[host]

    started = time.monotonic()
    quick = own_names(spec, resolver=silent, wait=0.2)
    assert time.monotonic() - started < 2 and "vm" not in quick and quick["gone"] == ()
    assert "vm (not resolved within 0.2 s at the start: not carried)" in dial_line(spec, quick, carried(quick))
    assert carried(quick) == ["192.0.2.2", "fd00::2"]


@pytest.mark.unit
def test_what_a_run_lacks_of_the_outside_network_and_its_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # neither tool
    assert missing_outside(Network.SEALED, "neither slirp4netns nor pasta is installed") == Offline(
        "the sealed run has no outside network: neither slirp4netns nor pasta is installed",
        "apt-get install slirp4netns (or passt, for pasta), or run with --no-seal")
    (tmp_path / "slirp4netns").write_text("")
    (tmp_path / "slirp4netns").chmod(0o755)  # installed, but it failed to start
    assert missing_outside(Network.SEALED, "slirp4netns: open(/dev/net/tun): No such device").fix == (
        "mend that tool, or run with --no-seal")
    names = "this machine's name server (127.0.0.53) is on its loopback"
    assert missing_outside(Network.SEALED, None, names) == Offline(
        "names do not resolve inside the sealed run (addresses do): this machine's name server (127.0.0.53) is on its "
        "loopback", "name a name server off loopback in /etc/resolv.conf, or run with --no-seal")
    assert missing_outside(Network.SEALED, None, None) is None
    assert missing_outside(Network.OPEN, "anything") is None
    isolated = missing_outside(Network.ISOLATED, None)
    assert isolated.fix == "run without --isolate-network (or isolate_network: false in the cluster file)"
    assert outside_line(Network.SEALED, None, "pasta") == (
        "outside network through pasta (downloads, name servers; nothing comes in)")
    assert outside_line(Network.OPEN, None, "pasta") is None
