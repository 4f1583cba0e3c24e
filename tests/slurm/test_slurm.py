"""The Slurm backend on a real Slurm: slurmctld and two slurmd nodes in network namespaces (testslurm).

Every test runs real tflaunch, real sbatch/srun and real tasks on both nodes; processes left on a
node are looked for in that node's namespace after each test.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from conftest import LOCKSTEP, ROOT, TASK
from polling import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.slurm]


def tflaunch(testslurm, cwd: Path, *args: str, timeout: float = 240, env: dict | None = None):
    return subprocess.run([sys.executable, "-m", "launcher", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**testslurm.env, "PYTHONPATH": str(ROOT), **(env or {})},
                          stdin=subprocess.DEVNULL)


def submit(testslurm, tmp_path: Path, *args: str, timeout: float = 240):
    done = tflaunch(testslurm, tmp_path, "submit", "--log-dir", str(tmp_path / "logs"), *args, timeout=timeout)
    run_dir = None
    for line in done.stdout.splitlines():
        if line.startswith("submitted job "):
            run_dir = Path(line.rsplit("run folder ", 1)[1])
    return done, run_dir


def job_id_of(run_dir: Path) -> str:
    return json.loads((run_dir / "slurm.json").read_text())["job_id"]


def record(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def sbatch_wait(testslurm, tmp_path: Path, body: str, *options: str, timeout: float = 240):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n" + body + "\n")
    out = tmp_path / "job.out"
    done = testslurm.run("sbatch", "--wait", f"--output={out}", f"--chdir={tmp_path}", *options, str(script),
                         timeout=timeout)
    return done, out.read_text() if out.exists() else ""


@pytest.mark.tensorflow
@pytest.mark.timeout(460)  # its submit waits up to 400 s
def test_submit_wait_trains_the_builtin_trainer_across_two_nodes(slurm, tmp_path):
    done, run_dir = submit(slurm, tmp_path, "--nodes", "2", "--wait", "--", "python", "-m", "trainer",
                           "--epochs", "3", "--batch-per-worker", "24", timeout=400)
    assert done.returncode == 0, done.stderr + (run_dir and (run_dir / f"slurm-{job_id_of(run_dir)}.out").read_text())
    rec = record(run_dir)
    assert rec["status"] == "succeeded" and rec["exit_code"] == 0
    assert sorted(t["host"] for t in rec["tasks"]) == slurm.nodes  # one worker on each node
    epochs = [r for r in metrics(run_dir) if r["kind"] == "epoch"]
    by_task = {t: [r for r in epochs if r["task"] == t] for t in ("worker-0", "worker-1")}
    assert [r["epoch"] for r in by_task["worker-0"]] == [1, 2, 3]
    assert [r["loss"] for r in by_task["worker-0"]] == [r["loss"] for r in by_task["worker-1"]]  # lock-step
    assert all(r["global_batch"] == 48 and r["replicas"] == 2 for r in epochs)
    final = [r for r in metrics(run_dir) if r["kind"] == "final" and r["task"] == "worker-0"]
    assert final and final[0]["test_accuracy"] > 0.5
    assert (run_dir / "job.sbatch").read_text().count("#SBATCH --nodes=2") == 1
    runs = tflaunch(slurm, tmp_path, "runs", "--log-dir", str(tmp_path / "logs"))
    assert run_dir.name in runs.stdout and "succeeded" in runs.stdout and f"job {job_id_of(run_dir)}" in runs.stdout
    # The same run folder as any other run: every inspection command reads it.
    for args in (("logs",), ("logs", "--follow"), ("logs", "--task", "worker-1"), ("status",), ("report",),
                 ("compare", run_dir.name)):
        shown = tflaunch(slurm, tmp_path, *args[:1], run_dir.name, *args[1:], "--log-dir", str(tmp_path / "logs"))
        assert shown.returncode == 0 and "Traceback" not in shown.stderr, (args, shown.stderr)
        if args == ("report",):
            assert ", 3 epochs" in shown.stdout
        if args == ("logs", "--task", "worker-1"):
            assert "TFLAUNCH_METRIC" in shown.stdout
    merged = (run_dir / "merged.log").read_text().splitlines()
    line = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} \[1\] (tflaunch|worker-[01]) \| ")
    assert merged and all(line.match(text) for text in merged), [m for m in merged if not line.match(m)][:3]


def test_slurm_inside_an_sbatch_script_gives_each_task_its_node(slurm, tmp_path):
    probe = "import os, socket; print('HOST', socket.gethostname(), os.environ['TF_CONFIG'], flush=True)"
    body = (f"exec {sys.executable} -m launcher --slurm --chief --log-dir {tmp_path}/logs -- "
            f"python -c \"{probe}\"")
    done, out = sbatch_wait(slurm, tmp_path, body, "--nodes=2", "--ntasks-per-node=2",
                            f"--export=ALL,PYTHONPATH={ROOT}")
    assert done.returncode == 0, out
    lines = [line.split(" | ", 1)[1].split() for line in out.splitlines() if " | HOST " in line]
    assert len(lines) == 4
    hosts = {json.loads(config)["task"]["type"] + "-" + str(json.loads(config)["task"]["index"]): host
             for _, host, config in lines}
    assert hosts == {"chief-0": slurm.nodes[0], "worker-0": slurm.nodes[0], "worker-1": slurm.nodes[1],
                     "worker-2": slurm.nodes[1]}
    cluster = json.loads(lines[0][2])["cluster"]
    addresses = cluster["chief"] + cluster["worker"]
    assert {a.rsplit(":", 1)[0] for a in addresses} == set(slurm.nodes)  # names the other node resolves
    assert len(set(addresses)) == 4


def test_a_killed_task_stops_the_job_with_its_exit_code(slurm, tmp_path):
    done, run_dir = submit(slurm, tmp_path, "--nodes", "2", "--ntasks-per-node", "2", "--wait", "--",
                           "python", TASK, "sleep-if:worker-3:1", "exit-if:worker-3:7", "forever")
    assert done.returncode == 7, done.stderr
    rec = record(run_dir)
    assert rec["status"] == "failed" and rec["exit_code"] == 7
    assert rec["root_cause"]["task"] == "worker-3" and rec["root_cause"]["host"] == slurm.nodes[1]
    assert {t["name"]: t["state"] for t in rec["tasks"]} == {"worker-0": "stopped", "worker-1": "stopped",
                                                             "worker-2": "stopped", "worker-3": "failed"}
    # The run's own files, the job script among them, are its user's alone.
    assert oct(run_dir.stat().st_mode & 0o7777) == "0o700"
    own = [run_dir / name for name in ("job.sbatch", "slurm.json", "run.json", "merged.log", "worker-3.log")]
    assert {oct(path.stat().st_mode & 0o7777) for path in own} == {"0o600"}


def test_restarts_inside_the_allocation(slurm, tmp_path):
    marker = tmp_path / "failed-once"
    code = (f"import os, sys; p = {str(marker)!r}\n"
            "if os.environ['TFLAUNCH_TASK'] == 'worker-1' and not os.path.exists(p):\n"
            "    open(p, 'w').close(); sys.exit(3)\n"
            "print('attempt', os.environ['TFLAUNCH_ATTEMPT'], 'backup', os.environ['TFLAUNCH_BACKUP_DIR'])")
    done, run_dir = submit(slurm, tmp_path, "--nodes", "2", "--max-restarts", "1", "--restart-delay", "0", "--wait",
                           "--",
                           "python", "-c", code)
    assert done.returncode == 0, done.stderr
    rec = record(run_dir)
    assert [a["outcome"] for a in rec["attempts"]] == ["failed", "succeeded"]
    assert f"backup {run_dir.resolve()}/backup" in (run_dir / "worker-0.log").read_text()


def test_scancel_leaves_nothing_on_any_node_and_a_final_run_folder(slurm, tmp_path):
    done, run_dir = submit(slurm, tmp_path, "--nodes", "2", "--ntasks-per-node", "2", "--", "python", TASK,
                           "child", "forever")
    assert done.returncode == 0, done.stderr
    wait_for(lambda: (run_dir / "run.json").exists() and all(
        t["state"] == "running" for t in record(run_dir)["tasks"]) and len(record(run_dir)["tasks"]) == 4,
        timeout=120, message="every task running")
    assert all(slurm.pids(node) for node in slurm.nodes)  # the tasks (and their children) are there
    slurm.run("scancel", job_id_of(run_dir))
    slurm.wait_idle(timeout=40)  # nothing left on either node, no job left
    rec = wait_for(lambda: record(run_dir)["status"] != "running" and record(run_dir), timeout=120,
                   message="a final run record")
    assert rec["status"] == "stopped" and rec["ended_at"]


KEEPALIVE = 5  # seconds: a node whose agent went silent is lost after this


def test_a_node_that_dies_is_reported_as_such(slurm, tmp_path):
    # --no-requeue: by default Slurm requeues a batch job whose node failed; this test wants it to end.
    # A silent node is lost after 5 s, not the default 15 (the killed agent's connection may close unseen).
    done, run_dir = submit(slurm, tmp_path, "--nodes", "2", "--sbatch-option=--no-requeue", "--keepalive-timeout",
                           str(KEEPALIVE), "--", "python", TASK, "forever")
    assert done.returncode == 0, done.stderr
    wait_for(lambda: (run_dir / "run.json").exists() and len(record(run_dir)["tasks"]) == 2
             and all(t["state"] == "running" for t in record(run_dir)["tasks"]), timeout=120,
             message="every task running")
    lost = slurm.nodes[1]
    try:
        slurm.kill_node(lost)
        rec = wait_for(lambda: record(run_dir)["status"] != "running" and record(run_dir), timeout=90,
                       message="a final run record")
    finally:
        slurm.revive(lost)
    # Slurm cancels the job for the node failure (SIGTERM to tflaunch) while srun reports the lost node:
    # whichever tflaunch sees first decides failed or stopped; the task's record names the node either way.
    assert rec["status"] in ("failed", "stopped") and rec["ended_at"]
    worker = {t["name"]: t for t in rec["tasks"]}["worker-1"]
    assert worker["host"] == lost and (worker["error"] or "").startswith(f"lost node {lost} ("), worker
    # Whoever noticed first speaks: the node's agent gone (its connection closed) or silent (tflaunch's own
    # keep-alive), srun's report of the node failure, or the job's cancellation for it.
    assert any(words in worker["error"] for words in (f"connection to {lost} closed",
                                                      f"within the {KEEPALIVE} s keep-alive timeout",
                                                      "Node failure", "Job step aborted")), worker["error"]
    if rec["status"] == "failed":
        assert rec["root_cause"]["task"] == "worker-1" and rec["root_cause"]["error"] == worker["error"]


REQUEUED_EPOCHS = 12


@pytest.mark.timeout(360)  # its job waits up to 300 s
def test_a_warned_job_saves_is_requeued_and_resumes_after_its_last_saved_epoch(slurm, tmp_path):
    # The stand-in worker in lock step across both nodes: twelve epochs of about a second each.
    done, run_dir = submit(slurm, tmp_path, "--nodes", "2", "--requeue", "--", "python", LOCKSTEP,
                           "--epochs", str(REQUEUED_EPOCHS), "--steps", "10", "--step-seconds", "0.1")
    assert done.returncode == 0, done.stderr
    job = job_id_of(run_dir)
    wait_for(lambda: any(r["kind"] == "epoch" and r["epoch"] == 2 for r in metrics(run_dir)), timeout=240,
             message="epoch 2 saved")
    # What Slurm does --warning-seconds before the time limit, or at preemption: USR1 to the batch shell.
    assert slurm.run("scancel", "--batch", "--signal=USR1", job).returncode == 0
    # The test cluster holds a requeued job for about 10 s (cred_expire=10; Slurm's default is 120 s).
    # The requeued execution moves the first one's record into requeue-1/, after making the folder:
    # until then the record at the top is the first execution's, stopped by the signal.
    wait_for(lambda: (run_dir / "requeue-1" / "run.json").exists(), timeout=120, message="the requeued execution")
    rec = wait_for(lambda: (run_dir / "run.json").exists()
                   and record(run_dir)["status"] not in ("running",) and record(run_dir), timeout=300,
                   message="the requeued run to finish")
    assert rec["status"] == "succeeded", (run_dir / f"slurm-{job}.out").read_text()[-3000:]
    first = json.loads((run_dir / "requeue-1" / "run.json").read_text())
    assert first["status"] == "stopped"
    slurm_record = json.loads((run_dir / "slurm.json").read_text())
    assert slurm_record["restart_count"] == 1 and len(slurm_record["requeues"]) == 1
    requeued_at = datetime.fromisoformat(slurm_record["requeues"][0]["at"]).timestamp()
    epochs = [r for r in metrics(run_dir) if r["kind"] == "epoch" and r["task"] == "worker-0"]
    before = [r["epoch"] for r in epochs if r["time"] < requeued_at]
    after = [r["epoch"] for r in epochs if r["time"] > requeued_at]
    assert before[:2] == [1, 2] and after, (before, after)
    assert after[0] == before[-1] + 1 and after[-1] == REQUEUED_EPOCHS, (before, after)  # after the last saved epoch


def test_bad_input_is_one_line_with_exit_code_2(slurm, tmp_path):
    outside = tflaunch(slurm, tmp_path, "--slurm", env={"SLURM_JOB_ID": "", "SLURM_JOBID": ""})
    assert outside.returncode == 2 and outside.stderr.count("\n") == 1
    assert "SLURM_JOB_ID: not set: tflaunch is not inside a Slurm allocation" in outside.stderr

    too_many, run_dir = submit(slurm, tmp_path, "--nodes", "2", "--ps", "2")
    assert too_many.returncode == 2 and too_many.stderr.count("\n") == 1 and run_dir is None
    assert "--ps: a chief, 2 ps tasks and at least one worker need 4 task slots" in too_many.stderr

    partition, run_dir = submit(slurm, tmp_path, "--nodes", "1", "--partition", "nosuchpartition")
    assert partition.returncode == 2 and partition.stderr.count("\n") == 1
    assert "Invalid partition name specified" in partition.stderr
    assert not list((tmp_path / "logs").iterdir())  # nothing submitted, no run folder left

    done, out = sbatch_wait(slurm, tmp_path, f"exec {sys.executable} -m launcher --slurm --ps 2 -- true",
                            "--nodes=2", f"--export=ALL,PYTHONPATH={ROOT}")
    assert done.returncode != 0
    errors = [line for line in out.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("tflaunch: error: --slurm --ps 2 (job ")
    assert "need 4 task slots" in errors[0] and "2 task slots on" in errors[0]


def test_a_run_is_one_job_step_with_one_agent_per_node(slurm, tmp_path):
    done, run_dir = submit(slurm, tmp_path, "--nodes", "2", "--ntasks-per-node", "4", "--", "sh", "-c",
                           "echo up on $SLURMD_NODENAME; exec sleep 60")
    assert done.returncode == 0, done.stderr
    wait_for(lambda: (run_dir / "run.json").exists() and len(record(run_dir)["tasks"]) == 8
             and all(t["state"] == "running" and t["pid"] for t in record(run_dir)["tasks"]), timeout=120,
             message="every task running")
    steps = slurm.run("squeue", "-s", "-h", "-j", job_id_of(run_dir), "-o", "%i %j %N").stdout.split("\n")
    named = sorted(line.split()[1] for line in steps if line.strip())
    assert named == ["batch", "tflaunch-agents"], steps  # one step for all 8 tasks, beside the batch step
    agents = [line for line in steps if "tflaunch-agents" in line]
    assert len(agents) == 1 and agents[0].split()[2] == f"{slurm.nodes[0].rsplit('-', 1)[0]}-[1-2]", agents
    # The agents sample their tasks: the run's resource figures cover both nodes' tasks.
    wait_for(lambda: len(json.loads((run_dir / "resources.json").read_text()).get("tasks", {})) == 8
             if (run_dir / "resources.json").exists() else False, timeout=120,
             message="resource figures of all 8 tasks")
    slurm.run("scancel", job_id_of(run_dir))
    slurm.wait_idle(timeout=40)
