"""The TFLAUNCH_* variables of a task's environment have one owner on the launcher's side
(launcher/taskenv.py); the trainer's copy of the names it reads agrees with it; and the attempt a
launch belongs to travels as a value, not as text read back out of its environment."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from launcher import taskenv
from launcher.cluster.plan import RunContext, TaskLaunch, plan_cluster
from launcher.cluster.reader import parse_cluster
from launcher.cluster.spec import RESERVED_ENV
from launcher.records.metrics import PREFIX as METRIC_PREFIX
from launcher.run.checks.mesh import LISTENING_MARK, RESULT_MARK
from launcher.run.checks.preflight import PROBE_MARK
from launcher.run.lifecycle.liverecord import task_record
from source_scan import LAUNCHER, code_strings, launcher_modules

pytestmark = pytest.mark.unit

ROOT = LAUNCHER.parent
TRAINER = ROOT / "trainer"
NAMES = set(taskenv.OWNED + taskenv.OFFERED)
# Line marks, not variables: each has its own owner (records/metrics.py, run/checks/preflight.py, run/checks/mesh.py).
MARKS = {mark.strip() for mark in (METRIC_PREFIX.decode(), PROBE_MARK, LISTENING_MARK, RESULT_MARK)}
WORD = re.compile(r"TFLAUNCH_[A-Z0-9_]*[A-Z0-9]")


def strings_in_code(path: Path) -> list[tuple[int, str]]:
    """Every string constant of a module's code with its line (:func:`source_scan.code_strings`)."""
    return [(node.lineno, node.value) for node in code_strings(ast.parse(path.read_text(), str(path)))]


def names_used(path: Path) -> list[tuple[int, str]]:
    return [(line, word) for line, text in strings_in_code(path) for word in WORD.findall(text)]


