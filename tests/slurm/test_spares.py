"""Nodes lost for good inside a Slurm job, on a real Slurm: a spare node stands in, or the cluster shrinks.

Each run is a job allocated with --no-kill (a failed node does not end it) whose tflaunch --slurm
runs light tasks; one task node dies mid-run (testslurm kill-node, always revived) and the next
attempt must run without it. Each pytest-xdist worker has clusters of its own; the tests of the
three-node cluster share one worker, so that only one such cluster comes up. A node whose agent went silent is lost after 5 s (--keepalive-timeout), not 15.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from polling import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

# Attempt 1 runs until stopped; later attempts end at once: the run succeeds once an attempt runs
# without the dead node.
TASK_CODE = ("import os, socket, time; print('on', socket.gethostname(), 'attempt', os.environ['TFLAUNCH_ATTEMPT'], "
             "os.environ['TF_CONFIG'], flush=True); time.sleep(3600 if os.environ['TFLAUNCH_ATTEMPT'] == '1' else 1)")


def start_job(cluster, tmp_path: Path, nodes: int, *run_options: str) -> tuple[str, Path]:
    """sbatch a --no-kill job whose batch shell is 'tflaunch --slurm'; (job id, its output file)."""
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\nexec {sys.executable} -m launcher --slurm {' '.join(run_options)} "
                      f"--max-restarts 2 --restart-delay 0 --keepalive-timeout 5 --log-dir {tmp_path}/logs -- python -c \"{TASK_CODE}\"\n")
    out = tmp_path / "job.out"
    done = cluster.run("sbatch", "--parsable", "--no-kill", f"--nodes={nodes}", "--ntasks-per-node=1",
                       f"--output={out}", f"--chdir={tmp_path}", f"--export=ALL,PYTHONPATH={ROOT}", str(script))
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0], out


def run_record(tmp_path: Path) -> dict | None:
    found = list((tmp_path / "logs").glob("*/run.json"))
    return json.loads(found[0].read_text()) if found else None


def kill_mid_run(cluster, tmp_path: Path, job: str, node: str, tasks: int) -> dict:
    """Once every task runs, ``node`` dies; the run's final record once the job has ended."""
    wait_for(lambda: (rec := run_record(tmp_path)) and len(rec["tasks"]) == tasks
             and all(t["state"] == "running" for t in rec["tasks"]), timeout=120, message="every task running")
    try:
        cluster.kill_node(node)
        wait_for(lambda: not any(j[0] == job for j in cluster.jobs()), timeout=150, message="the job to end")
    finally:
        cluster.revive(node)
    return run_record(tmp_path)


@pytest.mark.xdist_group("slurm3")  # one worker brings the three-node cluster up
def test_a_node_that_dies_is_left_out_and_its_task_moves_to_the_spare_node(slurm3, tmp_path):
    first, dying, spare = slurm3.nodes
    job, out = start_job(slurm3, tmp_path, 3, "--spares 1")
    rec = kill_mid_run(slurm3, tmp_path, job, dying, tasks=2)
    console = out.read_text()
    assert rec["status"] == "succeeded" and rec["exit_code"] == 0, console
    lines = [line for line in console.splitlines() if line.startswith(f"tflaunch: {dying} lost (")]
    assert len(lines) == 1 and lines[0].endswith(f"; attempt 2 runs worker-1 on spare {spare}"), console
    assert [a["hosts"] for a in rec["attempts"]] == [{"worker-0": first, "worker-1": dying},
                                                     {"worker-0": first, "worker-1": spare}]
    assert [(e["host"], e["attempt"]) for e in rec["excluded"]] == [(dying, 2)]
    assert f"on {spare} attempt 2" in console and f"on {dying} attempt 2" not in console


