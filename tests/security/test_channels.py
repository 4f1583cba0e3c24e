"""tflaunch's channels against a second real user (``nobody``, through setpriv): the connect-back
handshake of a Slurm agent, the mesh probe's ports, and the names that claim ports on a host.

Each attack is a real process of nobody's against a real agent, probe or lock; the Slurm one runs
the agent as the task of a real job step on the test Slurm.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT
from polling import wait_for
from test_shared_machine import NOBODY, SYSTEM_PYTHON, as_nobody

from launcher.agent.protocol import encode_fields
from launcher.transports.shipping import remote_agent_argv

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not Path(SYSTEM_PYTHON).exists(),
                                reason="needs root, setpriv and the system python3 to act as a second user")

TOKEN = "5ec2e75ec2e75ec2e75ec2e75ec2e75e"

# Another user's listener on the port an agent dials: it records every byte each caller sends and
# answers as a listener that does not hold the token would (nothing, or a made-up proof), then sends
# a START command as tflaunch would, hoping the agent obeys. It prints its port, then, when its
# lifetime is over, every connection's bytes in hex.
FAKE_LISTENER = r'''
import json, socket, sys, time
host, command, answer, lifetime = sys.argv[1], sys.argv[2].encode(), sys.argv[3], float(sys.argv[4])
server = socket.create_server((host, 0))
print(server.getsockname()[1], flush=True)
heard = []
end = time.monotonic() + lifetime
while time.monotonic() < end:
    server.settimeout(max(0.01, end - time.monotonic()))
    try:
        conn, _ = server.accept()
    except socket.timeout:
        break
    conn.settimeout(1.0)
    data = b""
    try:
        data += conn.recv(4096)
        if answer == "proof":
            conn.sendall(b"0" * 32 + b" " + b"f" * 64 + b"\n")
        conn.sendall(command)
        time.sleep(0.5)
        data += conn.recv(4096)
    except OSError:
        pass
    heard.append(data.hex())
    conn.close()
print(json.dumps(heard), flush=True)
'''


def start_line(marker: Path) -> str:
    """The command a fake listener sends: run ``id -u`` into ``marker``."""
    fields = {"name": "pwned", "argv": ["/bin/sh", "-c", f"id -u > {marker}"], "env": {"PATH": "/usr/bin:/bin"},
              "cwd": "/", "grace": "1", "output": "", "stdin": "null"}
    return f"START 1 {encode_fields(fields)}\n"


def agent_argv(host: str, port: int, within: float, python: str = sys.executable) -> list[str]:
    spec = encode_fields({"keepalive": "", "eof_grace": 1, "sample": 60, "beat": 60,
                          "connect": f"{host} {port}", "connect_within": within})
    return [*remote_agent_argv(python), spec]


@pytest.mark.slow
@pytest.mark.parametrize("answer", ["none", "proof"], ids=["no answer", "a made-up proof"])
def test_another_users_listener_on_the_agents_port_gets_no_token_and_no_obedience(tmp_path, answer):
    marker = tmp_path / "ran"
    fake = as_nobody(FAKE_LISTENER, "127.0.0.1", start_line(marker), answer, "6")
    port = int(fake.stdout.readline())
    started = time.monotonic()
    agent = subprocess.run(agent_argv("127.0.0.1", port, within=3.0), capture_output=True, text=True, timeout=60,
                           env={"PATH": os.environ["PATH"], "SLURMD_NODENAME": "n1"},
                           input=TOKEN + "\n")  # the token comes on stdin, as srun hands it on
    took = time.monotonic() - started
    heard = [bytes.fromhex(h) for h in json.loads(fake.communicate(timeout=60)[0])]
    assert not marker.exists(), "the agent ran a stranger's command"
    assert heard and all(TOKEN.encode() not in data and bytes.fromhex(TOKEN) not in data for data in heard), heard
    assert len(heard) >= 2, heard  # it tried again, after a pause
    # It gave up within its deadline, cleanly: one line, no traceback, nothing left running.
    assert agent.returncode == 2 and took < 3.0 + 5.0, (agent.returncode, took)
    assert "no listener proved itself within 3 s" in agent.stderr and "Traceback" not in agent.stderr, agent.stderr


@pytest.mark.slow
def test_an_agent_whose_listener_is_gone_gives_up_at_once(tmp_path):
    with socket.socket() as gone:
        gone.bind(("127.0.0.1", 0))
        port = gone.getsockname()[1]  # bound, never listening: a connect is refused
        started = time.monotonic()
        agent = subprocess.run(agent_argv("127.0.0.1", port, within=30.0), capture_output=True, text=True,
                               timeout=60, env={"PATH": os.environ["PATH"]}, input=TOKEN + "\n")
    assert agent.returncode == 2 and time.monotonic() - started < 5.0, agent
    assert "nothing listens there any more" in agent.stderr, agent.stderr


@pytest.mark.slow
@pytest.mark.slurm
def test_on_slurm_an_agent_dialling_another_users_listener_gives_nothing_and_runs_nothing(slurm, tmp_path):
    # The port an agent dials after tflaunch's listener closed, taken by another user on the
    # machine the agents dial (the test cluster's controller side of its bridge).
    bridge = slurm.doc["subnet"].rsplit(".", 1)[0] + ".254"
    marker = tmp_path / "ran"
    fake = as_nobody(FAKE_LISTENER, bridge, start_line(marker), "proof", "8")
    port = int(fake.stdout.readline())
    step = subprocess.run(["srun", "--nodes=1", "--ntasks=1", f"--nodelist={slurm.nodes[0]}", "--input=all",
                           f"--chdir={tmp_path}", *agent_argv(bridge, port, within=3.0)], capture_output=True,
                          text=True, timeout=120, env=slurm.env, input=TOKEN + "\n")
    heard = [bytes.fromhex(h) for h in json.loads(fake.communicate(timeout=60)[0])]
    assert heard and all(TOKEN.encode() not in data for data in heard), heard
    assert all(data.startswith(b"TFLAUNCH-HELLO " + slurm.nodes[0].encode() + b" ") for data in heard), heard
    assert not marker.exists(), "the agent ran a stranger's command"
    assert step.returncode != 0 and "no listener proved itself" in step.stdout + step.stderr, step


# -- port claims -----------------------------------------------------------------------------------

# What another user does to stop every ``port: auto`` run on a host: take the claim name of every
# port the kernel may hand out (as tflaunch's agents once claimed ports: abstract socket names), and
# make the per-user claim folder under the shared temp folder its own.
DENY_CLAIMS = r'''
import os, socket, sys
low, high, shared, uid = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
claims = []
for port in range(low, high + 1):
    claim = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    claim.bind("\0tflaunch-port-%d" % port)
    claims.append(claim)
os.mkdir(os.path.join(shared, "tflaunch-" + uid), 0o777)
'''

PICK_ALL_FOUR = r'''
import os, sys
from launcher.options import RunOptions
from launcher.transports.local import LocalTransport

with open("/proc/sys/net/ipv4/ip_local_port_range", "w") as ranges:
    ranges.write("40000 40003")
print("RANGE", flush=True)
sys.stdin.readline()  # the other user is ready
transport = LocalTransport(RunOptions())
try:
    print(sorted(transport.link_for(None).pick_ports(4, timeout=30.0)), flush=True)
finally:
    transport.close()
'''


@pytest.mark.slow
def test_another_users_claim_names_and_folders_do_not_keep_an_agent_from_any_port(tmp_path, folder_for_others):
    # In a network namespace of its own whose kernel hands out four ports, all four claimed by nobody.
    shared = folder_for_others(0o1777)
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    picker = subprocess.Popen(["unshare", "--net", sys.executable, "-c", PICK_ALL_FOUR], cwd=ROOT, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env={"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "TMPDIR": str(shared),
                                   "HOME": str(home)})
    try:
        assert picker.stdout.readline().strip() == "RANGE", picker.stderr.read()
        claimer = subprocess.Popen(
            ["nsenter", f"--net=/proc/{picker.pid}/ns/net", "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}",
             "--clear-groups", SYSTEM_PYTHON, "-c", DENY_CLAIMS + "print('READY', flush=True)\nsys.stdin.read()\n",
             "40000", "40003", str(shared), str(os.geteuid())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={"PATH": "/usr/bin:/bin"}, cwd="/")
        assert claimer.stdout.readline().strip() == "READY", claimer.stderr.read()
        picker.stdin.write("go\n")
        picker.stdin.flush()
        out, err = picker.communicate(timeout=60)
        claimer.stdin.close()
        claimer.wait(timeout=30)
    finally:
        if picker.poll() is None:
            picker.kill()
    assert picker.returncode == 0 and out.strip() == "[40000, 40001, 40002, 40003]", (out, err[-2000:])
    # The claims went to the next folder of the user's alone (nobody's folder in the shared one passed over).
    assert [p.name for p in (home / ".cache" / "tflaunch").iterdir()] == [f"port-claims-{os.uname().nodename}.lock"]


@pytest.mark.unit
def test_claims_of_one_users_runs_exclude_each_other(tmp_path):
    from launcher.agent.ports import PortClaims

    folder = tmp_path / "claims"
    first, second = PortClaims([str(folder)]), PortClaims([str(folder)])  # two runs: two descriptions
    assert first.claim(40000) and not second.claim(40000) and second.claim(40001)
    first.release(40000)
    assert second.claim(40000)
    assert first.key == second.key and len(first.key) == 32  # one key, made once, in the file


CLAIMS_SEEN = r'''
import sys
ports = [int(p) for p in sys.argv[1:]]
abstract = [line.split()[7] for line in open("/proc/net/unix") if len(line.split()) > 7 and line.split()[7][0] == "@"]
starts = [line.split()[-2] for line in open("/proc/locks") if "OFDLCK" in line]
print(any("tflaunch" in name for name in abstract),
      [p for p in ports if any(str(p) in name for name in abstract) or str(p) in starts])
'''


@pytest.mark.slow
def test_no_other_user_can_read_which_ports_an_agent_claimed():
    from launcher.options import RunOptions
    from launcher.transports.local import LocalTransport

    transport = LocalTransport(RunOptions())
    try:
        ports = transport.link_for(None).pick_ports(3, timeout=30.0)
        seen = as_nobody(CLAIMS_SEEN, *map(str, ports)).communicate(timeout=60)[0]
    finally:
        transport.close()
    assert seen.strip() == "False []", seen  # no claim name in /proc/net/unix, no port as a locked byte


@pytest.mark.slow
@pytest.mark.ssh
def test_another_users_claims_on_a_remote_host_cannot_stop_a_port_auto_run_there(testhosts, tmp_path,
                                                                                 folder_for_others):
    # node1's kernel hands out four ports, every one of them claimed by nobody on node1, and nobody
    # made the claim folder under the shared temp folder the agent is told to use.
    node = testhosts.hosts[0]
    netns = f"--net=/run/netns/{node.netns}"
    low = testhosts.port(4)
    shared, home = folder_for_others(0o1777), tmp_path / "home"
    home.mkdir(mode=0o700)
    ranges = "/proc/sys/net/ipv4/ip_local_port_range"
    before = subprocess.run(["nsenter", netns, "cat", ranges], capture_output=True, text=True, check=True).stdout
    claimer = None
    try:
        subprocess.run(["nsenter", netns, "sh", "-c", f"echo {low} {low + 3} > {ranges}"], check=True)
        claimer = subprocess.Popen(
            ["nsenter", netns, "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", SYSTEM_PYTHON,
             "-c", DENY_CLAIMS + "print('READY', flush=True)\nsys.stdin.read()\n", str(low), str(low + 3),
             str(shared), str(os.geteuid())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={"PATH": "/usr/bin:/bin"}, cwd="/")
        assert claimer.stdout.readline().strip() == "READY", claimer.stderr.read()
        cluster = tmp_path / "cluster.yaml"
        cluster.write_text(f"ssh:\n  options: {json.dumps(testhosts.ssh_options)}\n  connect_timeout: 3\n"
                           f"setup: export TMPDIR={shared} HOME={home}\n"
                           "worker:\n" + f"  - {{host: node1, address: {node.address}, port: auto}}\n" * 2)
        done = subprocess.run([sys.executable, "-m", "launcher", str(cluster), "--log-dir", str(tmp_path / "logs"),
                               "--", "sh", "-c", 'echo "$TF_CONFIG"'], cwd=tmp_path, capture_output=True, text=True,
                              timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        if claimer is not None:
            claimer.stdin.close()
            claimer.wait(timeout=30)
        subprocess.run(["nsenter", netns, "sh", "-c", f"echo {before.strip()} > {ranges}"], check=True)
    assert done.returncode == 0, done.stderr[-2000:]
    (run_dir,) = (tmp_path / "logs").iterdir()
    config = json.loads((run_dir / "worker-0.log").read_text().splitlines()[0])
    ports = sorted(int(a.rsplit(":", 1)[1]) for a in config["cluster"]["worker"])
    assert len(ports) == 2 and all(low <= p <= low + 3 for p in ports), config
    assert [p.name for p in (home / ".cache" / "tflaunch").iterdir()] == ["port-claims-node1.lock"]


# -- the port lock on tflaunch's own machine --------------------------------------------------------

@pytest.mark.slow
def test_another_user_making_every_shared_lock_folder_first_cannot_stop_a_port_auto_run(tmp_path, folder_for_others):
    # The temp folder and even the home folder are shared (1777) here, and nobody made both folders
    # tflaunch could keep its port lock in there; $XDG_RUNTIME_DIR is the user's alone.
    shared, home = folder_for_others(0o1777), folder_for_others(0o1777)
    uid = str(os.geteuid())
    nobody_made = as_nobody("import os, sys\nos.mkdir(os.path.join(sys.argv[1], 'tflaunch-' + sys.argv[3]), 0o777)\n"
                            "os.makedirs(os.path.join(sys.argv[2], '.cache', 'tflaunch'), 0o777)\n",
                            str(shared), str(home), uid)
    assert nobody_made.wait(timeout=60) == 0, nobody_made.stderr.read()
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if k != "XDG_CACHE_HOME"}
    env.update(PYTHONPATH=str(ROOT), TMPDIR=str(shared), HOME=str(home), XDG_RUNTIME_DIR=str(runtime))
    done = subprocess.run([sys.executable, "-m", "launcher", "--local", "2", "--log-dir", str(tmp_path / "logs"),
                           "--", "python", "-c", "pass"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert [p.name for p in (runtime / "tflaunch").iterdir()] == [f"ports-{os.uname().nodename}.lock"]


@pytest.fixture
def no_locks(tmp_path):
    """A folder on a file system that has no locks (FUSE, every lock refused with ENOLCK, as NFS
    without its lock daemon)."""
    fusepy = pytest.importorskip("fuse", reason="needs fusepy (pip install fusepy) for a file system without locks")
    if not (Path("/dev/fuse").exists() and shutil.which("fusermount")):
        pytest.skip("needs /dev/fuse and fusermount (apt-get install fuse) for a file system without locks")
    mount = tmp_path / "nolocks"
    mount.mkdir()
    server = subprocess.Popen([sys.executable, str(ROOT / "tests" / "helpers" / "nolockfs.py"), str(mount)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: os.path.ismount(mount) or server.poll() is not None, timeout=30,
                 message="the file system without locks to be mounted")
        assert server.poll() is None, server.stderr.read()
        yield mount
    finally:
        subprocess.run(["fusermount", "-u", str(mount)], capture_output=True)
        server.wait(timeout=30)
    assert fusepy


@pytest.mark.slow
def test_a_lock_folder_on_a_file_system_without_locks_is_passed_over(no_locks, tmp_path):
    from launcher.cluster.ports import reserve_ports
    from launcher.agent.ports import PortClaims

    first, second = no_locks / "tflaunch", tmp_path / "second"
    with reserve_ports(["w"], folders=[first, second]) as reservation:
        assert reservation.ports["w"] > 0
    assert [p.name for p in second.iterdir()] == [f"ports-{os.uname().nodename}.lock"]
    with pytest.raises(OSError) as info:
        reserve_ports(["w"], folders=[first])
    assert info.value.strerror == (f"no folder of this user's alone for the port lock: {first}: cannot lock files "
                                   "there (No locks available)")
    claims = PortClaims([str(first), str(tmp_path / "claims")])  # the agent's claims do the same
    assert claims.claim(40000) and claims.fd is not None
    assert [p.name for p in (tmp_path / "claims").iterdir()] == [f"port-claims-{os.uname().nodename}.lock"]


# -- the mesh probe ----------------------------------------------------------------------------------

# Another user at a probe's port: keeps ``count`` connections open, opening a new one for each the
# probe ends, until its stdin closes; silent ones, or ones that send a nonce line as a prober would.
CROWD = r'''
import select, socket, sys, threading
port, count, talk = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "talk"
stop = threading.Event()
def crowd():
    socks = []
    while not stop.is_set():
        while len(socks) < count and not stop.is_set():
            sock = socket.socket()
            sock.settimeout(1)
            try:
                sock.connect(("127.0.0.1", port))
                if talk:
                    sock.sendall(b"0" * 32 + b"\n")
            except OSError:
                sock.close()
                break
            socks.append(sock)
        ready = select.select(socks, [], [], 0.05)[0] if socks else []
        for sock in ready:
            try:
                gone = sock.recv(4096) == b""
            except OSError:
                gone = True
            if gone:
                socks.remove(sock)
                sock.close()
threading.Thread(target=crowd, daemon=True).start()
print("READY", flush=True)
sys.stdin.read()
stop.set()
'''


def started_probe(listen: list[int], targets: list[int], token: str) -> subprocess.Popen:
    """The real mesh probe as a host's agent starts it before a run: listening on ``listen``,
    proving itself with ``token``, and dialling each of ``targets`` on this machine once told to go."""
    import base64

    from launcher.cluster.mesh_probe import TOKEN_VARIABLE as MESH_TOKEN
    from launcher.run.checks.mesh import MESH_SOURCE

    request = {"listen": listen, "timeout": 5, "lifetime": 120, "prove": True,
               "targets": [{"id": i, "host": "127.0.0.1", "port": port} for i, port in enumerate(targets)]}
    encoded = base64.b64encode(json.dumps(request).encode()).decode()
    return subprocess.Popen([sys.executable, "-c", MESH_SOURCE, encoded], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env={**os.environ, MESH_TOKEN: token})


def probe_results(probe: subprocess.Popen) -> list[dict]:
    probe.stdin.write("go\n")
    probe.stdin.flush()
    return json.loads(probe.stdout.readline().split(" ", 1)[1])


@pytest.mark.slow
@pytest.mark.parametrize("talk", ["silent", "talk"], ids=["silent", "nonce lines"])
def test_another_users_crowd_at_a_probes_port_cannot_fail_the_probe(talk):
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    probe = started_probe([port], [port] * 20, TOKEN)
    crowd = None
    try:
        assert probe.stdout.readline().strip() == 'TFLAUNCH_MESH_LISTENING {"%d": null}' % port
        crowd = as_nobody(CROWD, str(port), "400", talk)
        assert crowd.stdout.readline().strip() == "READY"
        time.sleep(1.0)  # the crowd is at full strength
        results = probe_results(probe)
    finally:
        if crowd is not None:
            crowd.stdin.close()
            crowd.wait(timeout=30)
        probe.stdin.close()
        probe.wait(timeout=30)
    assert [r for r in results if not r["ok"]] == [] and len(results) == 20, results[:3]


@pytest.mark.slow
def test_a_port_answered_by_another_users_program_does_not_pass_the_probe():
    listener = as_nobody("import socket, sys\nserver = socket.create_server(('127.0.0.1', 0))\n"
                         "print(server.getsockname()[1], flush=True)\n"
                         "while True:\n    conn = server.accept()[0]\n    conn.recv(64)\n"
                         "    conn.sendall(b'f' * 64 + b'\\n')\n    conn.close()\n")
    port = int(listener.stdout.readline())
    probe = started_probe([], [port], TOKEN)
    try:
        assert probe.stdout.readline().strip() == "TFLAUNCH_MESH_LISTENING {}"
        (result,) = probe_results(probe)
    finally:
        listener.kill()
        listener.wait(timeout=30)
        probe.stdin.close()
        probe.wait(timeout=30)
    assert not result["ok"], result
    assert result["error"] == ("answered, but not as this run's probe (another program on the port, or the name "
                               "leads elsewhere)"), result


# Passes every connection to its port on to the probe's port (argv[1]), both ways, as a relay on a
# name that leads elsewhere would.
RELAY = r'''
import socket, sys, threading
target = int(sys.argv[1])
server = socket.create_server(("127.0.0.1", 0))
print(server.getsockname()[1], flush=True)
def pipe(a, b):
    try:
        while True:
            data = a.recv(4096)
            if not data:
                break
            b.sendall(data)
    except OSError:
        pass
    for s in (a, b):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
while True:
    conn = server.accept()[0]
    upstream = socket.create_connection(("127.0.0.1", target))
    threading.Thread(target=pipe, args=(conn, upstream), daemon=True).start()
    threading.Thread(target=pipe, args=(upstream, conn), daemon=True).start()
'''


@pytest.mark.slow
def test_a_relay_to_a_probe_at_another_port_does_not_pass_the_probe():
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    relay = as_nobody(RELAY, str(port))
    relayed = int(relay.stdout.readline())
    probe = started_probe([port], [port, relayed], TOKEN)
    try:
        assert probe.stdout.readline().strip() == 'TFLAUNCH_MESH_LISTENING {"%d": null}' % port
        direct, through_relay = probe_results(probe)
    finally:
        relay.kill()
        relay.wait(timeout=30)
        probe.stdin.close()
        probe.wait(timeout=30)
    assert direct["ok"], direct
    assert not through_relay["ok"] and through_relay["error"].startswith("answered, but not as this run's probe")


@pytest.mark.unit
def test_a_probes_proof_is_bound_to_the_address_and_port_it_was_reached_at():
    from launcher.cluster.mesh_probe import proof

    key, nonce = b"k" * 32, b"n" * 32
    assert proof(key, nonce, "::ffff:10.0.0.1", 2222) == proof(key, nonce, "10.0.0.1", 2222)
    assert proof(key, nonce, "fe80::1%eth0", 2222) == proof(key, nonce, "FE80::1", 2222)
    others = {proof(key, nonce, "10.0.0.2", 2222), proof(key, nonce, "10.0.0.1", 2223), proof(key, b"m" * 32,
                                                                                              "10.0.0.1", 2222)}
    assert proof(key, nonce, "10.0.0.1", 2222) not in others and len(others) == 3
