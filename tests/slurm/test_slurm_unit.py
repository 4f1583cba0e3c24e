"""Pure parts of the Slurm backend: SLURM_* variables, the role rule, GPUs, the slurm: section, the script."""

from __future__ import annotations

from dataclasses import replace

import pytest

from launcher.errors import ConfigError
from launcher.slurm.job import archive_previous_execution
from launcher.slurm.allocation import (
    Allocation,
    carve_roles,
    gpus_for,
    parse_tasks_per_node,
    read_allocation,
    thread_count,
)
from launcher.slurm.commands import last_line
from launcher.slurm.script import JobRequest, render_script, tflaunch_argv
from launcher.slurm.section import SlurmSettings, read_slurm_section

pytestmark = pytest.mark.unit

NODES = {"gpu[01-02]": ["gpu01", "gpu02"], "n[1-4]": ["n1", "n2", "n3", "n4"], "a1": ["a1"]}


def expand(hostlist: str) -> list[str]:
    """Hostlists of these tests (Slurm's own expansion is exercised by the real-Slurm tests)."""
    return NODES[hostlist]


@pytest.mark.parametrize("text, counts", [
    ("1", [1]), ("2(x3),1", [2, 2, 2, 1]), ("1(x2)", [1, 1]), ("4,2(x2),8", [4, 2, 2, 8]),
])
def test_tasks_per_node_syntax(text, counts):
    assert parse_tasks_per_node(text) == counts


@pytest.mark.parametrize("text", ["", "2(x)", "x3", "2(3)", "1,,2", "-1"])
def test_tasks_per_node_garbage_names_the_variable(text):
    with pytest.raises(ConfigError, match=r"SLURM_TASKS_PER_NODE: expected counts such as '2\(x3\),1'"):
        parse_tasks_per_node(text)


def test_allocation_from_variables():
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n[1-4]", "SLURM_TASKS_PER_NODE": "2(x3),1",
           "SLURM_NTASKS": "7", "SLURM_CPUS_PER_TASK": "3", "SLURM_RESTART_COUNT": "2"}
    alloc = read_allocation(env, expand)
    assert alloc.nodes == ("n1", "n2", "n3", "n4") and alloc.tasks_per_node == (2, 2, 2, 1)
    assert [(s.node, s.local_index, s.rank) for s in alloc.slots][:3] == [("n1", 0, 0), ("n1", 1, 1), ("n2", 0, 2)]
    assert alloc.cpus_per_task == 3 and alloc.restart_count == 2 and alloc.gpus_per_task is None


def test_not_inside_an_allocation_is_one_clear_error():
    with pytest.raises(ConfigError) as error:
        read_allocation({}, expand)
    assert str(error.value).startswith("--slurm: SLURM_JOB_ID: not set: tflaunch is not inside a Slurm allocation")


def test_inconsistent_variables_are_named():
    with pytest.raises(ConfigError, match="SLURM_TASKS_PER_NODE: '1' gives 1 node, but SLURM_JOB_NODELIST 'gpu"):
        read_allocation({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "gpu[01-02]", "SLURM_TASKS_PER_NODE": "1"}, expand)
    with pytest.raises(ConfigError, match="SLURM_NTASKS: 3 disagrees"):
        read_allocation({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "gpu[01-02]", "SLURM_TASKS_PER_NODE": "1(x2)",
                         "SLURM_NTASKS": "3"}, expand)


