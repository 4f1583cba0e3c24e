"""Pure parts of spares and lost nodes on Slurm: holding nodes back, --spares, Slurm's node states, srun's argv."""

from __future__ import annotations

import pytest

from launcher.cluster.plan import TaskLaunch
from launcher.errors import ConfigError, OptionsError
from launcher.slurm.allocation import Allocation, carve_roles, hold_back, spare_slots
from launcher.slurm.nodes import judge_nodes
from launcher.slurm.script import JobRequest, render_script, sbatch_lines, tflaunch_argv
from launcher.slurm.section import SlurmSettings, read_slurm_section
from launcher.sources.slurm import spare_count
from launcher.transports.srun import srun_argv

pytestmark = pytest.mark.unit

THREE = Allocation("12", ("n1", "n2", "n3"), (2, 2, 1), cpus_per_node=(8, 8, 4), nodelist="n[1-3]")


def test_the_last_nodes_are_held_back_with_one_spare_slot_per_task_slot():
    tasks, spares = hold_back(Allocation("12", ("n1", "n2", "n3", "n4"), (2, 2, 2, 2), nodelist="n[1-4]"), 2)
    assert tasks.nodes == ("n1", "n2") and tasks.tasks_per_node == (2, 2)
    assert spares == [("n3", 2), ("n4", 2)]
    assert [r.name for r in carve_roles(tasks, chief=True)] == ["chief-0", "worker-0", "worker-1", "worker-2"]
    slots = spare_slots(spares, tasks)
    assert [(s.name, s.host, s.port, s.address, s.gpus) for s in slots] == [
        ("spare-0", "n3", "auto", "n3", ()), ("spare-1", "n3", "auto", "n3", ()),
        ("spare-2", "n4", "auto", "n4", ()), ("spare-3", "n4", "auto", "n4", ())]


def test_held_back_nodes_keep_their_cpu_counts_apart_and_their_gpus_dealt_as_a_worker_s():
    tasks, spares = hold_back(THREE, 1)
    assert tasks.cpus_per_node == (8, 8) and tasks.nodelist == "n1,n2" and spares == [("n3", 1)]
    assert hold_back(THREE, 0) == (THREE, [])
    dealt = Allocation("12", ("n1", "n2"), (1, 2), gpus_per_node=2)
    assert [s.gpus for s in spare_slots([("n2", 2)], dealt)] == [(0,), (1,)]
    bound = Allocation("12", ("n1", "n2"), (1, 1), gpus_per_task=1)
    assert [s.gpus for s in spare_slots([("n2", 1)], bound)] == [None]  # Slurm binds them


def test_holding_back_every_node_is_refused_naming_spares_and_the_allocation():
    with pytest.raises(ConfigError) as caught:
        hold_back(THREE, 3, source="--slurm --spares 3 (job 12)")
    assert str(caught.value) == ("--slurm --spares 3 (job 12): --spares: 3 would hold back every node of job 12: "
                                 "5 task slots on n[1-3]; expected at most 2, leaving a node for the tasks")


@pytest.mark.parametrize("text, count", [(None, None), ("1", 1), ("3", 3)])
def test_spares_with_slurm_is_a_count_of_nodes(text, count):
    assert spare_count(text) == count


@pytest.mark.parametrize("text", ["0", "-1", "two", "node3", "1.5", "", "n1:2"])
def test_a_bad_spares_count_names_the_option_and_the_value(text):
    with pytest.raises(OptionsError) as caught:
        spare_count(text)
    assert str(caught.value) == (f"--spares: with --slurm, expected a number of nodes K >= 1 to hold back as "
                                 f"spares, got {text!r}")


SHOW_NODE = "\n".join([
    "NodeName=n1 Arch=x86_64 CoresPerSocket=1 CPUAlloc=1 State=MIXED ThreadsPerCore=1 Reason=(null) Partitions=debug",
    "NodeName=n2 Arch=x86_64 CPUAlloc=1 State=MIXED+NOT_RESPONDING ThreadsPerCore=1 Partitions=debug",
    "NodeName=n3 Arch=x86_64 State=IDLE+DRAIN Reason=bad fan [root@2026-11-29T06:00:00] Comment=(null)",
    "NodeName=n4 Arch=x86_64 State=DOWN+NOT_RESPONDING Reason=Not responding [slurm@2026-11-29T06:07:35]",
    "NodeName=n5 State=ALLOCATED Partitions=debug",
])


def test_slurm_s_node_states_say_which_nodes_a_step_must_not_use():
    nodes = ["n1", "n2", "n3", "n4", "n5", "n6"]
    assert judge_nodes(nodes, SHOW_NODE, None, "12") == {
        "n2": "Slurm says State=MIXED+NOT_RESPONDING",
        "n3": "Slurm says State=IDLE+DRAIN, Reason=bad fan [root@2026-11-29T06:00:00]",
        "n4": "Slurm says State=DOWN+NOT_RESPONDING, Reason=Not responding [slurm@2026-11-29T06:07:35]",
        "n6": "Slurm does not know it",
    }


def test_a_node_the_job_no_longer_holds_is_not_used():
    verdict = judge_nodes(["n1", "n4", "n5"], SHOW_NODE, {"n1", "n5"}, "12")
    assert verdict == {"n4": "Slurm took it out of job 12; Slurm says State=DOWN+NOT_RESPONDING, "
                             "Reason=Not responding [slurm@2026-11-29T06:07:35]"}
    assert judge_nodes(["n1", "n5"], SHOW_NODE, {"n1"}, "12") == {"n5": "Slurm took it out of job 12"}


def _launch(host: str) -> TaskLaunch:
    return TaskLaunch(name="worker-0", role="worker", index=0, host=host, address=f"{host}:0", local=False,
                      argv=("python",), env={}, workdir="/work", transport="srun")


def test_the_agents_step_names_its_nodes_and_excludes_the_nodes_left_out():
    argv = srun_argv(["n1", "n3"], _launch("n1"), 10.0, 4000, exclude={"n2", "n3"})
    assert "--nodelist=n1,n3" in argv and "--nodes=2" in argv
    assert "--exclude=n2" in argv  # a node the step names is never excluded from it
    assert "--no-kill" in argv  # one failed node does not end the other nodes' agents
    assert not [word for word in srun_argv(["n1"], _launch("n1"), 10.0, 4000) if word.startswith("--exclude")]


def test_submit_asks_for_the_spares_on_top_of_the_nodes_and_passes_them_on():
    settings = SlurmSettings(nodes=2, spares=1)
    request = JobRequest(run_dir="/runs/r1", workdir="/work", python="/usr/bin/python3", settings=settings)
    options = [option for option, _ in sbatch_lines(request)]
    assert "--nodes=3" in options and "--no-kill" in options
    argv = tflaunch_argv(request)
    assert argv[argv.index("--spares") + 1] == "1"
    assert "#SBATCH --nodes=3" in render_script(request) and "2 for the tasks, 1 spare" in render_script(request)
    plain = JobRequest(run_dir="/runs/r1", workdir="/work", python="/usr/bin/python3", settings=SlurmSettings(nodes=2))
    assert "--no-kill" not in [o for o, _ in sbatch_lines(plain)] and "--spares" not in tflaunch_argv(plain)


def test_the_slurm_section_takes_spares():
    assert read_slurm_section("c.yaml", {"nodes": 2, "spares": 1}).spares == 1
    assert read_slurm_section("c.yaml", {"nodes": 2}).spares == 0
    with pytest.raises(ConfigError, match=r"c.yaml: slurm.spares: expected an integer >= 0, got -1"):
        read_slurm_section("c.yaml", {"spares": -1})