def test_the_finder_sees_names_in_code_and_not_in_docstrings(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('"""Sets TFLAUNCH_TASK."""\n'
                      'def f(env):\n'
                      '    """Reads TFLAUNCH_RUN_ID."""\n'
                      '    return env.get("TFLAUNCH_ATTEMPT"), f"export TFLAUNCH_RUN_DIR={env}"\n')
    assert sorted(word for _, word in names_used(sample)) == ["TFLAUNCH_ATTEMPT", "TFLAUNCH_RUN_DIR"]


def test_no_launcher_module_spells_a_task_variable_itself():
    owner = LAUNCHER / "taskenv.py"
    spelled: dict[str, list[str]] = {}
    # The shipped agent owns its own variables (TFLAUNCH_AGENT_*), which the launcher imports from it.
    for path in launcher_modules():
        for line, word in names_used(path):
            spelled.setdefault(word, []).append(f"{path.relative_to(ROOT)}:{line}")
    # A task's variables are spelled in taskenv.py alone; any other TFLAUNCH_ name (tflaunch's own
    # settings) in one module, which the others import it from.
    found = []
    for word, places in sorted(spelled.items()):
        modules = {place.rsplit(":", 1)[0] for place in places}
        if word in NAMES and modules != {str(owner.relative_to(ROOT))} or word not in NAMES | MARKS and len(modules) > 1:
            found.append(f"{word}: {', '.join(places)}")
    assert found == [], "import the name from its owner (a task's variables: launcher/taskenv.py):\n" + "\n".join(found)
    assert {word for word in spelled if word in NAMES} == NAMES and owner.exists()


def test_the_trainer_reads_the_names_the_launcher_sets():
    from trainer import cli, cluster, handoff

    assert cli.BACKUP_DIR_ENV == taskenv.BACKUP_DIR
    assert cli.CHECKPOINT_DIR_ENV == taskenv.CHECKPOINT_DIR
    assert cli.TENSORBOARD_DIR_ENV == taskenv.TENSORBOARD_DIR
    assert cluster.TASK_ENV == taskenv.TASK
    assert handoff.RUN_ID_ENV == taskenv.RUN_ID
    # Any other TFLAUNCH_ name the trainer's code holds is a variable the launcher sets, or a line mark.
    in_trainer = {word for path in TRAINER.rglob("*.py") for _, word in names_used(path)}
    assert in_trainer - MARKS <= NAMES, in_trainer - MARKS - NAMES
    from trainer.metrics import METRIC_PREFIX as TRAINER_PREFIX

    assert TRAINER_PREFIX.encode() == METRIC_PREFIX


def test_the_plan_sets_every_name_and_the_cluster_file_may_not_override_the_owned_ones():
    spec = parse_cluster("chief: [localhost:2222]\nworker: [localhost:2223, localhost:2224]\n", "c.yaml",
                         frozenset({"localhost"}))
    context = RunContext(run_id="r1", run_dir="/logs/r1", attempt=3, backup_dir="/logs/r1/backup")
    launches = plan_cluster(spec, context, local_hosts=frozenset({"localhost"}), cores_by_host={},
                            default_python="python3", default_workdir="/").launches
    for launch in launches:
        assert {taskenv.TASK, taskenv.RUN_ID, taskenv.RUN_DIR, taskenv.ATTEMPT, taskenv.BACKUP_DIR,
                taskenv.TENSORBOARD_DIR} <= set(launch.env)
        assert (launch.env[taskenv.TASK], launch.env[taskenv.ATTEMPT], launch.attempt) == (launch.name, "3", 3)
    assert set(taskenv.OWNED) <= RESERVED_ENV and not set(taskenv.OFFERED) & RESERVED_ENV


def test_a_task_record_takes_the_attempt_from_the_launch_not_from_its_environment():
    # A launch made by hand, or one whose variables were shown masked: the record still says attempt 2.
    launch = TaskLaunch(name="worker-0", role="worker", index=0, host="localhost", address="localhost:2222",
                        local=True, argv=("true",), env={}, workdir="/", attempt=2)
    assert task_record(launch, None).attempt == 2


# -- ranks and sizes (launcher/cluster/ranks.py) --------------------------------------------------

RANKS = (taskenv.RANK, taskenv.WORLD_SIZE, taskenv.LOCAL_RANK, taskenv.LOCAL_WORLD_SIZE)


def planned(text: str, local: frozenset = frozenset({"localhost"})):
    spec = parse_cluster(text, "c.yaml", local)
    return plan_cluster(spec, RunContext(run_id="r1", run_dir="/logs/r1"), local_hosts=local, cores_by_host={},
                        default_python="python3", default_workdir="/").launches


def ranks_of(launches) -> dict[str, tuple]:
    """Each task's (rank, world size, local rank, local world size); None where a variable is not set."""
    return {l.name: tuple(int(l.env[k]) if k in l.env else None for k in RANKS) for l in launches}


@pytest.mark.parametrize("text, expected", [
    ("worker: [localhost:1, localhost:2, localhost:3]\n",
     {"worker-0": (0, 3, 0, 3), "worker-1": (1, 3, 1, 3), "worker-2": (2, 3, 2, 3)}),
    ("worker: [localhost:1]\n", {"worker-0": (0, 1, 0, 1)}),
    # the chief first, then the workers by index: TensorFlow's id_in_cluster
    ("chief: [localhost:1]\nworker: [localhost:2, localhost:3, localhost:4]\n",
     {"chief-0": (0, 4, 0, 4), "worker-0": (1, 4, 1, 4), "worker-1": (2, 4, 2, 4), "worker-2": (3, 4, 3, 4)}),
    # the workers listed before the chief in the file: the order is TensorFlow's, not the file's
    ("worker: [localhost:2, localhost:3]\nchief: [localhost:1]\n",
     {"chief-0": (0, 3, 0, 3), "worker-0": (1, 3, 1, 3), "worker-1": (2, 3, 2, 3)}),
    # ps and evaluator train no replica: the world size, and no rank
    ("chief: [localhost:1]\nworker: [localhost:2, localhost:3]\nps: [localhost:4, localhost:5]\n"
     "evaluator: [localhost:6]\n",
     {"chief-0": (0, 3, 0, 3), "worker-0": (1, 3, 1, 3), "worker-1": (2, 3, 2, 3), "ps-0": (None, 3, None, None),
      "ps-1": (None, 3, None, None), "evaluator-0": (None, 3, None, None)}),
    ("chief: [localhost:1]\nps: [localhost:2]\n", {"chief-0": (0, 1, 0, 1), "ps-0": (None, 1, None, None)}),
    # local ranks count the training tasks of each host, in rank order; a ps shares a host uncounted
    ("chief: [a:1]\nworker: [b:1, a:2, b:2, c:1]\nps: [a:3]\n",
     {"chief-0": (0, 5, 0, 2), "worker-0": (1, 5, 0, 2), "worker-1": (2, 5, 1, 2), "worker-2": (3, 5, 1, 2),
      "worker-3": (4, 5, 0, 1), "ps-0": (None, 5, None, None)}),
])
def test_every_task_gets_its_rank_and_the_sizes(text, expected):
    assert ranks_of(planned(text)) == expected


def test_the_names_this_machine_goes_by_are_one_host_for_local_ranks():
    launches = planned("worker: [localhost:1, 127.0.0.1:2, node2:1, localhost:3]\n",
                       frozenset({"localhost", "127.0.0.1"}))
    assert ranks_of(launches) == {"worker-0": (0, 4, 0, 3), "worker-1": (1, 4, 1, 3), "worker-2": (2, 4, 0, 1),
                                  "worker-3": (3, 4, 2, 3)}


@pytest.mark.parametrize("chiefs, workers, others", [(0, 1, ""), (0, 5, ""), (1, 0, ""), (1, 7, ""),
                                                     (1, 3, "ps: [h:9, h:10]\nevaluator: [h:11]\n"),
                                                     (0, 4, "evaluator: [h:11]\n")])
def test_the_rank_is_tensorflows_id_in_the_cluster_of_tf_config(chiefs, workers, others):
    import json

    text = ("chief: [h:1]\n" if chiefs else "") + (
        f"worker: [{', '.join(f'h:{100 + i}' for i in range(workers))}]\n" if workers else "") + others
    for launch in planned(text):
        config = json.loads(launch.env["TF_CONFIG"])
        role, index, cluster = config["task"]["type"], config["task"]["index"], config["cluster"]
        # multi_worker_util.worker_count and id_in_cluster, written out
        assert int(launch.env[taskenv.WORLD_SIZE]) == len(cluster.get("chief", [])) + len(cluster.get("worker", []))
        if role in ("chief", "worker"):
            expected = 0 if role == "chief" else index + len(cluster.get("chief", []))
            assert int(launch.env[taskenv.RANK]) == expected
        else:
            assert taskenv.RANK not in launch.env and taskenv.LOCAL_RANK not in launch.env


def test_a_cluster_file_may_not_set_a_rank():
    from launcher.errors import ConfigError

    with pytest.raises(ConfigError, match="TFLAUNCH_RANK"):
        planned("env: {TFLAUNCH_RANK: '3'}\nworker: [localhost:1]\n")
