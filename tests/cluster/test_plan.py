"""plan_cluster: each task's argv, environment and placement, computed without starting anything."""

from __future__ import annotations

import copy
import json
import re
import textwrap

import pytest

from launcher.cluster.commands import LEGACY_KERAS_NOTE
from launcher.cluster.local import local_cluster
from launcher.cluster.reader import ClusterSpec, SshSettings, TaskSpec, parse_cluster
from launcher.cluster.plan import (
    DEFAULT_COMMAND,
    Plan,
    RunContext,
    TaskLaunch,
    gpu_env,
    plan_cluster,
    task_cluster,
    tf_cluster,
    thread_env,
)

pytestmark = pytest.mark.unit

LOCAL = frozenset({"localhost", "myhost"})
CONTEXT = RunContext(run_id="20240101-120000-abcd", run_dir="/logs/20240101-120000-abcd", attempt=1)
DEFAULT_PYTHON = "/venv/bin/python"
DEFAULT_WORKDIR = "/home/me/project"
THREADS = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "OMP_NUM_THREADS")


def spec_of(text: str) -> ClusterSpec:
    return parse_cluster(textwrap.dedent(text), "c.yaml", LOCAL)


def plan(spec: ClusterSpec | str, *, cores: dict[str, int] | None = None, context: RunContext = CONTEXT,
         command: tuple[str, ...] | None = None) -> Plan:
    if isinstance(spec, str):
        spec = spec_of(spec)
    return plan_cluster(spec, context, local_hosts=LOCAL, cores_by_host=cores or {}, default_python=DEFAULT_PYTHON,
                        default_workdir=DEFAULT_WORKDIR, command=command)


def by_name(p: Plan) -> dict[str, TaskLaunch]:
    return {launch.name: launch for launch in p.launches}


def tf_config(launch: TaskLaunch) -> dict:
    return json.loads(launch.env["TF_CONFIG"])


def threads_of(launch: TaskLaunch) -> tuple[str | None, ...]:
    return tuple(launch.env.get(name) for name in THREADS)


# ---------------------------------------------------------------------------------------------
# TF_CONFIG

BIG = """
    evaluator: [localhost:2230]
    ps: [node2:2224, node3:2225]
    worker: [node1:2222, {host: node1, port: 2223, address: 10.0.0.9}, '[fe80::5]:2226']
    chief: [{host: '::1', port: 2221}]
"""


def test_tf_config_as_tensorflow_reads_it():
    p = plan(BIG)
    expected_cluster = {
        "chief": ["[::1]:2221"],
        "worker": ["node1:2222", "10.0.0.9:2223", "[fe80::5]:2226"],
        "ps": ["node2:2224", "node3:2225"],
        "evaluator": ["localhost:2230"],
    }
    assert [launch.name for launch in p.launches] == [
        "chief-0", "worker-0", "worker-1", "worker-2", "ps-0", "ps-1", "evaluator-0"]
    training_cluster = {role: addresses for role, addresses in expected_cluster.items() if role != "evaluator"}
    for launch in p.launches:
        config = tf_config(launch)
        # TFConfigClusterResolver: json.loads(TF_CONFIG), then ["cluster"], ["task"]["type"], ["task"]["index"].
        assert set(config) == {"cluster", "task"}
        if launch.role == "evaluator":
            assert config["cluster"] == expected_cluster
            assert list(config["cluster"]) == ["chief", "worker", "ps", "evaluator"]
        else:
            assert config["cluster"] == training_cluster
            assert list(config["cluster"]) == ["chief", "worker", "ps"]
        assert config["task"] == {"type": launch.role, "index": launch.index}
        assert isinstance(config["task"]["index"], int)
        assert launch.address == config["cluster"][launch.role][launch.index]


def test_tf_config_cluster_is_identical_in_every_training_task():
    p = plan(BIG)
    clusters = {json.dumps(tf_config(launch)["cluster"]) for launch in p.launches if launch.role != "evaluator"}
    assert len(clusters) == 1


