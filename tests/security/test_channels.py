"""tflaunch's channels against a second real user (``nobody``, through setpriv): the connect-back
handshake of a Slurm agent, the mesh probe's ports, and the names that claim ports on a host.

Each attack is a real process of nobody's against a real agent, probe or lock; the Slurm one runs
the agent as the task of a real job step on the test Slurm.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_shared_machine import NOBODY, SYSTEM_PYTHON, as_nobody

from launcher.transports.hostagent import TOKEN_VARIABLE, encode_fields
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
                           env={"PATH": os.environ["PATH"], TOKEN_VARIABLE: TOKEN, "SLURMD_NODENAME": "n1"},
                           stdin=subprocess.DEVNULL)
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
                               timeout=60, env={"PATH": os.environ["PATH"], TOKEN_VARIABLE: TOKEN},
                               stdin=subprocess.DEVNULL)
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
    step = subprocess.run(["srun", "--nodes=1", "--ntasks=1", f"--nodelist={slurm.nodes[0]}", "--input=none",
                           f"--chdir={tmp_path}", *agent_argv(bridge, port, within=3.0)], capture_output=True,
                          text=True, timeout=120, env={**slurm.env, TOKEN_VARIABLE: TOKEN}, stdin=subprocess.DEVNULL)
    heard = [bytes.fromhex(h) for h in json.loads(fake.communicate(timeout=60)[0])]
    assert heard and all(TOKEN.encode() not in data for data in heard), heard
    assert all(data.startswith(b"TFLAUNCH-HELLO " + slurm.nodes[0].encode() + b" ") for data in heard), heard
    assert not marker.exists(), "the agent ran a stranger's command"
    assert step.returncode != 0 and "no listener proved itself" in step.stdout + step.stderr, step