def test_with_no_spare_the_run_shrinks_to_min_workers_on_the_node_left(slurm, tmp_path):
    first, dying = slurm.nodes
    job, out = start_job(slurm, tmp_path, 2, "--min-workers 1")
    rec = kill_mid_run(slurm, tmp_path, job, dying, tasks=2)
    console = out.read_text()
    assert rec["status"] == "succeeded" and rec["exit_code"] == 0, console
    lines = [line for line in console.splitlines() if line.startswith(f"tflaunch: {dying} lost (")]
    assert len(lines) == 1 and lines[0].endswith("; attempt 2 runs without worker-1 (1 training task, min_workers 1)")
    assert [a["hosts"] for a in rec["attempts"]] == [{"worker-0": first, "worker-1": dying}, {"worker-0": first}]
    shrunk = [line for line in console.splitlines() if f"on {first} attempt 2 " in line]
    assert len(shrunk) == 1 and len(json.loads(shrunk[0].split(" attempt 2 ", 1)[1])["cluster"]["worker"]) == 1


@pytest.mark.xdist_group("slurm3")  # one worker brings the three-node cluster up
def test_submit_spares_asks_for_one_more_node_and_the_run_holds_it_back(slurm3, tmp_path):
    first, second, spare = slurm3.nodes
    # Attempt 1's worker-1 fails the machine's way (a full disk): its node is left out where a spare
    # allows, so attempt 2 shows the spare the run held back, without a node having to die.
    code = ("import os, socket, sys; print('on', socket.gethostname(), 'attempt', os.environ['TFLAUNCH_ATTEMPT'], "
            "flush=True); os.environ['TFLAUNCH_ATTEMPT'] + os.environ['TFLAUNCH_TASK'] == '1worker-1' and "
            "sys.exit(\"OSError: [Errno 28] No space left on device: '/scratch/ckpt'\")")
    done = subprocess.run([sys.executable, "-m", "launcher", "submit", "--nodes", "2", "--spares", "1",
                           "--max-restarts", "1", "--restart-delay", "0", "--log-dir", str(tmp_path / "logs"),
                           "--wait", "--",
                           "python", "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=240,
                          env={**slurm3.env, "PYTHONPATH": str(ROOT)}, stdin=subprocess.DEVNULL)
    assert "run folder " in done.stdout, done.stderr
    run_dir = Path(done.stdout.split("run folder ", 1)[1].split()[0])
    job = json.loads((run_dir / "slurm.json").read_text())["job_id"]
    console = (run_dir / f"slurm-{job}.out").read_text()
    assert done.returncode == 0, done.stderr + console
    script = (run_dir / "job.sbatch").read_text()
    assert "#SBATCH --nodes=3 " in script and "#SBATCH --no-kill " in script and " --slurm --spares 1 " in script
    shown = slurm3.run("scontrol", "--oneliner", "show", "job", job).stdout
    assert " NumNodes=3 " in shown, shown  # Slurm gave the job the spare node too
    rec = json.loads((run_dir / "run.json").read_text())
    assert [a["hosts"] for a in rec["attempts"]] == [{"worker-0": first, "worker-1": second},
                                                     {"worker-0": first, "worker-1": spare}], console
    assert f"attempt 2 runs worker-1 on spare {spare}" in console


def test_a_bad_spares_count_is_one_line_with_exit_code_2(slurm, tmp_path):
    words = subprocess.run([sys.executable, "-m", "launcher", "--slurm", "--spares", "node3", "--", "true"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                           env={**slurm.env, "PYTHONPATH": str(ROOT)})
    assert words.returncode == 2 and words.stderr == (
        "tflaunch: error: --spares: with --slurm, expected a number of nodes K >= 1 to hold back as spares, "
        "got 'node3'\n")
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\nexec {sys.executable} -m launcher --slurm --spares 2 -- true\n")
    out = tmp_path / "job.out"
    done = slurm.run("sbatch", "--wait", "--nodes=2", f"--output={out}", f"--chdir={tmp_path}",
                     f"--export=ALL,PYTHONPATH={ROOT}", str(script), timeout=120)
    assert done.returncode != 0
    errors = [line for line in out.read_text().splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("tflaunch: error: --slurm --spares 2 (job "), errors
    assert "--spares: 2 would hold back every node of job " in errors[0] and "expected at most 1" in errors[0]