def test_the_evaluator_is_only_in_its_own_tf_config():
    # A ParameterServerStrategy chief waits forever for an evaluator named in its cluster.
    for text in (BIG, "worker: [localhost:2222, localhost:2223]\nevaluator: [localhost:2224]",
                 "chief: [localhost:2221]\nworker: [localhost:2222]\nps: [localhost:2223]\n"
                 "evaluator: [localhost:2224]"):
        launches = by_name(plan(text))
        evaluator = tf_config(launches.pop("evaluator-0"))
        assert evaluator["task"] == {"type": "evaluator", "index": 0}
        assert evaluator["cluster"]["evaluator"] == ["localhost:2230" if text is BIG else "localhost:2224"]
        for name, launch in launches.items():
            cluster = tf_config(launch)["cluster"]
            assert "evaluator" not in cluster, name
            # Everything else the evaluator sees is what the training tasks see.
            assert cluster == {r: a for r, a in evaluator["cluster"].items() if r != "evaluator"}, name


def test_an_evaluator_brings_a_checkpoint_folder_for_every_task():
    launches = plan("chief: [localhost:2221]\nworker: [localhost:2222]\nevaluator: [localhost:2224]").launches
    assert {launch.env["TFLAUNCH_CHECKPOINT_DIR"] for launch in launches} == {f"{CONTEXT.run_dir}/checkpoints"}
    assert all("TFLAUNCH_CHECKPOINT_DIR" not in launch.env
               for launch in plan("worker: [localhost:2222, localhost:2223]").launches)
    # A default like the others: the cluster's env can point it at a shared filesystem.
    launches = plan("worker: [node1:2222]\nevaluator: [node2:2224]\nenv: {TFLAUNCH_CHECKPOINT_DIR: /shared/ck}").launches
    assert {launch.env["TFLAUNCH_CHECKPOINT_DIR"] for launch in launches} == {"/shared/ck"}


def test_every_task_gets_the_run_folders_tensorboard_folder():
    for text in ("worker: [localhost:2222]", BIG):
        launches = plan(text).launches
        assert {launch.env["TFLAUNCH_TENSORBOARD_DIR"] for launch in launches} == {f"{CONTEXT.run_dir}/tensorboard"}
        assert {launch.env_sources["TFLAUNCH_TENSORBOARD_DIR"] for launch in launches} == {"tflaunch default"}
    # A default like the others: env layers can point it at shared storage for remote hosts.
    launches = plan("worker: [node1:2222]\nenv: {TFLAUNCH_TENSORBOARD_DIR: /shared/tb}").launches
    assert launches[0].env["TFLAUNCH_TENSORBOARD_DIR"] == "/shared/tb"
    own = plan_cluster(spec_of("worker: [localhost:2222]"), CONTEXT, local_hosts=LOCAL, cores_by_host={},
                       default_python=DEFAULT_PYTHON, default_workdir=DEFAULT_WORKDIR,
                       inherited_env={"TFLAUNCH_TENSORBOARD_DIR": "/mine"}).launches[0]
    assert own.env["TFLAUNCH_TENSORBOARD_DIR"] == "/mine"


def test_task_cluster_leaves_the_given_cluster_alone():
    cluster = {"worker": ["a:1"], "evaluator": ["e:2"]}
    assert task_cluster("worker", cluster) == {"worker": ["a:1"]}
    assert task_cluster("evaluator", cluster) == cluster
    assert task_cluster("evaluator", cluster) is not cluster
    assert cluster == {"worker": ["a:1"], "evaluator": ["e:2"]}


def test_tf_config_lists_only_roles_present():
    p = plan("worker: [localhost:2222, localhost:2223]")
    assert tf_config(p.launches[1]) == {"cluster": {"worker": ["localhost:2222", "localhost:2223"]},
                                        "task": {"type": "worker", "index": 1}}


def test_tf_config_tasks_by_index_even_when_given_out_of_order():
    spec = ClusterSpec(source="x", tasks=(
        TaskSpec("worker", 1, "b", 2), TaskSpec("worker", 0, "a", 1), TaskSpec("chief", 0, "c", 3)))
    assert tf_cluster(spec) == {"chief": ["c:3"], "worker": ["a:1", "b:2"]}
    p = plan(spec)
    assert [launch.name for launch in p.launches] == ["worker-1", "worker-0", "chief-0"]
    assert tf_config(p.launches[0])["task"] == {"type": "worker", "index": 1}
    assert list(tf_config(p.launches[0])["cluster"]) == ["chief", "worker"]