def test_without_tasks_per_node_each_node_is_one_slot():
    alloc = read_allocation({"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "gpu[01-02]"}, expand)
    assert alloc.tasks_per_node == (1, 1)


def allocation(counts, nodes=None):
    nodes = nodes or [f"n{i + 1}" for i in range(len(counts))]
    return Allocation("7", tuple(nodes), tuple(counts))


def roles_of(alloc, **kw):
    return [(r.name, r.slot.node, r.slot.local_index) for r in carve_roles(alloc, **kw)]


def test_workers_only_follow_slurm_rank_order():
    assert roles_of(allocation([2, 1])) == [("worker-0", "n1", 0), ("worker-1", "n1", 1), ("worker-2", "n2", 0)]


def test_chief_first_slot_ps_next_evaluator_last_workers_the_rest():
    roles = roles_of(allocation([2, 2, 2]), ps=2, evaluator=True)
    assert roles == [("chief-0", "n1", 0), ("ps-0", "n1", 1), ("ps-1", "n2", 0), ("worker-0", "n2", 1),
                     ("worker-1", "n3", 0), ("evaluator-0", "n3", 1)]


def test_ps_implies_chief():
    assert [name for name, _, _ in roles_of(allocation([1, 1, 1]), ps=1)] == ["chief-0", "ps-0", "worker-0"]


@pytest.mark.parametrize("kw, key, need", [
    ({"ps": 2}, "--ps", 4), ({"chief": True}, "--chief", 2), ({"evaluator": True, "chief": True}, "--evaluator", 3),
])
def test_roles_larger_than_the_allocation_are_refused(kw, key, need):
    with pytest.raises(ConfigError) as error:
        carve_roles(allocation([1]), **kw)
    message = str(error.value)
    assert message.startswith(f"--slurm: {key}: ") and f"need {need} task slots" in message
    assert "job 7: 1 task slot on n1" in message


def test_gpus_slurm_binds_are_left_to_slurm():
    alloc = Allocation("1", ("n1",), (2,), gpus_per_task=1)
    assert set(gpus_for(carve_roles(alloc), alloc).values()) == {None}  # no CUDA_VISIBLE_DEVICES from tflaunch


def test_gpus_per_node_are_dealt_round_robin_and_ps_stays_on_cpu():
    alloc = Allocation("1", ("n1", "n2"), (3, 2), gpus_per_node=2)
    gpus = gpus_for(carve_roles(alloc, ps=1), alloc)
    assert gpus == {"chief-0": (0,), "ps-0": (), "worker-0": (1,), "worker-1": (0,), "worker-2": (1,)}


def test_no_gpus_means_cpu_only():
    alloc = allocation([2])
    assert set(gpus_for(carve_roles(alloc), alloc).values()) == {()}


def test_slurm_section_reads_every_key():
    settings = read_slurm_section("c.yaml", {
        "nodes": 2, "ntasks_per_node": 4, "chief": True, "ps": 1, "evaluator": True, "spares": 1, "partition": "gpu",
        "time": "1:00:00", "gpus_per_task": 1, "account": "proj", "sbatch_options": "--qos=high --exclusive",
        "requeue": True, "warning_seconds": 300})
    assert settings == SlurmSettings(2, 4, True, 1, True, 1, "gpu", "1:00:00", 1, "proj",
                                     ("--qos=high", "--exclusive"), True, 300)


@pytest.mark.parametrize("section, message", [
    ({"nodse": 2}, "c.yaml: slurm.nodse: unknown key; did you mean 'nodes'?"),
    ({"nodes": 0}, "c.yaml: slurm.nodes: expected an integer >= 1, got 0"),
    ({"ps": "two"}, "c.yaml: slurm.ps: expected an integer >= 0, got 'two'"),
    ({"sbatch_options": ["qos=high"]}, "c.yaml: slurm.sbatch_options: expected a list of sbatch options"),
    ({"requeue": "yes"}, "c.yaml: slurm.requeue: expected true or false, got 'yes'"),
])
def test_slurm_section_errors_name_key_and_value(section, message):
    with pytest.raises(ConfigError) as error:
        read_slurm_section("c.yaml", section)
    assert str(error.value).startswith(message)


def test_every_mistake_of_the_slurm_section_is_listed_in_the_file_order():
    with pytest.raises(ConfigError) as error:
        read_slurm_section("c.yaml", {"nodes": "x", "bogus": 1, "time": [1], "requeue": 3, "sbatch_options": "qos",
                                      "warning_seconds": 0})
    assert str(error.value).splitlines() == [
        "c.yaml: slurm.nodes: expected an integer >= 1, got 'x'",
        "c.yaml: slurm.bogus: unknown key; expected one of nodes, ntasks_per_node, chief, ps, evaluator, spares, "
        "partition, time, gpus_per_task, account, sbatch_options, requeue, warning_seconds",
        "c.yaml: slurm.time: expected a Slurm time such as '1:00:00' or minutes, got a list",
        "c.yaml: slurm.requeue: expected true or false, got 3",
        "c.yaml: slurm.sbatch_options: expected a list of sbatch options such as '--qos=high', got 'qos'",
        "c.yaml: slurm.warning_seconds: expected an integer >= 1, got 0"]


def test_script_comments_every_sbatch_line_and_execs_tflaunch():
    request = JobRequest(run_dir="/r/logs/run1", workdir="/r", python="/venv/bin/python",
                         settings=SlurmSettings(nodes=2, ntasks_per_node=2, ps=1, partition="debug", time="10",
                                                requeue=True, warning_seconds=90, sbatch_options=("--qos=x",)),
                         command=("python", "train.py", "--lr", "0.1 0.2"), run_options=("--max-restarts", "2"))
    text = render_script(request)
    sbatch = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert all("# " in line.split("#SBATCH", 1)[1] for line in sbatch)  # each one explained
    options = [line.split()[1] for line in sbatch]
    assert options == ["--job-name=tflaunch-run1", "--nodes=2", "--ntasks-per-node=2", "--partition=debug",
                       "--time=10", "--chdir=/r", "--output=/r/logs/run1/slurm-%j.out", "--signal=B:USR1@90",
                       "--requeue", "--open-mode=append", "--qos=x"]
    assert text.rstrip().splitlines()[-1] == ("exec /venv/bin/python -m launcher run --slurm --ps 1 --requeue "
                                              "--run-dir /r/logs/run1 --max-restarts 2 -- python train.py --lr '0.1 0.2'")
    assert tflaunch_argv(request)[-4:] == ["python", "train.py", "--lr", "0.1 0.2"]


def test_slurm_error_lines_lose_their_prefix_noise():
    assert last_line("sbatch: error: Batch job submission failed: Invalid partition name specified\n") == \
        "sbatch: Batch job submission failed: Invalid partition name specified"


def test_a_multiline_command_keeps_every_sbatch_line_in_the_header():
    request = JobRequest(run_dir="/r/logs/run1", workdir="/r", python="/p", settings=SlurmSettings(nodes=1),
                         command=("python", "-c", "import os\nprint(1)"),
                         submitted_argv=("tflaunch", "submit", "--", "python", "-c", "import os\nprint(1)"))
    lines = render_script(request).splitlines()
    header = lines[:next(i for i, line in enumerate(lines) if not line.startswith("#"))]
    assert len([line for line in header if line.startswith("#SBATCH")]) == 5  # sbatch reads no further than this


def test_threads_follow_cpus_per_task_else_the_busiest_node():
    env = {"SLURM_JOB_ID": "3", "SLURM_JOB_NODELIST": "n[1-4]", "SLURM_TASKS_PER_NODE": "2(x3),1",
           "SLURM_JOB_CPUS_PER_NODE": "8(x3),2"}
    alloc = read_allocation(env, expand)
    assert alloc.cpus_per_node == (8, 8, 8, 2)
    assert thread_count(alloc, {"n1": 2, "n2": 2, "n3": 2, "n4": 1}) == 2  # n4: 2 CPUs for 1 task, n1: 8 for 2
    assert thread_count(alloc, {"n1": 1, "n2": 1}) is None  # one task per node keeps TensorFlow's defaults
    assert thread_count(read_allocation({**env, "SLURM_CPUS_PER_TASK": "3"}, expand), {"n1": 2}) == 3


def test_the_repository_slurm_template_reads_and_fits_its_allocation():
    from pathlib import Path

    from launcher.cluster.reader import load_cluster_file

    path = Path(__file__).resolve().parents[2] / "clusters" / "slurm.yaml"
    spec = load_cluster_file(path, frozenset(), slurm_template=True)
    settings = read_slurm_section(str(path), spec.slurm)
    assert spec.tasks == () and settings.nodes == 2 and spec.max_restarts == 1
    alloc = Allocation("1", tuple(f"n{i}" for i in range(settings.nodes)), (settings.ntasks_per_node,) * settings.nodes)
    assert carve_roles(alloc, chief=settings.chief, ps=settings.ps, evaluator=settings.evaluator)


def test_a_run_is_one_step_with_one_agent_per_node():
    from launcher.cluster.plan import TaskLaunch
    from launcher.transports.shipping import remote_agent_argv
    from launcher.transports.srun import srun_argv

    launch = TaskLaunch(name="worker-1", role="worker", index=1, host="gpu02", address="gpu02:20001", local=False,
                        argv=("/venv/bin/python", "-m", "trainer"), env={"A": "b c"}, workdir="/shared/w",
                        python="/venv/bin/python")
    argv = srun_argv(["gpu01", "gpu02", "gpu03"], launch, grace=5, port=4711)
    assert argv[:5] == ["srun", "--nodes=3", "--ntasks=3", "--ntasks-per-node=1", "--nodelist=gpu01,gpu02,gpu03"]
    assert {"--overlap", "--chdir=/shared/w", "--input=all", "--kill-on-bad-exit=0"} <= set(argv)
    agent = remote_agent_argv("/venv/bin/python")
    assert argv[-len(agent) - 1:-1] == agent
    with_setup = srun_argv(["gpu02"], replace(launch, setup="source /opt/env.sh"), grace=5, port=4711)
    # The setup line itself is in the step's environment, not on srun's command line.
    assert with_setup[-len(agent) - 4:-len(agent) - 1] == [
        "/bin/sh", "-c", '{ eval "$TFLAUNCH_SETUP"\n} </dev/null\nunset TFLAUNCH_SETUP\nexec "$0" "$@"']
    assert not any("/opt/env.sh" in word for word in with_setup)
    assert with_setup[-len(agent) - 1:-1] == agent  # the agent's argv passes through "$@" untouched


def test_the_agents_keepalive_is_the_runs_keepalive_timeout():
    from launcher.agent.protocol import decode_fields
    from launcher.cluster.plan import TaskLaunch
    from launcher.options import DEFAULT_KEEPALIVE_TIMEOUT, RunOptions
    from launcher.transports.srun import SrunTransport, srun_argv

    launch = TaskLaunch(name="worker-0", role="worker", index=0, host="n1", address="n1:20001", local=False,
                        argv=("true",), env={}, workdir="/w", python="/venv/bin/python")
    assert float(decode_fields(srun_argv(["n1"], launch, grace=5, port=4711)[-1])["keepalive"]) == \
        DEFAULT_KEEPALIVE_TIMEOUT
    assert float(decode_fields(srun_argv(["n1"], launch, 5, 4711, keepalive=4.0)[-1])["keepalive"]) == 4.0
    assert SrunTransport(RunOptions(keepalive_timeout=4)).keepalive == 4.0
    assert SrunTransport(RunOptions()).keepalive == DEFAULT_KEEPALIVE_TIMEOUT


def test_a_requeue_moves_the_last_executions_record_task_logs_and_attempts_aside(tmp_path):
    kept = ["merged.log", "merged.log.part-4096", "metrics.jsonl", "slurm.json", "tensorboard.log", "job.sbatch"]
    moved = ["run.json", "worker-0.log", "worker-0.log.part-8192", "ps-0.log"]
    for name in kept + moved:
        (tmp_path / name).write_text(name)
    (tmp_path / "attempt-1").mkdir()
    (tmp_path / "attempt-1" / "worker-0.log").write_text("attempt 1")
    (tmp_path / "backup").mkdir()
    target = archive_previous_execution(tmp_path, 1)
    assert target == tmp_path / "requeue-1"
    assert sorted(p.name for p in target.iterdir()) == sorted([*moved, "attempt-1"])
    assert (target / "attempt-1" / "worker-0.log").read_text() == "attempt 1"
    assert all((target / name).read_text() == name for name in moved)  # renamed, every byte kept
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*kept, "backup", "requeue-1"])
    assert archive_previous_execution(tmp_path, 2) is None  # nothing of an execution left to move


