"""--nnodes on one machine: the token's rules, the endpoint, rank order, and a loopback run whose
nodes are all this machine (real processes, no test hosts)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TASK
from launcher.errors import OptionsError
from launcher.sources.joined import JoinedSource, joined_spec, parse_endpoint, read_token
from launcher.transports.joined import Member

TOKEN = "0123456789abcdef0123"


@pytest.mark.unit
@pytest.mark.parametrize("text, expected", [("10.0.0.1:29455", ("10.0.0.1", 29455)), ("[::1]:80", ("::1", 80)),
                                            ("node-0.svc:1", ("node-0.svc", 1))])
def test_endpoints(text, expected):
    assert parse_endpoint(text) == expected


@pytest.mark.unit
@pytest.mark.parametrize("text", ["10.0.0.1", "10.0.0.1:0", ":80", "host:99999", "host:x"])
def test_a_bad_endpoint_is_one_line(text):
    with pytest.raises(OptionsError, match="--rdzv-endpoint: expected HOST:PORT"):
        parse_endpoint(text)


@pytest.mark.unit
def test_the_token_comes_from_the_file_or_the_variable_and_is_refused_without_one(tmp_path):
    with pytest.raises(OptionsError, match="needs a token every node has: set TFLAUNCH_RDZV_TOKEN"):
        read_token(None, "10.0.0.1", {})
    assert read_token(None, "10.0.0.1", {"TFLAUNCH_RDZV_TOKEN": TOKEN}) == TOKEN
    path = tmp_path / "token"
    path.write_text("f" * 32 + "\n")
    assert read_token(str(path), "10.0.0.1", {"TFLAUNCH_RDZV_TOKEN": TOKEN}) == "f" * 32  # the file wins
    assert read_token(None, "127.0.0.1", {})  # every node is this machine: this user's own
    with pytest.raises(OptionsError, match="at least 16 printable"):
        read_token(None, "10.0.0.1", {"TFLAUNCH_RDZV_TOKEN": "short"})
    with pytest.raises(OptionsError, match="cannot read"):
        read_token(str(tmp_path / "missing"), "10.0.0.1", {})


class Gathered:
    """The members a rendezvous yielded, in the order they arrived."""

    def __init__(self, members):
        self.members = members

    def gather(self):
        return sorted(self.members, key=lambda m: m.rank)


@pytest.mark.unit
def test_the_cluster_follows_node_rank_not_arrival_and_carves_roles_like_H():
    source = JoinedSource(nnodes=3, host="10.0.0.1", port=29455, token=TOKEN, tasks_per_node=2, chief=True)
    arrived = Gathered([Member(2, "10.0.0.9"), Member(1, "10.0.0.4")])
    spec = joined_spec(source, arrived, frozenset({"10.0.0.1"}))
    assert [(t.role, t.index, t.host, t.tf_address.rsplit(":", 1)[0]) for t in spec.tasks] == [
        ("chief", 0, "10.0.0.1", "10.0.0.1"), ("worker", 0, "10.0.0.1", "10.0.0.1"),
        ("worker", 1, "rank-1", "10.0.0.4"), ("worker", 2, "rank-1", "10.0.0.4"),
        ("worker", 3, "rank-2", "10.0.0.9"), ("worker", 4, "rank-2", "10.0.0.9")]
    assert spec.transport == "joined"
    assert source.label == "--nnodes 3 --node-rank 0 --rdzv-endpoint 10.0.0.1:29455 --tasks-per-node 2 --chief"


@pytest.fixture
def unused_tcp_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def tflaunch(*args: str, env: dict | None = None, cwd: Path | None = None, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "launcher", *args], env={**os.environ, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd, **popen)


def test_without_a_token_a_rendezvous_across_machines_is_refused_in_one_line():
    env = {k: v for k, v in os.environ.items() if k != "TFLAUNCH_RDZV_TOKEN"}
    done = subprocess.run([sys.executable, "-m", "launcher", "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint",
                           "10.255.0.1:29455", "--", "true"], env=env, capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == ["tflaunch: error: --rdzv-endpoint 10.255.0.1: a rendezvous across "
                                                "machines needs a token every node has: set TFLAUNCH_RDZV_TOKEN or "
                                                "give --rdzv-token-file FILE (at least 16 characters)"]


@pytest.mark.slow
def test_three_nodes_of_this_machine_run_and_each_exits_with_the_runs_code(tmp_path, unused_tcp_port):
    endpoint = f"127.0.0.1:{unused_tcp_port}"
    common = ("--nnodes", "3", "--rdzv-endpoint", endpoint, "--rdzv-timeout", "30")
    nodes = [tflaunch(*common, "--node-rank", str(rank), "--", "true", cwd=tmp_path) for rank in (2, 1)]
    owner = tflaunch(*common, "--log-dir", str(tmp_path / "logs"), "--", "python", TASK, "print:up",
                     "exit-if:worker-1:3", cwd=tmp_path)
    out, _ = owner.communicate(timeout=90)
    assert owner.returncode == 3, out
    assert "worker-1 on rank-1 failed (exit code 3)" in out
    for node, rank in zip(nodes, (2, 1)):
        said, _ = node.communicate(timeout=30)
        assert node.returncode == 3, said
        assert said.splitlines()[-1] == f"tflaunch: node rank {rank}: the run ended with exit code 3"


@pytest.mark.slow
def test_dry_run_on_rank_0_waits_for_the_nodes_and_shows_the_plan_of_those_found(tmp_path, unused_tcp_port):
    common = ("--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{unused_tcp_port}", "--rdzv-timeout", "30")
    node = tflaunch(*common, "--node-rank", "1", "--", "true", cwd=tmp_path)
    owner = tflaunch(*common, "--dry-run", "--", "python", TASK, cwd=tmp_path)
    out, _ = owner.communicate(timeout=60)
    assert owner.returncode == 0, out
    assert "rank-1" in out and "worker-1" in out, out
    said, _ = node.communicate(timeout=30)
    assert node.returncode == 0, said
    assert not list(tmp_path.glob("logs/*/run.json"))  # nothing ran


def test_a_node_whose_owner_never_comes_says_so_and_exits_2(unused_tcp_port):
    node = tflaunch("--nodes-from", "skypilot", "--rdzv-endpoint", f":{unused_tcp_port}", "--rdzv-timeout", "1",
                    "--", "true", env={"SKYPILOT_NODE_RANK": "1", "SKYPILOT_NUM_NODES": "2",
                                       "SKYPILOT_NODE_IPS": "127.0.0.1\n127.0.0.2"})
    out, _ = node.communicate(timeout=30)
    assert node.returncode == 2, out
    lines = out.strip().splitlines()
    assert lines[0] == f"tflaunch: --nodes-from skypilot: skypilot, node rank 1 of 2, rank 0 at 127.0.0.1:{unused_tcp_port}"
    assert lines[-1] == f"tflaunch: node rank 1: no owner at 127.0.0.1:{unused_tcp_port} proved itself within " \
                        "--rdzv-timeout 1 s"


@pytest.mark.unit
def test_nnodes_min_max_starts_with_the_nodes_that_came_and_floors_at_min():
    source = JoinedSource(nnodes=4, minimum=2, host="10.0.0.1", port=29455, token=TOKEN, tasks_per_node=2)
    spec = joined_spec(source, Gathered([Member(2, "10.0.0.9")]), frozenset({"10.0.0.1"}))
    assert [t.host for t in spec.tasks] == ["10.0.0.1", "10.0.0.1", "rank-2", "rank-2"]
    assert spec.min_workers == 4  # two nodes of two slots
    assert source.label.startswith("--nnodes 2:4 ")


@pytest.mark.unit
def test_a_rendezvous_short_of_min_names_the_missing_ranks():
    from launcher.transports.joined import Rendezvous, RendezvousMissing

    rendezvous = Rendezvous(4, TOKEN, "127.0.0.1", 0, within=0.2, minimum=3)
    with pytest.raises(RendezvousMissing, match=r"node ranks 1, 2, 3 did not join within --rdzv-timeout 0.2 s "
                                                r"\(the run needs at least 3 nodes\)"):
        rendezvous.gather()


@pytest.mark.parametrize("value", ["0", "3:2", "x", "2:"])
def test_a_bad_nnodes_is_one_line(value):
    done = subprocess.run([sys.executable, "-m", "launcher", "--nnodes", value, "--rdzv-endpoint", "127.0.0.1:1",
                           "--", "true"], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == \
        f"tflaunch: error: --nnodes: expected N or MIN:MAX (whole numbers, 1 <= MIN <= MAX), got {value!r}"