def test_address_overrides_host_in_tf_config_but_not_in_placement():
    launch = by_name(plan("worker: [{host: node1, port: 2222, address: node1.internal}]"))["worker-0"]
    assert launch.host == "node1"
    assert launch.address == "node1.internal:2222"
    assert tf_config(launch)["cluster"]["worker"] == ["node1.internal:2222"]


def test_ipv6_addresses_are_bracketed():
    p = plan("worker: [{host: '::1', port: 2222}, '[2001:db8::1]:2223', {host: n, port: 1, address: 'fd00::2'}]")
    assert tf_config(p.launches[0])["cluster"]["worker"] == ["[::1]:2222", "[2001:db8::1]:2223", "[fd00::2]:1"]


def test_auto_ports_must_be_reserved_first():
    spec = spec_of("worker: [localhost:2222, localhost:auto, localhost:auto]")
    with pytest.raises(ValueError, match=r"ports still 'auto' for worker\[1\], worker\[2\]"):
        plan(spec)
    p = plan(spec.with_ports({"worker-1": 40001, "worker-2": 40002}))
    assert tf_config(p.launches[0])["cluster"]["worker"] == ["localhost:2222", "localhost:40001", "localhost:40002"]


# ---------------------------------------------------------------------------------------------
# GPUs


@pytest.mark.parametrize("gpus, expected", [
    ((), {"CUDA_VISIBLE_DEVICES": "-1"}),
    ((0, 1), {"CUDA_VISIBLE_DEVICES": "0,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}),
    ((3,), {"CUDA_VISIBLE_DEVICES": "3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}),
    ((2, 0), {"CUDA_VISIBLE_DEVICES": "2,0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}),
    (None, {}),
])
def test_gpu_env(gpus, expected):
    assert gpu_env(gpus) == expected


def test_gpu_env_in_the_plan():
    launches = by_name(plan("""
        worker:
          - {host: localhost, port: 1}
          - {host: localhost, port: 2, gpus: [0, 1]}
          - {host: node1, port: 3, gpus: all}
    """))
    cpu, gpu, every = launches["worker-0"], launches["worker-1"], launches["worker-2"]
    assert cpu.env["CUDA_VISIBLE_DEVICES"] == "-1" and "CUDA_DEVICE_ORDER" not in cpu.env
    assert (gpu.env["CUDA_VISIBLE_DEVICES"], gpu.env["CUDA_DEVICE_ORDER"]) == ("0,1", "PCI_BUS_ID")
    assert "CUDA_VISIBLE_DEVICES" not in every.env and "CUDA_DEVICE_ORDER" not in every.env
    assert (cpu.gpus, gpu.gpus, every.gpus) == ((), (0, 1), None)


def test_allow_growth_only_for_tasks_that_share_a_gpu_on_their_host():
    launches = by_name(plan("""
        share_gpus: true
        chief: [{host: localhost, port: 1, gpus: [0]}]
        worker:
          - {host: 127.0.0.1, port: 2, gpus: [0, 1]}  # shares GPU 0 with the chief (same machine)
          - {host: localhost, port: 3, gpus: [2]}     # alone on GPU 2
          - {host: node1, port: 4, gpus: [0]}         # GPU 0 of another machine
          - {host: node2, port: 5, gpus: all}
          - {host: node2, port: 6, gpus: [3]}         # inside node2's "all"
          - {host: localhost, port: 7}                # CPU only
        ps: [{host: node2, port: 8}]                  # CPU only next to GPU tasks
    """))
    growing = {name for name, launch in launches.items() if "TF_FORCE_GPU_ALLOW_GROWTH" in launch.env}
    assert growing == {"chief-0", "worker-0", "worker-3", "worker-4"}
    assert {launches[n].env["TF_FORCE_GPU_ALLOW_GROWTH"] for n in growing} == {"true"}


def test_allow_growth_for_local_cluster_with_fewer_gpus_than_tasks():
    spec = local_cluster(3, gpus=(0, 1))
    ports = {t.name: 41000 + i for i, t in enumerate(spec.tasks)}
    launches = by_name(plan(spec.with_ports(ports)))
    assert [launches[n].env.get("TF_FORCE_GPU_ALLOW_GROWTH") for n in ("worker-0", "worker-1", "worker-2")] == [
        "true", None, "true"]


def test_no_allow_growth_when_gpus_are_distinct():
    p = plan("worker: [{host: localhost, port: 1, gpus: [0]}, {host: localhost, port: 2, gpus: [1]}]")
    assert all("TF_FORCE_GPU_ALLOW_GROWTH" not in launch.env for launch in p.launches)


# ---------------------------------------------------------------------------------------------
# Threads


@pytest.mark.parametrize("threads, cores, tasks, expected", [
    ("auto", 2, 2, ("1", "2", "1")),   # two inter-op threads always: one deadlocks ParameterServer
    ("auto", 8, 3, ("2", "2", "2")),
    ("auto", 8, 2, ("4", "2", "4")),
    ("auto", 64, 4, ("16", "2", "16")),
    ("auto", 2, 5, ("1", "2", "1")),   # more tasks than cores: still at least one thread
    ("auto", 8, 1, None),              # a task alone on its host keeps TensorFlow's defaults
    ("auto", None, 4, None),           # unknown core count (remote host)
    (4, 8, 2, ("4", "2", "4")),
    (4, None, 1, ("4", "2", "4")),
    (1, 8, 8, ("1", "2", "1")),
    ("off", 8, 4, None),
    ("off", None, 1, None),
])
def test_thread_env(threads, cores, tasks, expected):
    env = thread_env(threads, cores, tasks)
    if expected is None:
        assert env == {}
    else:
        assert env == {"TF_NUM_INTRAOP_THREADS": expected[0], "TF_NUM_INTEROP_THREADS": expected[1],
                       "OMP_NUM_THREADS": expected[2]}


def test_threads_two_tasks_on_two_cores():
    p = plan("worker: [localhost:1, localhost:2]", cores={"localhost": 2})
    assert [threads_of(launch) for launch in p.launches] == [("1", "2", "1")] * 2


def test_threads_three_tasks_on_eight_cores():
    p = plan("worker: [localhost:1, 127.0.0.1:2, myhost:3]", cores={"localhost": 8})
    assert [threads_of(launch) for launch in p.launches] == [("2", "2", "2")] * 3


def test_threads_single_task_gets_none():
    p = plan("worker: [localhost:1]", cores={"localhost": 8})
    assert threads_of(p.launches[0]) == (None, None, None)


def test_threads_count_tasks_per_host():
    p = plan("""
        chief: [localhost:1]
        worker: [localhost:2, node1:3, node1:4, node1:5, node1:6, node2:7]
    """, cores={"localhost": 8, "node1": 16, "node2": 4})
    assert [threads_of(launch) for launch in p.launches] == [
        ("4", "2", "4"), ("4", "2", "4"), ("4", "2", "4"), ("4", "2", "4"), ("4", "2", "4"), ("4", "2", "4"),
        (None, None, None)]


def test_threads_remote_hosts_with_unknown_cores_get_none():
    p = plan("worker: [localhost:1, localhost:2, node1:3, node1:4]", cores={"localhost": 4})
    assert [threads_of(launch) for launch in p.launches] == [
        ("2", "2", "2"), ("2", "2", "2"), (None, None, None), (None, None, None)]


def test_threads_fixed_count():
    p = plan("threads: 4\nworker: [localhost:1, node1:2]", cores={"localhost": 64})
    assert [threads_of(launch) for launch in p.launches] == [("4", "2", "4")] * 2


def test_threads_off():
    p = plan("threads: 'off'\nworker: [localhost:1, localhost:2]", cores={"localhost": 8})
    assert [threads_of(launch) for launch in p.launches] == [(None, None, None)] * 2


def test_threads_user_env_wins():
    p = plan("""
        env: {TF_NUM_INTRAOP_THREADS: 7}
        worker:
          - localhost:1
          - {host: localhost, port: 2, env: {OMP_NUM_THREADS: 3, TF_NUM_INTEROP_THREADS: 1}}
    """, cores={"localhost": 8})
    assert threads_of(p.launches[0]) == ("7", "2", "4")
    assert threads_of(p.launches[1]) == ("7", "1", "3")


# ---------------------------------------------------------------------------------------------
# Other defaults


def test_pythonunbuffered_for_every_task():
    p = plan(BIG)
    assert {launch.env["PYTHONUNBUFFERED"] for launch in p.launches} == {"1"}
    assert plan("worker: [localhost:1]").launches[0].env["PYTHONUNBUFFERED"] == "1"


def test_legacy_keras_for_multi_task_clusters_with_a_note():
    p = plan("worker: [localhost:1, localhost:2]", command=("python", "train.py"))
    assert [launch.env["TF_USE_LEGACY_KERAS"] for launch in p.launches] == ["1", "1"]
    assert p.notes == (LEGACY_KERAS_NOTE,)
    assert "Model.fit then fails" in LEGACY_KERAS_NOTE  # the way out is never offered without its cost
    # the built-in trainer chooses its Keras itself: the variable is set, the note would say nothing
    p = plan("worker: [localhost:1, localhost:2]")
    assert [launch.env["TF_USE_LEGACY_KERAS"] for launch in p.launches] == ["1", "1"] and p.notes == ()


def test_no_legacy_keras_for_a_single_task():
    p = plan("chief: [localhost:1]")
    assert "TF_USE_LEGACY_KERAS" not in p.launches[0].env
    assert p.notes == ()


@pytest.mark.parametrize("where", [
    "env: {TF_USE_LEGACY_KERAS: 0}\nworker: [localhost:1, node1:2]",
    "hosts: {localhost: {env: {TF_USE_LEGACY_KERAS: '0'}}, node1: {env: {TF_USE_LEGACY_KERAS: '0'}}}\n"
    "worker: [localhost:1, node1:2]",
    "worker: [{host: localhost, port: 1, env: {TF_USE_LEGACY_KERAS: 0}},"
    " {host: node1, port: 2, env: {TF_USE_LEGACY_KERAS: 0}}]",
])
def test_user_turns_legacy_keras_off_and_gets_no_note(where):
    p = plan(where)
    assert [launch.env["TF_USE_LEGACY_KERAS"] for launch in p.launches] == ["0", "0"]
    assert p.notes == ()


def test_legacy_keras_note_stays_while_any_task_uses_it():
    p = plan("worker: [{host: localhost, port: 1, env: {TF_USE_LEGACY_KERAS: 0}}, localhost:2]",
             command=("python", "train.py"))
    assert [launch.env["TF_USE_LEGACY_KERAS"] for launch in p.launches] == ["0", "1"]
    assert p.notes == (LEGACY_KERAS_NOTE,)


# ---------------------------------------------------------------------------------------------
# Layering


def test_env_layers_defaults_cluster_host_task():
    launches = by_name(plan("""
        env: {A: cluster, B: cluster, C: cluster, PYTHONUNBUFFERED: 0, TF_USE_LEGACY_KERAS: 0}
        hosts:
          node1: {env: {A: host, B: host, H: node1}}
        worker:
          - {host: node1, port: 1, env: {A: task}}
          - {host: node1, port: 2}
          - {host: node2, port: 3, env: {T: 2}}
    """))
    w0, w1, w2 = launches["worker-0"], launches["worker-1"], launches["worker-2"]
    assert (w0.env["A"], w0.env["B"], w0.env["C"], w0.env["H"]) == ("task", "host", "cluster", "node1")
    assert (w1.env["A"], w1.env["B"], w1.env["C"], w1.env["H"]) == ("host", "host", "cluster", "node1")
    assert (w2.env["A"], w2.env["B"], w2.env["C"], "H" in w2.env, w2.env["T"]) == (
        "cluster", "cluster", "cluster", False, "2")
    # The cluster's env beats tflaunch's defaults.
    assert {launch.env["PYTHONUNBUFFERED"] for launch in launches.values()} == {"0"}
    assert {launch.env["TF_USE_LEGACY_KERAS"] for launch in launches.values()} == {"0"}


def test_owned_vars_beat_every_layer():
    # A spec built directly can carry what a cluster file may not: tflaunch's own variables still win.
    sneaky = {"TF_CONFIG": "{}", "TFLAUNCH_TASK": "x", "TFLAUNCH_RUN_ID": "x", "TFLAUNCH_RUN_DIR": "x",
              "TFLAUNCH_ATTEMPT": "x", "CUDA_VISIBLE_DEVICES": "7", "CUDA_DEVICE_ORDER": "FASTEST_FIRST"}
    spec = ClusterSpec(source="x", env=sneaky, tasks=(
        TaskSpec("worker", 0, "localhost", 1, gpus=(0,), env=sneaky),
        TaskSpec("worker", 1, "localhost", 2, env=sneaky)))
    w0, w1 = plan(spec, context=RunContext("run-7", "/runs/run-7", attempt=3)).launches
    assert tf_config(w0)["task"] == {"type": "worker", "index": 0}
    assert (w0.env["TFLAUNCH_TASK"], w0.env["TFLAUNCH_RUN_ID"], w0.env["TFLAUNCH_RUN_DIR"], w0.env["TFLAUNCH_ATTEMPT"]) \
        == ("worker-0", "run-7", "/runs/run-7", "3")
    assert (w0.env["CUDA_VISIBLE_DEVICES"], w0.env["CUDA_DEVICE_ORDER"]) == ("0", "PCI_BUS_ID")
    assert w1.env["CUDA_VISIBLE_DEVICES"] == "-1"


def test_tflaunch_vars():
    context = RunContext(run_id="r42", run_dir="/x/logs/r42", attempt=2)
    for launch in plan(BIG, context=context).launches:
        assert launch.env["TFLAUNCH_TASK"] == launch.name
        assert launch.env["TFLAUNCH_RUN_ID"] == "r42"
        assert launch.env["TFLAUNCH_RUN_DIR"] == "/x/logs/r42"
        assert launch.env["TFLAUNCH_ATTEMPT"] == "2"


def test_env_holds_only_strings():
    p = plan(BIG, cores={"localhost": 8})
    for launch in p.launches:
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in launch.env.items())


def test_env_holds_only_what_tflaunch_adds():
    launch = plan("worker: [localhost:1]").launches[0]
    assert set(launch.env) == {"PYTHONUNBUFFERED", "TF_CONFIG", "TFLAUNCH_TASK", "TFLAUNCH_RUN_ID",
                               "TFLAUNCH_RUN_DIR", "TFLAUNCH_ATTEMPT", "CUDA_VISIBLE_DEVICES",
                               "TFLAUNCH_TENSORBOARD_DIR", "TFLAUNCH_RANK", "TFLAUNCH_WORLD_SIZE",
                               "TFLAUNCH_LOCAL_RANK", "TFLAUNCH_LOCAL_WORLD_SIZE"}


# ---------------------------------------------------------------------------------------------
# argv, python, workdir, setup


PYTHONS = """
    python: /cluster/python
    hosts:
      node1: {python: /node1/python}
      node2: {}
    worker:
      - {host: node1, port: 1, python: /task/python}
      - {host: node1, port: 2}
      - {host: node2, port: 3}
      - {host: localhost, port: 4}
"""


def test_python_task_beats_host_beats_cluster():
    p = plan(PYTHONS)
    assert [launch.argv for launch in p.launches] == [
        ("/task/python", "-m", "trainer"), ("/node1/python", "-m", "trainer"),
        ("/cluster/python", "-m", "trainer"), ("/cluster/python", "-m", "trainer")]


def test_python_defaults_to_default_python():
    p = plan("worker: [localhost:1, node1:2]")
    assert [launch.argv for launch in p.launches] == [(DEFAULT_PYTHON, *DEFAULT_COMMAND[1:])] * 2
    assert DEFAULT_COMMAND == ("python", "-m", "trainer")


@pytest.mark.parametrize("command, argv", [
    ("python train.py --lr 0.1", ("/task/python", "train.py", "--lr", "0.1")),
    ("python3 -u train.py", ("/task/python", "-u", "train.py")),
    ("python", ("/task/python",)),
    ("python3.11 train.py", ("python3.11", "train.py")),
    ("/usr/bin/python train.py", ("/usr/bin/python", "train.py")),
    ("bash -c 'python x.py'", ("bash", "-c", "python x.py")),
    ("./train.sh python", ("./train.sh", "python")),
])
def test_python_substitution_only_for_python_commands(command, argv):
    p = plan(f"command: {command}\nworker: [{{host: localhost, port: 1, python: /task/python}}]")
    assert p.launches[0].argv == argv


def test_command_argument_beats_the_file_command():
    text = "command: python file.py\nworker: [localhost:1]"
    assert plan(text).launches[0].argv == (DEFAULT_PYTHON, "file.py")
    assert plan(text, command=("python", "cli.py", "-x")).launches[0].argv == (DEFAULT_PYTHON, "cli.py", "-x")
    assert plan(text, command=("./bin/train",)).launches[0].argv == ("./bin/train",)
    assert plan("worker: [localhost:1]", command=("python3", "a.py")).launches[0].argv == (DEFAULT_PYTHON, "a.py")


def test_workdir_and_setup_precedence():
    launches = by_name(plan("""
        workdir: /cluster/dir
        setup: cluster-setup
        hosts:
          node1: {workdir: /node1/dir, setup: node1-setup}
        worker:
          - {host: node1, port: 1, workdir: /task/dir, setup: task-setup}
          - {host: node1, port: 2}
          - {host: node2, port: 3}
    """))
    assert [(launch.workdir, launch.setup) for launch in launches.values()] == [
        ("/task/dir", "task-setup"), ("/node1/dir", "node1-setup"), ("/cluster/dir", "cluster-setup")]


def test_workdir_defaults_and_no_setup():
    launch = plan("worker: [localhost:1]").launches[0]
    assert (launch.workdir, launch.setup) == (DEFAULT_WORKDIR, None)


# ---------------------------------------------------------------------------------------------
# Placement: local flag and ssh


def test_local_flag_and_ssh_settings():
    launches = by_name(plan("""
        ssh: {user: alice, port: 2200, options: [-o, A=1], connect_timeout: 5}
        hosts:
          node1: {ssh: {user: bob, identity_file: /k, keepalive_timeout: 9}}
          localhost: {ssh: {user: nobody}}
        worker: [localhost:1, 127.0.0.1:2, myhost:3, '[::1]:4', node1:5, node2:6]
    """))
    assert [launch.local for launch in launches.values()] == [True, True, True, True, False, False]
    for name in ("worker-0", "worker-1", "worker-2", "worker-3"):
        assert launches[name].ssh is None
    assert launches["worker-4"].ssh == SshSettings(user="bob", port=2200, identity_file="/k", options=("-o", "A=1"),
                                                   connect_timeout=5.0, keepalive_timeout=9.0)
    assert launches["worker-5"].ssh == SshSettings(user="alice", port=2200, options=("-o", "A=1"), connect_timeout=5.0)
    assert launches["worker-4"].host == "node1"


def test_remote_task_without_any_ssh_settings():
    launch = by_name(plan("worker: [node1:1]"))["worker-0"]
    assert launch.ssh == SshSettings() and launch.local is False


# ---------------------------------------------------------------------------------------------
# Purity


def test_plan_is_pure():
    text = textwrap.dedent(BIG).replace("evaluator: [localhost:2230]",
                                        "evaluator: [{host: localhost, port: 2230, env: {E: 1}}]")
    spec = spec_of(text + "env: {X: 1}\nhosts: {node1: {env: {Y: 2}}}\n")
    before = copy.deepcopy(spec)
    first = plan(spec, cores={"localhost": 8})
    second = plan(spec, cores={"localhost": 8})
    assert first == second
    assert spec == before
    # The launches do not share dicts with the spec: changing one leaves the other alone.
    first.launches[0].env["X"] = "changed"
    first.launches[-1].env["E"] = "changed"
    assert spec.env == {"X": "1"} and spec.tasks[-1].env == {"E": "1"}
    assert second.launches[0].env["X"] == "1"


def test_plan_does_not_read_the_process_environment(monkeypatch):
    spec = spec_of("worker: [localhost:1, localhost:2]")
    first = plan(spec)
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")
    monkeypatch.setenv("OMP_NUM_THREADS", "9")
    assert plan(spec) == first


def test_addresses_are_host_colon_port_strings():
    for launch in plan(BIG).launches:
        assert re.fullmatch(r"(\[[0-9a-f:]+\]|[\w.-]+):\d+", launch.address), launch.address


def test_the_training_tasks_of_a_synchronous_cluster_are_watched_as_often_as_the_run_asks():
    watching = RunContext(run_id="r", run_dir="/logs/r", watch_every=1.5)
    lock_step = """
        chief: [localhost:2221]
        worker: [localhost:2222, localhost:2223]
        evaluator: [localhost:2230]
    """
    watched = {name: launch.watch_every for name, launch in by_name(plan(lock_step, context=watching)).items()}
    assert watched == {"chief-0": 1.5, "worker-0": 1.5, "worker-1": 1.5, "evaluator-0": None}
    # Not with the rule off (no watch_every), nor in a ParameterServer cluster, whose workers keep
    # no lock step for one to hold the others back.
    assert {launch.watch_every for launch in plan(lock_step).launches} == {None}
    assert {launch.watch_every for launch in plan(BIG, context=watching).launches} == {None}