def test_a_jobs_run_folder_is_given_the_group_the_file_or_option_names(tmp_path, monkeypatch):
    import grp
    import os
    import stat

    from launcher.slurm.job import prepare_folder
    from launcher.slurm.submit import SubmitOptions, job_request

    monkeypatch.chdir(tmp_path)
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("log_group: users\nslurm: {nodes: 1}\n")
    assert job_request(SubmitOptions(cluster_file=str(cluster)), "")[2] == "users"
    assert job_request(SubmitOptions(cluster_file=str(cluster), log_group="root"), "")[2] == "root"  # the option wins
    cluster.write_text("log_group: no-such-group-here\nslurm: {nodes: 1}\n")
    with pytest.raises(ConfigError, match=f"^{cluster}: log_group: no group 'no-such-group-here' on this machine$"):
        job_request(SubmitOptions(cluster_file=str(cluster)), "")
    run_dir = prepare_folder(None, str(tmp_path / "logs"), {"SLURM_JOB_ID": "7"}, str(cluster), "users").path
    info = os.stat(run_dir)
    assert (info.st_gid, oct(stat.S_IMODE(info.st_mode))) == (grp.getgrnam("users").gr_gid, "0o2750")
    assert oct(stat.S_IMODE(os.stat(run_dir / "slurm.json").st_mode)) == "0o640"
