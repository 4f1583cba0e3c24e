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
from launcher.run.mesh import LISTENING_MARK, RESULT_MARK
from launcher.run.preflight import PROBE_MARK
from launcher.run.liverecord import task_record
from source_scan import LAUNCHER, code_strings, launcher_modules

pytestmark = pytest.mark.unit

ROOT = LAUNCHER.parent
TRAINER = ROOT / "trainer"
NAMES = set(taskenv.OWNED + taskenv.OFFERED)
# Line marks, not variables: each has its own owner (records/metrics.py, run/preflight.py, run/mesh.py).
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
