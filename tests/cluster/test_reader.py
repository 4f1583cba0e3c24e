"""Cluster files and --local options to ClusterSpec: every key parsed, every mistake named precisely."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from launcher.cluster.local import local_cluster
from launcher.cluster.reader import (
    AUTO,
    ClusterSpec,
    HostSettings,
    SshSettings,
    TaskSpec,
    load_cluster_file,
    parse_cluster,
    TASK_KEYS,
    parse_host_port,
)
from launcher.cluster.spec import is_local
from launcher.cluster.checks import missing_gpus_warning
from launcher.errors import ConfigError, LaunchError

pytestmark = pytest.mark.unit

LOCAL = frozenset({"localhost"})
SOURCE = "c.yaml"
CLUSTERS = Path(__file__).resolve().parents[2] / "clusters"


def parse(text: str, local_hosts: frozenset[str] = LOCAL) -> ClusterSpec:
    return parse_cluster(textwrap.dedent(text), SOURCE, local_hosts)


def error(text: str, local_hosts: frozenset[str] = LOCAL) -> str:
    with pytest.raises(ConfigError) as info:
        parse(text, local_hosts)
    return str(info.value)


def names(spec: ClusterSpec) -> list[str]:
    return [t.name for t in spec.tasks]


# ---------------------------------------------------------------------------------------------
# Every documented key


FULL = """
    command: python train.py --epochs 3 --name "two words"
    env:
      INT: 1
      FLOAT: 0.5
      B_TRUE: true
      B_FALSE: false
      TEXT: some text
    log_dir: logs/runs
    share_gpus: false
    threads: 4
    workdir: /srv/work
    python: /opt/py/bin/python
    setup: source /opt/env/bin/activate
    max_restarts: 2
    restart_delay: 0.5
    ssh:
      user: alice
      port: 2200
      identity_file: ~/.ssh/id_ed25519
      options: ["-o", "StrictHostKeyChecking=no"]
      connect_timeout: 5
      keepalive_timeout: 30
    hosts:
      node1:
        ssh: {user: bob, port: 22, options: -o ProxyJump=bastion}
        workdir: /home/bob/work
        python: /usr/bin/python3
        setup: module load cuda
        env: {NODE: 1}
      node2:
    chief:
      - host: node1
        port: 2222
        gpus: [0, 1]
    worker:
      - node2:2222
      - host: node1
        port: 2223
        address: 10.0.0.1
        gpus: 2
        env: {W: x, N: 7}
        workdir: /tmp/w
        python: python3.11
        setup: echo hi
    ps:
      - node3:2222
    evaluator:
      host: localhost
      port: auto
      gpus: all
"""


def test_full_file_every_cluster_key():
    spec = parse(FULL)
    assert spec.source == SOURCE
    assert spec.command == ("python", "train.py", "--epochs", "3", "--name", "two words")
    assert spec.env == {"INT": "1", "FLOAT": "0.5", "B_TRUE": "true", "B_FALSE": "false", "TEXT": "some text"}
    assert spec.log_dir == "logs/runs"
    assert spec.share_gpus is False
    assert spec.threads == 4
    assert spec.workdir == "/srv/work"
    assert spec.python == "/opt/py/bin/python"
    assert spec.setup == "source /opt/env/bin/activate"
    assert spec.max_restarts == 2
    assert spec.restart_delay == 0.5
    assert spec.ssh == SshSettings(user="alice", port=2200, identity_file="~/.ssh/id_ed25519",
                                   options=("-o", "StrictHostKeyChecking=no"), connect_timeout=5.0,
                                   keepalive_timeout=30.0)
    assert spec.hosts == {
        "node1": HostSettings(ssh=SshSettings(user="bob", port=22, options=("-o", "ProxyJump=bastion")),
                              workdir="/home/bob/work", python="/usr/bin/python3", setup="module load cuda",
                              env={"NODE": "1"}),
        "node2": HostSettings(),
    }


def test_full_file_every_task_key():
    spec = parse(FULL)
    assert names(spec) == ["chief-0", "worker-0", "worker-1", "ps-0", "evaluator-0"]
    chief, w0, w1, ps, ev = spec.tasks
    assert chief == TaskSpec("chief", 0, "node1", 2222, gpus=(0, 1), key="chief[0]")
    assert w0 == TaskSpec("worker", 0, "node2", 2222, key="worker[0]")
    assert w1 == TaskSpec("worker", 1, "node1", 2223, address="10.0.0.1", gpus=(2,), env={"W": "x", "N": "7"},
                          workdir="/tmp/w", python="python3.11", setup="echo hi", key="worker[1]")
    assert ps == TaskSpec("ps", 0, "node3", 2222, key="ps[0]")
    assert ev == TaskSpec("evaluator", 0, "localhost", AUTO, gpus=None, key="evaluator[0]")
    assert spec.has_ps
    assert spec.role_tasks("worker") == (w0, w1)


def test_defaults_of_a_minimal_file():
    spec = parse("worker: [localhost:2222]")
    assert spec == ClusterSpec(source=SOURCE, tasks=(TaskSpec("worker", 0, "localhost", 2222, key="worker[0]"),))
    assert spec.command is None and spec.threads == AUTO and spec.max_restarts == 0 and spec.restart_delay == 1.0
    assert spec.tasks[0].gpus == ()  # CPU only unless GPUs are named
    assert not spec.has_ps


def test_roles_are_ordered_chief_worker_ps_evaluator_whatever_the_file_order():
    spec = parse("""
        evaluator: [localhost:2225]
        ps: [localhost:2224]
        worker: [localhost:2222, localhost:2223]
        chief: [localhost:2221]
    """)
    assert names(spec) == ["chief-0", "worker-0", "worker-1", "ps-0", "evaluator-0"]


def test_top_level_list_is_a_list_of_workers():
    spec = parse("""
        - localhost:2222
        - node1:2223
    """)
    assert [(t.role, t.index, t.host, t.port) for t in spec.tasks] == [
        ("worker", 0, "localhost", 2222), ("worker", 1, "node1", 2223)]


@pytest.mark.parametrize("text", [
    "worker: {host: localhost, port: 2222}",
    "worker: localhost:2222",
    "worker:\n  host: localhost\n  port: 2222\n",
])
def test_single_task_without_a_list(text):
    spec = parse(text)
    assert spec.tasks == (TaskSpec("worker", 0, "localhost", 2222, key="worker[0]"),)


@pytest.mark.parametrize("item, host, port", [
    ("localhost:2222", "localhost", 2222),
    ("localhost:auto", "localhost", AUTO),
    ("10.1.2.3:65535", "10.1.2.3", 65535),
    ("'[::1]:2222'", "::1", 2222),
    ("'[fe80::2]:1'", "fe80::2", 1),
    ("{host: '[::1]', port: 2222}", "::1", 2222),
    ("{host: '::1', port: 2222}", "::1", 2222),
    ("{host: localhost, port: '2222'}", "localhost", 2222),
    ("{host: 'localhost:2222'}", "localhost", 2222),
])
def test_host_and_port_forms(item, host, port):
    task = parse(f"worker: [{item}]").tasks[0]
    assert (task.host, task.port) == (host, port)


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "127.0.1.1", "::1", "myhost"])
def test_auto_port_on_every_name_of_this_machine(host):
    spec = parse(f"worker: [{{host: '{host}', port: auto}}]", frozenset({"localhost", "myhost"}))
    assert spec.tasks[0].port == AUTO


@pytest.mark.parametrize("gpus, expected", [
    ("all", None), ("[]", ()), ("null", ()), ("3", (3,)), ("[0, 1]", (0, 1)), ("[2, 0]", (2, 0)),
])
def test_gpus_forms(gpus, expected):
    assert parse(f"worker: [{{host: localhost, port: 2222, gpus: {gpus}}}]").tasks[0].gpus == expected


@pytest.mark.parametrize("value, expected", [
    ("1", "1"), ("-3", "-3"), ("0.25", "0.25"), ("true", "true"), ("false", "false"),
    ("'007'", "007"), ("''", ""), ("a b c", "a b c"), ("'true'", "true"),
])
def test_env_values_become_strings(value, expected):
    spec = parse(f"env: {{V: {value}}}\nworker: [localhost:2222]")
    assert spec.env == {"V": expected}


def test_env_number_keeps_its_written_form():
    assert parse("env: {LIB_VERSION: 2.10}\nworker: [localhost:2222]").env == {"LIB_VERSION": "2.10"}


@pytest.mark.parametrize("command, argv", [
    ("python -m trainer", ("python", "-m", "trainer")),
    ("python -c 'print(\"a b\")'", ("python", "-c", 'print("a b")')),
    ("[python, train.py, --lr, 0.1, --steps, 5]", ("python", "train.py", "--lr", "0.1", "--steps", "5")),
    ("[./run.sh]", ("./run.sh",)),
])
def test_command_as_string_and_as_list(command, argv):
    assert parse(f"command: {command}\nworker: [localhost:2222]").command == argv


@pytest.mark.parametrize("threads, expected", [("auto", AUTO), ("'off'", "off"), ("1", 1), ("16", 16)])
def test_threads(threads, expected):
    assert parse(f"threads: {threads}\nworker: [localhost:2222]").threads == expected


def test_threads_off_unquoted():
    assert parse("threads: off\nworker: [localhost:2222]").threads == "off"


def test_ssh_options_as_a_string_are_split():
    spec = parse("ssh: {options: \"-o 'ProxyCommand=ssh -W %h:%p gw' -v\"}\nworker: [localhost:2222]")
    assert spec.ssh.options == ("-o", "ProxyCommand=ssh -W %h:%p gw", "-v")


def test_restart_settings_accept_zero():
    spec = parse("max_restarts: 0\nrestart_delay: 0\nworker: [localhost:2222]")
    assert (spec.max_restarts, spec.restart_delay) == (0, 0.0)


def test_share_gpus_allows_the_same_gpu_on_one_host():
    spec = parse("""
        share_gpus: true
        worker:
          - {host: localhost, port: 2222, gpus: [0]}
          - {host: localhost, port: 2223, gpus: [0, 1]}
          - {host: localhost, port: 2224, gpus: all}
    """)
    assert spec.share_gpus is True
    assert [t.gpus for t in spec.tasks] == [(0,), (0, 1), None]


def test_same_gpu_index_on_two_hosts_is_fine():
    spec = parse("""
        worker:
          - {host: node1, port: 2222, gpus: [0]}
          - {host: node2, port: 2222, gpus: [0]}
          - {host: localhost, port: 2222, gpus: all}
          - {host: node3, port: 2222, gpus: all}
    """)
    assert len(spec.tasks) == 4


def test_cpu_only_tasks_never_clash_with_gpu_tasks():
    parse("""
        worker:
          - {host: localhost, port: 2222, gpus: all}
          - {host: localhost, port: 2223, gpus: []}
          - {host: localhost, port: 2224}
    """)


def test_same_port_on_different_hosts_is_fine():
    spec = parse("worker: [node1:2222, node2:2222, localhost:2222]")
    assert [t.port for t in spec.tasks] == [2222, 2222, 2222]


def test_many_auto_ports_on_this_machine_do_not_clash():
    spec = parse("worker: [localhost:auto, localhost:auto, 127.0.0.1:auto]")
    assert [t.port for t in spec.tasks] == [AUTO] * 3


def test_chief_alone_is_a_cluster():
    assert names(parse("chief: [localhost:2222]")) == ["chief-0"]


# ---------------------------------------------------------------------------------------------
# Validation errors: file, key path, bad value, expectation


def expect_error(text: str, key: str, *fragments: str, local_hosts: frozenset[str] = LOCAL) -> str:
    message = error(text, local_hosts)
    assert message.startswith(f"{SOURCE}: {key}: "), message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


@pytest.mark.parametrize("text, key, hint", [
    ("wroker: [localhost:2222]\nworker: [localhost:2223]", "wroker", "did you mean 'worker'?"),
    ("comand: x\nworker: [localhost:2222]", "comand", "did you mean 'command'?"),
    ("treads: 2\nworker: [localhost:2222]", "treads", "did you mean 'threads'?"),
    ("worker: [{host: localhost, prot: 2222}]", "worker[0].prot", "did you mean 'port'?"),
    ("worker: [localhost:2222, {host: localhost, port: 2223, gpu: [0]}]", "worker[1].gpu", "did you mean 'gpus'?"),
    ("ssh: {usr: me}\nworker: [localhost:2222]", "ssh.usr", "did you mean 'user'?"),
    ("ssh: {identityfile: k}\nworker: [localhost:2222]", "ssh.identityfile", "did you mean 'identity_file'?"),
    ("hosts: {node1: {ssh: {prot: 22}}}\nworker: [localhost:2222]", "hosts.node1.ssh.prot", "did you mean 'port'?"),
    ("hosts: {node1: {wrkdir: /x}}\nworker: [localhost:2222]", "hosts.node1.wrkdir", "did you mean 'workdir'?"),
])
def test_unknown_key_with_suggestion(text, key, hint):
    expect_error(text, key, f"unknown key; {hint}")


def test_unknown_key_without_close_match_lists_the_known_keys():
    message = expect_error("zzzzzz: 1\nworker: [localhost:2222]", "zzzzzz", "unknown key; expected one of ")
    assert "command" in message and "worker" in message and "max_restarts" in message


@pytest.mark.parametrize("text", [
    "env: {A: 1}",
    "worker: []",
    "ps: [localhost:2222]\nevaluator: [localhost:2223]",
    "evaluator: [localhost:2223]",
])
def test_missing_workers(text):
    expect_error(text, "worker", "missing; expected at least one 'worker'")


def test_two_chiefs():
    expect_error("chief: [localhost:2222, localhost:2223]\nworker: [localhost:2224]",
                 "chief", "expected at most one chief, got 2")


def test_ps_without_chief():
    expect_error("worker: [localhost:2222]\nps: [localhost:2223]",
                 "chief", "missing; a cluster with 'ps' tasks needs a chief")


def test_two_evaluators():
    expect_error("worker: [localhost:2222]\nevaluator: [localhost:2223, localhost:2224]",
                 "evaluator", "expected at most one evaluator, got 2")


@pytest.mark.parametrize("text, key, clash", [
    ("worker: [node1:2222, node1:2222]", "worker[1].port", "node1:2222 is also used by worker[0]"),
    ("worker: [localhost:2222, localhost:2223, localhost:2222]", "worker[2].port",
     "localhost:2222 is also used by worker[0]"),
    ("chief: [localhost:2222]\nworker: [localhost:2222]", "worker[0].port", "localhost:2222 is also used by chief[0]"),
    ("worker: [localhost:2222, 127.0.0.1:2222]", "worker[1].port", "127.0.0.1:2222 is also used by worker[0]"),
    ("worker: [127.0.0.1:2222, {host: '::1', port: 2222}]", "worker[1].port", "::1:2222 is also used by worker[0]"),
    ("worker: [localhost:2222, myhost:2222]", "worker[1].port", "myhost:2222 is also used by worker[0]"),
    ("worker: [localhost:2222, {host: localhost, port: '2222'}]", "worker[1].port",
     "localhost:2222 is also used by worker[0]"),
])
def test_duplicate_host_port(text, key, clash):
    expect_error(text, key, clash, "expected a distinct host:port", local_hosts=frozenset({"localhost", "myhost"}))


def test_a_remote_name_is_not_this_machine():
    # "myhost" is only this machine when the caller says so.
    assert len(parse("worker: [localhost:2222, myhost:2222]").tasks) == 2


@pytest.mark.parametrize("port, expected", [
    ("0", "expected a port 1-65535, got 0"),
    ("70000", "expected a port 1-65535, got 70000"),
    ("65536", "expected a port 1-65535, got 65536"),
    ("-1", "expected a port 1-65535, got -1"),
    ("abc", "expected a port 1-65535 or 'auto', got 'abc'"),
    ("true", "expected a port 1-65535 or 'auto', got true"),
    ("2222.5", "expected a port 1-65535 or 'auto', got 2222.5"),
    ("[2222]", "expected a port 1-65535 or 'auto', got a list"),
    ("AUTO", "expected a port 1-65535 or 'auto', got 'AUTO'"),
])
def test_bad_port(port, expected):
    message = error(f"worker: [localhost:2222, {{host: localhost, port: {port}}}]")
    assert message == f"{SOURCE}: worker[1].port: {expected}"


@pytest.mark.parametrize("item, bad", [
    ("localhost:0", "got 0"), ("localhost:70000", "got 70000"), ("localhost:abc", "got 'abc'"),
    ("'localhost:'", "got ''"), ("'[::1]:x'", "got 'x'"),
])
def test_bad_port_in_short_form(item, bad):
    expect_error(f"worker: [{item}]", "worker[0].port", bad, "1-65535")


@pytest.mark.parametrize("item, host", [
    ("localhost", "localhost"), ("{host: node1}", "node1"), ("'[::1]'", "::1"), ("{host: node1, port: null}", "node1"),
])
def test_a_task_without_a_port_takes_auto(item, host):
    assert [(t.host, t.port) for t in parse(f"worker: [{item}]").tasks] == [(host, AUTO)]


def test_a_host_with_an_empty_name_before_its_port():
    expect_error("worker: [':2222']", "worker[0].host", "expected HOST or HOST:PORT, got ':2222'")


def test_port_given_twice():
    expect_error("worker: [{host: 'localhost:2222', port: 2223}]", "worker[0].host",
                 "'localhost:2222' has a port and 'port' is also set")


@pytest.mark.parametrize("task, key, shown", [
    ("{port: 2222}", "worker[0].host", "missing; expected the task's host name"),
    ("{host: '', port: 2222}", "worker[0].host", "expected a non-empty string, got ''"),
    ("{host: [a], port: 2222}", "worker[0].host", "expected a non-empty string, got a list"),
    ("{host: true, port: 2222}", "worker[0].host", "expected a non-empty string, got true"),
    ("{host: localhost, port: 2222, address: {}}", "worker[0].address", "expected a non-empty string, got a mapping"),
    ("{host: localhost, port: 2222, workdir: ''}", "worker[0].workdir", "expected a non-empty string, got ''"),
])
def test_bad_task_strings(task, key, shown):
    expect_error(f"worker: [{task}]", key, shown)


def test_auto_port_on_a_remote_host_is_left_for_its_agent_to_pick():
    spec = parse("worker: [localhost:auto, node2:auto, node2:auto]")
    assert [(t.host, t.port) for t in spec.tasks] == [("localhost", "auto"), ("node2", "auto"), ("node2", "auto")]


@pytest.mark.parametrize("gpus, key, expected", [
    ("[0, -1]", "worker[0].gpus[1]", "expected a GPU index >= 0, got -1"),
    ("-2", "worker[0].gpus[0]", "expected a GPU index >= 0, got -2"),
    ("[0, 1, 0]", "worker[0].gpus[2]", "GPU 0 is listed twice; expected distinct indices"),
    ("[x]", "worker[0].gpus[0]", "expected a GPU index (integer >= 0), got 'x'"),
    ("[true]", "worker[0].gpus[0]", "expected a GPU index (integer >= 0), got true"),
    ("[1.5]", "worker[0].gpus[0]", "expected a GPU index (integer >= 0), got 1.5"),
    ("'0,1'", "worker[0].gpus", "expected a list of GPU indices or 'all', got '0,1'"),
    ("ALL", "worker[0].gpus", "expected a list of GPU indices or 'all', got 'ALL'"),
    ("{a: 1}", "worker[0].gpus", "expected a list of GPU indices or 'all', got a mapping"),
])
def test_bad_gpu_list(gpus, key, expected):
    assert error(f"worker: [{{host: localhost, port: 2222, gpus: {gpus}}}]") == f"{SOURCE}: {key}: {expected}"


@pytest.mark.parametrize("first, second, host2, label", [
    ("[0]", "[0]", "localhost", "GPU 0 on localhost"),
    ("[0, 1]", "[2, 1]", "localhost", "GPU 1 on localhost"),
    ("[0]", "all", "localhost", "all GPUs on localhost"),
    ("all", "[0]", "localhost", "GPU 0 on localhost"),
    ("all", "all", "localhost", "all GPUs on localhost"),
    ("[3]", "[3]", "127.0.0.1", "GPU 3 on 127.0.0.1"),
])
def test_two_tasks_claiming_one_gpu(first, second, host2, label):
    text = f"""
        worker:
          - {{host: localhost, port: 2222, gpus: {first}}}
          - {{host: {host2}, port: 2223, gpus: {second}}}
    """
    expect_error(text, "worker[1].gpus",
                 f"{label} is also claimed by worker[0]; expected distinct GPUs per host or 'share_gpus: true'")


def test_gpu_clash_between_roles_on_a_remote_host():
    expect_error("chief: [{host: node1, port: 1, gpus: [0]}]\nworker: [{host: node1, port: 2, gpus: [0]}]",
                 "worker[0].gpus", "GPU 0 on node1 is also claimed by chief[0]")


@pytest.mark.parametrize("text, key, expected", [
    ("5", "top level", "expected a mapping of cluster keys or a list of host:port workers, got 5"),
    ("just text", "top level", "expected a mapping of cluster keys or a list of host:port workers, got 'just text'"),
    ("worker: 5", "worker", "expected a list of tasks, got 5"),
    ("worker:", "worker", "expected a list of tasks, got null"),
    ("worker: [5]", "worker[0]", "expected a task mapping or a 'host:port' string, got 5"),
    ("worker: [[localhost, 2222]]", "worker[0]", "expected a task mapping or a 'host:port' string, got a list"),
    ("env: [A=1]\nworker: [localhost:2222]", "env", "expected a mapping of environment variables, got a list"),
    ("env: A=1\nworker: [localhost:2222]", "env", "expected a mapping of environment variables, got 'A=1'"),
    ("env: {A: {b: 1}}\nworker: [localhost:2222]", "env.A", "expected a string or number, got a mapping"),
    ("env: {A: [1]}\nworker: [localhost:2222]", "env.A", "expected a string or number, got a list"),
    ("env: {1A: x}\nworker: [localhost:2222]", "env", "expected environment variable names, got '1A'"),
    ("env: {A-B: x}\nworker: [localhost:2222]", "env", "expected environment variable names, got 'A-B'"),
    ("env: {1: x}\nworker: [localhost:2222]", "env", "expected environment variable names, got 1"),
    ("worker: [{host: localhost, port: 2222, env: [A]}]", "worker[0].env",
     "expected a mapping of environment variables, got a list"),
    ("worker: [{host: localhost, port: 2222, env: {A: {}}}]", "worker[0].env.A",
     "expected a string or number, got a mapping"),
    ("command: {}\nworker: [localhost:2222]", "command", "expected a command string or a list of arguments, got a mapping"),
    ("command: 5\nworker: [localhost:2222]", "command", "expected a command string or a list of arguments, got 5"),
    ("command:\nworker: [localhost:2222]", "command", "expected a command string or a list of arguments, got null"),
    ("command: [python, true]\nworker: [localhost:2222]", "command[1]",
     "expected an argument (a string or a number), got true"),
    ("command: [python, [a]]\nworker: [localhost:2222]", "command[1]",
     "expected an argument (a string or a number), got a list"),
    ("command: {python: x}\nworker: [localhost:2222]", "command",
     "expected a command string or a list of arguments, got a mapping"),
    ("command: ''\nworker: [localhost:2222]", "command", "expected a command, got an empty one"),
    ("command: '   '\nworker: [localhost:2222]", "command", "expected a command, got an empty one"),
    ("command: []\nworker: [localhost:2222]", "command", "expected a command, got an empty one"),
    ("command: python -c \"print(1)\nworker: [localhost:2222]", "command",
     "cannot split 'python -c \"print(1)' into arguments (No closing quotation)"),
    ("command: \"python -c 'x\"\nworker: [localhost:2222]", "command",
     "cannot split \"python -c 'x\" into arguments (No closing quotation)"),
    ("share_gpus: 1\nworker: [localhost:2222]", "share_gpus", "expected true or false, got 1"),
    ("share_gpus: 'yes please'\nworker: [localhost:2222]", "share_gpus", "expected true or false, got 'yes please'"),
    ("threads: 0\nworker: [localhost:2222]", "threads", "expected 'auto', 'off' or a thread count >= 1, got 0"),
    ("threads: -2\nworker: [localhost:2222]", "threads", "expected 'auto', 'off' or a thread count >= 1, got -2"),
    ("threads: many\nworker: [localhost:2222]", "threads",
     "expected 'auto', 'off' or a thread count >= 1, got 'many'"),
    ("threads: 2.5\nworker: [localhost:2222]", "threads", "expected 'auto', 'off' or a thread count >= 1, got 2.5"),
    ("max_restarts: -1\nworker: [localhost:2222]", "max_restarts", "expected an integer >= 0, got -1"),
    ("max_restarts: 1.5\nworker: [localhost:2222]", "max_restarts", "expected an integer >= 0, got 1.5"),
    ("max_restarts: true\nworker: [localhost:2222]", "max_restarts", "expected an integer >= 0, got true"),
    ("restart_delay: -1\nworker: [localhost:2222]", "restart_delay", "expected a number of seconds >= 0, got -1"),
    ("restart_delay: soon\nworker: [localhost:2222]", "restart_delay",
     "expected a number of seconds >= 0, got 'soon'"),
    ("log_dir: false\nworker: [localhost:2222]", "log_dir", "expected a non-empty string, got false"),
    ("workdir: ''\nworker: [localhost:2222]", "workdir", "expected a non-empty string, got ''"),
    ("python: [python3]\nworker: [localhost:2222]", "python", "expected a non-empty string, got a list"),
    ("setup: {}\nworker: [localhost:2222]", "setup", "expected a non-empty string, got a mapping"),
    ("ssh: [user]\nworker: [localhost:2222]", "ssh", "expected a mapping of ssh settings, got a list"),
    ("ssh: {port: 70000}\nworker: [localhost:2222]", "ssh.port", "expected a port 1-65535, got 70000"),
    ("ssh: {port: x}\nworker: [localhost:2222]", "ssh.port", "expected a port 1-65535 or 'auto', got 'x'"),
    ("ssh: {user: ''}\nworker: [localhost:2222]", "ssh.user", "expected a non-empty string, got ''"),
    ("ssh: {options: 5}\nworker: [localhost:2222]", "ssh.options", "expected a list of ssh arguments, got 5"),
    ("ssh: {options: [-v, 2]}\nworker: [localhost:2222]", "ssh.options", "expected a list of ssh arguments, got a list"),
    ("ssh: {options: \"-o 'x\"}\nworker: [localhost:2222]", "ssh.options", "cannot split \"-o 'x\" (No closing quotation)"),
    ("ssh: {connect_timeout: 0}\nworker: [localhost:2222]", "ssh.connect_timeout",
     "expected a number of seconds > 0, got 0"),
    ("ssh: {keepalive_timeout: -5}\nworker: [localhost:2222]", "ssh.keepalive_timeout",
     "expected a number of seconds > 0, got -5"),
    ("hosts: [node1]\nworker: [localhost:2222]", "hosts", "expected a mapping of host name to host settings, got a list"),
    ("hosts: {node1: 5}\nworker: [localhost:2222]", "hosts.node1", "expected a mapping of host settings, got 5"),
    ("hosts: {node1: {env: [A]}}\nworker: [localhost:2222]", "hosts.node1.env",
     "expected a mapping of environment variables, got a list"),
    ("hosts: {node1: {ssh: {port: 0}}}\nworker: [localhost:2222]", "hosts.node1.ssh.port",
     "expected a port 1-65535, got 0"),
    ("hosts: {node1: {python: ''}}\nworker: [localhost:2222]", "hosts.node1.python",
     "expected a non-empty string, got ''"),
])
def test_wrong_types(text, key, expected):
    assert error(text) == f"{SOURCE}: {key}: {expected}"


def test_long_bad_values_are_shortened():
    message = error(f"worker: [{{host: localhost, port: '{'9' * 100}x'}}]")
    assert message.endswith("...") and len(message) < 160


def test_auto_ssh_port_is_a_config_error():
    expect_error("ssh: {port: auto}\nworker: [localhost:2222]", "ssh.port", "'auto'", "1-65535")


@pytest.mark.parametrize("where, key", [
    ("env: {%s: x}\nworker: [localhost:2222]", "env"),
    ("worker: [{host: localhost, port: 2222, env: {%s: x}}]", "worker[0].env"),
    ("hosts: {node1: {env: {%s: x}}}\nworker: [localhost:2222]", "hosts.node1.env"),
])
@pytest.mark.parametrize("name", ["TF_CONFIG", "TFLAUNCH_TASK", "TFLAUNCH_RUN_ID", "TFLAUNCH_RUN_DIR",
                                  "TFLAUNCH_ATTEMPT"])
def test_reserved_env(where, key, name):
    assert error(where % name) == (
        f"{SOURCE}: {key}.{name}: is set by tflaunch for every task and cannot be overridden")


def test_reserved_cuda_visible_devices_hints_at_gpus():
    assert error("env: {CUDA_VISIBLE_DEVICES: '0'}\nworker: [localhost:2222]") == (
        f"{SOURCE}: env.CUDA_VISIBLE_DEVICES: is set by tflaunch for every task and cannot be overridden (use 'gpus')")


@pytest.mark.parametrize("text, line", [
    ("worker:\n  - localhost:2222\n  bad: [\n", 3),
    ("worker: [localhost:2222\n", 2),
    ("env:\n  A: 1\n B: 2\nworker: [localhost:2222]\n", 3),
    ("worker:\n\t- localhost:2222\n", 2),
    ("command: 'unclosed\n", 2),
])
def test_invalid_yaml_names_the_line(text, line):
    with pytest.raises(ConfigError) as info:
        parse_cluster(text, SOURCE, LOCAL)
    assert str(info.value).startswith(f"{SOURCE}: line {line}: invalid YAML: "), str(info.value)
    assert info.value.key == f"line {line}"


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "---\n", "null"])
def test_empty_file(text):
    assert error(text) == f"{SOURCE}: the cluster file is empty; expected roles such as 'worker:'"


def test_config_error_is_a_launch_error_with_exit_code_2():
    with pytest.raises(ConfigError) as info:
        parse("worker: 5")
    assert isinstance(info.value, LaunchError) and info.value.exit_code == 2
    assert (info.value.source, info.value.key) == (SOURCE, "worker")


# ---------------------------------------------------------------------------------------------
# Files


def test_load_cluster_file(tmp_path):
    path = tmp_path / "two.yaml"
    path.write_text("worker: [localhost:auto, localhost:auto]\n")
    spec = load_cluster_file(path, LOCAL)
    assert spec.source == str(path)
    assert names(spec) == ["worker-0", "worker-1"]


def test_errors_name_the_file_path(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("worker: [localhost:70000]\n")
    with pytest.raises(ConfigError) as info:
        load_cluster_file(path, LOCAL)
    assert str(info.value) == f"{path}: worker[0].port: expected a port 1-65535, got 70000"


def test_missing_file(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        load_cluster_file(path, LOCAL)
    assert str(info.value) == f"{path}: no such cluster file"


def test_a_directory_is_not_a_cluster_file(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_cluster_file(tmp_path, LOCAL)
    assert str(info.value).startswith(f"{tmp_path}: cannot read cluster file (")


def test_a_binary_file_is_not_a_cluster_file(tmp_path):
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"\xff\xfe\x00worker")
    with pytest.raises(ConfigError) as info:
        load_cluster_file(path, LOCAL)
    assert str(info.value).startswith(f"{path}: cannot read cluster file (")


REAL_FILES = sorted(CLUSTERS.glob("*.yaml")) + sorted(CLUSTERS.glob("*.yml"))


@pytest.mark.parametrize("path", REAL_FILES or [pytest.param(None, marks=pytest.mark.skip(reason="no clusters/*.yaml"))],
                         ids=[p.name for p in REAL_FILES] or ["none"])
def test_repository_cluster_files_validate(path):
    spec = load_cluster_file(path, frozenset({"localhost"}), slurm_template=True)
    # A Slurm template (clusters/slurm.yaml) has no roles: they come from the allocation.
    assert (spec.tasks and (spec.role_tasks("worker") or spec.role_tasks("chief"))) or spec.slurm is not None


# ---------------------------------------------------------------------------------------------
# --local N


def test_local_workers():
    spec = local_cluster(3)
    assert spec.source == "--local 3"
    assert spec.tasks == tuple(TaskSpec("worker", i, "localhost", AUTO, gpus=(), key=f"worker[{i}]") for i in range(3))
    assert spec.share_gpus is False and spec.command is None and spec.threads == AUTO


def test_local_with_chief():
    spec = local_cluster(2, chief=True)
    assert names(spec) == ["chief-0", "worker-0", "worker-1"]
    assert spec.tasks[0].key == "chief[0]"


def test_local_ps_implies_chief():
    spec = local_cluster(2, ps=2)
    assert names(spec) == ["chief-0", "worker-0", "worker-1", "ps-0", "ps-1"]
    assert spec.has_ps and [t.key for t in spec.role_tasks("ps")] == ["ps[0]", "ps[1]"]


def test_local_gpus_one_each():
    spec = local_cluster(2, gpus=(0, 1))
    assert [t.gpus for t in spec.tasks] == [(0,), (1,)]
    assert spec.share_gpus is False


def test_local_gpus_round_robin_and_shared_when_fewer_gpus_than_tasks():
    spec = local_cluster(3, chief=True, ps=1, gpus=(2, 5))
    assert [(t.name, t.gpus) for t in spec.tasks] == [
        ("chief-0", (2,)), ("worker-0", (5,)), ("worker-1", (2,)), ("worker-2", (5,)), ("ps-0", ())]
    assert spec.share_gpus is True


def test_local_more_gpus_than_tasks():
    spec = local_cluster(1, gpus=(0, 1, 2))
    assert spec.tasks[0].gpus == (0,) and spec.share_gpus is False


def test_local_passes_command_log_dir_and_threads():
    spec = local_cluster(1, command=("python", "x.py"), log_dir="/tmp/l", threads=3)
    assert (spec.command, spec.log_dir, spec.threads) == (("python", "x.py"), "/tmp/l", 3)


@pytest.mark.parametrize("kwargs, expected", [
    ({"workers": 0}, "--local 0: --local: expected at least 1 worker, got 0"),
    ({"workers": -2}, "--local -2: --local: expected at least 1 worker, got -2"),
    ({"workers": 2, "ps": -1}, "--local 2: --ps: expected 0 or more ps tasks, got -1"),
    ({"workers": 2, "gpus": (0, 0)}, "--local 2: --gpus: expected distinct GPU indices >= 0, got 0,0"),
    ({"workers": 2, "gpus": (1, -1)}, "--local 2: --gpus: expected distinct GPU indices >= 0, got 1,-1"),
])
def test_local_bad_counts(kwargs, expected):
    with pytest.raises(ConfigError) as info:
        local_cluster(**kwargs)
    assert str(info.value) == expected


# ---------------------------------------------------------------------------------------------
# Small helpers


@pytest.mark.parametrize("value, parts", [
    ("localhost:2222", ("localhost", "2222")),
    ("[::1]:2222", ("::1", "2222")),
    ("fe80::1:2222", ("fe80::1", "2222")),
    ("node:auto", ("node", "auto")),
])
def test_parse_host_port(value, parts):
    assert parse_host_port(value) == parts


@pytest.mark.parametrize("value", ["localhost", ":2222", "[::1]", "[::1]2222", "[::1"])
def test_parse_host_port_rejects(value):
    with pytest.raises(ValueError):
        parse_host_port(value)


@pytest.mark.parametrize("host, local", [
    ("localhost", True), ("127.0.0.1", True), ("127.5.0.1", True), ("::1", True), ("myhost", True),
    ("node1", False), ("10.0.0.1", False), ("128.0.0.1", False),
])
def test_is_local(host, local):
    assert is_local(host, frozenset({"myhost"})) is local


@pytest.mark.parametrize("host, address, expected", [
    ("node1", None, "node1:2222"),
    ("node1", "10.0.0.5", "10.0.0.5:2222"),
    ("::1", None, "[::1]:2222"),
    ("node1", "fe80::7", "[fe80::7]:2222"),
    ("node1", "[fe80::7]", "[fe80::7]:2222"),
])
def test_tf_address(host, address, expected):
    assert TaskSpec("worker", 0, host, 2222, address=address).tf_address == expected


def test_with_ports_fills_only_named_tasks():
    spec = parse("worker: [localhost:auto, localhost:2223, localhost:auto]")
    filled = spec.with_ports({"worker-0": 40001, "worker-2": 40002})
    assert [t.port for t in filled.tasks] == [40001, 2223, 40002]
    assert [t.port for t in spec.tasks] == [AUTO, 2223, AUTO]  # the original is unchanged


def test_ssh_settings_overridden_by_takes_every_field_the_other_sets():
    base = SshSettings(user="a", port=22, identity_file="k1", options=("-4",), connect_timeout=5, keepalive_timeout=9)
    assert base.overridden_by(SshSettings()) == base
    other = SshSettings(user="b", port=2200, identity_file="k2", connect_timeout=1, keepalive_timeout=2)
    assert base.overridden_by(other) == SshSettings("b", 2200, "k2", ("-4",), 1, 2)
    assert SshSettings().overridden_by(base) == base


def test_host_ssh_options_win_over_cluster_options():
    cluster = SshSettings(options=("-o", "User=cluster"))
    host = SshSettings(options=("-o", "User=host"))
    merged = cluster.overridden_by(host).options
    # ssh(1) keeps the first value it sees for an option; the host's must come first to win.
    assert merged.index("User=host") < merged.index("User=cluster")


def test_repeated_key_is_refused_with_its_line():
    text = "worker:\n  - localhost:2222\nworker:\n  - localhost:2223\n"
    with pytest.raises(ConfigError) as caught:
        parse_cluster(text, "dup.yaml", frozenset({"localhost"}))
    assert str(caught.value) == "dup.yaml: line 3: key 'worker' appears twice; expected each key once"


def test_hosts_entry_without_tasks_suggests_the_close_host():
    text = "hosts:\n  nod1: {workdir: /w}\nworker:\n  - node1:2222\n"
    with pytest.raises(ConfigError) as caught:
        parse_cluster(text, "h.yaml", frozenset({"localhost"}))
    assert str(caught.value) == "h.yaml: hosts.nod1: no task runs on this host; did you mean 'node1'?"


def test_cuda_device_order_is_reserved():
    text = "env: {CUDA_DEVICE_ORDER: FASTEST_FIRST}\nworker:\n  - localhost:2222\n"
    with pytest.raises(ConfigError) as caught:
        parse_cluster(text, "c.yaml", frozenset({"localhost"}))
    assert "env.CUDA_DEVICE_ORDER" in str(caught.value) and "use 'gpus'" in str(caught.value)


def test_restart_policy_per_role_reaches_the_spec_and_defaults_follow_the_roles():
    from launcher.cluster.spec import RestartPolicy

    spec = parse_cluster("chief: [localhost:2222]\nworker: [localhost:2223]\nps: [localhost:2224]\n"
                         "restart_policy: {worker: cluster, evaluator: task}\ntask_restarts: 5", "x.yaml", LOCAL)
    assert spec.restart_policy["worker"] is RestartPolicy.CLUSTER  # the file overrides the ps-cluster default
    assert spec.restart_policy["evaluator"] is RestartPolicy.TASK and spec.task_restarts == 5
    default = parse_cluster("chief: [localhost:2222]\nworker: [localhost:2223]\nps: [localhost:2224]", "x.yaml", LOCAL)
    assert default.restart_policy["worker"] is RestartPolicy.TASK and default.restart_policy["chief"] is RestartPolicy.CLUSTER
    plain = parse_cluster("worker: [localhost:2222, localhost:2223]", "x.yaml", LOCAL)
    assert set(plain.restart_policy.values()) == {RestartPolicy.CLUSTER} and plain.task_restarts == 3


@pytest.mark.parametrize("text, key, message", [
    ("restart_policy: {worker: always}", "restart_policy.worker", "expected one of cluster, task, got 'always'"),
    ("restart_policy: {wrker: task}", "restart_policy.wrker", "unknown key; did you mean 'worker'?"),
    ("restart_policy: task", "restart_policy", "expected a mapping of role to 'cluster' or 'task', got 'task'"),
    ("task_restarts: -1", "task_restarts", "expected an integer >= 0, got -1"),
])
def test_bad_restart_policies(text, key, message):
    expect_error("worker: [localhost:2222]\n" + text, key, message)


@pytest.mark.parametrize("text, key", [
    ("worker:\n  - host: 12\n    port: 2222\n", "worker[0].host"),
    ("worker:\n  - host: 10.5\n    port: 2222\n", "worker[0].host"),
    ("worker: ['node1:2222']\nhosts:\n  12: {workdir: /w}\n", "hosts.12"),
])
def test_a_number_where_a_host_name_goes_is_one_line_that_suggests_quoting(text, key):
    message = error(text)
    assert message.startswith(f"{SOURCE}: {key}: expected a host name, got the number ")
    assert "quote it" in message and "\n" not in message


def test_a_quoted_numeric_host_name_is_a_host_name():
    assert parse("worker:\n  - host: '12'\n    port: 2222\n").tasks[0].host == "12"


def test_every_mistake_of_a_file_is_listed_in_the_file_order():
    text = """
        threads: many
        share_gpus: 1
        worker:
          - {host: localhost, port: 70000, gpus: [true]}
          - {host: localhost, prot: 2222, colour: red}
          - 5
        hosts: {node9: {ssh: {port: 0}}}
    """
    assert error(text).splitlines() == [
        f"{SOURCE}: threads: expected 'auto', 'off' or a thread count >= 1, got 'many'",
        f"{SOURCE}: share_gpus: expected true or false, got 1",
        f"{SOURCE}: worker[0].port: expected a port 1-65535, got 70000",
        f"{SOURCE}: worker[0].gpus[0]: expected a GPU index (integer >= 0), got true",
        f"{SOURCE}: worker[1].prot: unknown key; did you mean 'port'?",
        f"{SOURCE}: worker[1].colour: unknown key; expected one of {', '.join(TASK_KEYS)}",
        f"{SOURCE}: worker[2]: expected a task mapping or a 'host:port' string, got 5",
        f"{SOURCE}: hosts.node9.ssh.port: expected a port 1-65535, got 0",
    ]


def test_every_whole_cluster_problem_is_listed():
    text = """
        chief: [localhost:2222, localhost:2223]
        worker: [localhost:2222, localhost:2223]
        evaluator: [localhost:auto, localhost:auto]
    """
    assert [line.split(": ", 2)[1] for line in error(text).splitlines()] == [
        "chief", "worker[0].port", "worker[1].port", "evaluator"]


@pytest.mark.parametrize("gpus_here, expected", [
    (0, "warning: this machine has no GPU, but GPU 0,1 is given to worker-0, worker-1; they will run on the CPU"),
    (1, "warning: this machine has 1 GPU (0-0), but GPU 1 is given to worker-1; TensorFlow will not see it"),
    (2, None), (None, None),
])
def test_gpus_this_machine_does_not_have_are_one_warning(gpus_here, expected):
    spec = parse("worker:\n - {host: localhost, gpus: [0]}\n - {host: localhost, gpus: [1]}\n"
                 " - {host: node2, gpus: [5]}\n - {host: localhost}")
    assert missing_gpus_warning(spec, LOCAL, gpus_here) == expected


def alias_bomb(depth: int) -> str:
    """A cluster file of ``depth + 2`` lines whose aliases stand for 9**(depth + 1) values."""
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, depth + 1)]
    return "\n".join([*lines, f"worker: *a{depth}"]) + "\n"


@pytest.mark.timeout(10)  # before aliases were counted, the 10-line file took minutes of one core
def test_a_file_whose_aliases_expand_past_the_limit_is_refused_in_one_line():
    assert len(alias_bomb(8).splitlines()) == 10
    message = error(alias_bomb(8))
    assert message.startswith(f"{SOURCE}: line ") and "aliases expand to more than 1,000,000 values" in message
    assert "\n" not in message


def test_aliases_count_once_per_value_they_stand_for():
    import yaml

    from launcher.cluster.yamlfile import check_expanded_size

    # a0 is 10 values written out, a1 1 + 9 x 10 = 91, a2 820, a3 7,381; the mapping holds 5 keys,
    # a0 to a3, and a3 again under worker: 1 + 5 + 10 + 91 + 820 + 7,381 x 2 = 15,689.
    node = yaml.compose(alias_bomb(3))
    check_expanded_size(node, limit=15_689)
    with pytest.raises(yaml.YAMLError, match="more than 15,688 values"):
        check_expanded_size(node, limit=15_688)


def test_a_list_that_holds_itself_through_an_alias_is_refused():
    assert "an alias refers to a list or mapping it is part of" in error("worker: &w [localhost:2222, *w]\n")


def test_anchors_shared_by_many_tasks_still_read():
    spec = parse("""
        env: &common {A: "1", B: "2"}
        hosts:
          localhost: {env: *common}
        worker:
          - {host: localhost, port: 2222, env: *common}
          - {host: localhost, port: 2223, env: *common}
    """)
    assert [t.env["B"] for t in spec.tasks] == ["2", "2"]


@pytest.mark.parametrize("value, read", [("team", "team"), (" team ", "team"), ("1001", "1001"), (1001, "1001")])
def test_log_group_is_a_groups_name_or_number_which_the_run_checks_on_its_machine(value, read):
    assert parse(f"log_group: {value!r}\nworker: [localhost:2222]").log_group == read
    assert parse("worker: [localhost:2222]").log_group is None


@pytest.mark.parametrize("value", ["''", "[team]", "true", "-1"])
def test_a_log_group_that_names_no_group_is_one_line_with_the_key_and_value(value):
    assert "log_group: expected the name or number of a group, got" in error(f"log_group: {value}\nworker: [localhost:2222]")
