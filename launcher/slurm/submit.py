"""``tflaunch submit``: a new run folder, the sbatch script in it, ``sbatch``, and optionally the wait.

The folder exists before the job runs, so ``tflaunch runs`` lists the job while it is pending
(``slurm.json`` holds its id); inside the job ``tflaunch --slurm --run-dir`` writes the run there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from ..cluster.reader import load_cluster_file
from ..errors import ConfigError
from ..records.folder import DEFAULT_LOG_DIR, RUN_ID_PLACEHOLDER, SBATCH_SCRIPT, RunFolder, iso_time
from ..records.slurm import write_slurm_record
from ..records.states import RunStatus
from .allocation import Allocation, carve_roles
from .commands import SlurmError, is_user_mistake, last_line
from .script import JobRequest, render_script
from .section import SCRIPT_TEXT_OPTIONS, SlurmSettings, read_slurm_section, script_text_problem


@dataclass(frozen=True)
class SubmitOptions:
    """What ``tflaunch submit`` was given on the command line (None: the file's value, else the default)."""

    cluster_file: str | None = None
    overrides: dict | None = None  # SlurmSettings fields given as options
    command: tuple[str, ...] = ()
    run_options: tuple[str, ...] = ()
    log_dir: str | None = None
    argv: tuple[str, ...] = ()


@dataclass(frozen=True)
class Submitted:
    job_id: str
    run_dir: Path
    script: Path


def job_request(options: SubmitOptions, run_dir: str) -> tuple[JobRequest, str]:
    """The validated request and the log directory; ConfigError (exit 2) names the bad option."""
    settings, log_dir, cluster_file = SlurmSettings(), options.log_dir, None
    if options.cluster_file:
        cluster_file = os.path.abspath(options.cluster_file)
        spec = load_cluster_file(options.cluster_file, frozenset(), slurm_template=True)
        if spec.tasks:
            raise ConfigError(options.cluster_file, spec.tasks[0].role, "'tflaunch submit' takes the roles from "
                              "the allocation; remove the role lists and use the 'slurm:' section")
        settings = read_slurm_section(options.cluster_file, spec.slurm)
        log_dir = log_dir or spec.log_dir
    given = {k: v for k, v in (options.overrides or {}).items() if v not in (None, (), False)}
    for name, option in SCRIPT_TEXT_OPTIONS.items():
        problem = script_text_problem(given.get(name))
        if problem:
            raise ConfigError("submit", option, problem)
    settings = replace(settings, **given)
    source = options.cluster_file or "submit"
    if settings.nodes is None:
        raise ConfigError(source, "--nodes", "missing; expected the number of nodes to allocate "
                          "(or 'slurm: {nodes: N}' in the cluster file)")
    # The same role rule as inside the job, on the allocation this request asks for.
    planned = Allocation("(to be submitted)", tuple(f"node{i}" for i in range(settings.nodes)),
                         (settings.ntasks_per_node or 1,) * settings.nodes, nodelist=f"{settings.nodes} nodes")
    carve_roles(planned, chief=settings.chief, ps=settings.ps, evaluator=settings.evaluator, source=source)
    workdir = os.getcwd()
    log_dir_key = ("submit", "--log-dir") if options.log_dir else (source, "log_dir")
    for where, what, path in (("submit", "the working directory", workdir), (*log_dir_key, log_dir),
                              ("submit", "the run folder", run_dir)):
        problem = script_text_problem(path)
        if problem:
            raise ConfigError(where, what, problem)
    request = JobRequest(run_dir=run_dir, workdir=workdir, python=sys.executable, settings=settings,
                         cluster_file=cluster_file, command=options.command, run_options=options.run_options,
                         submitted_argv=options.argv)
    return request, log_dir or DEFAULT_LOG_DIR


def dry_run(options: SubmitOptions) -> str:
    """The script submit would write, with a stand-in run folder."""
    _, log_dir = job_request(options, "")
    request, _ = job_request(options, str(Path(log_dir).resolve() / RUN_ID_PLACEHOLDER))
    return render_script(request)


def submit(options: SubmitOptions, wait: bool, on_submitted: Callable[[Submitted], None]) -> int:
    """Write the script into a new run folder and submit it; with ``wait``, the cluster's exit code."""
    _, log_dir = job_request(options, "")
    folder = RunFolder.create(log_dir, options.cluster_file or "submit")
    run_dir = folder.path.resolve()
    request, _ = job_request(options, str(run_dir))
    script = run_dir / SBATCH_SCRIPT
    script.write_text(render_script(request))
    script.chmod(0o755)
    if shutil.which("sbatch") is None:
        shutil.rmtree(run_dir)
        raise SlurmError("submit: 'sbatch' is not installed here (is this a Slurm login node?)")
    argv = ["sbatch", "--parsable", *(["--wait"] if wait else []), str(script)]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline().strip() if proc.stdout else ""
    job_id = first.split(";", 1)[0]
    if not job_id.isdigit():
        _, err = proc.communicate(timeout=60)
        shutil.rmtree(run_dir)  # nothing was submitted: leave no empty run behind
        message = last_line(err) or f"sbatch exited with {proc.returncode}"
        raise SlurmError(f"submit: {message}", exit_code=2 if is_user_mistake(err) else 1)
    write_slurm_record(run_dir, {"job_id": job_id, "script": str(script), "submitted_at": iso_time(time.time()),
                                 "nodes": request.settings.nodes, "ntasks_per_node": request.settings.ntasks_per_node or 1,
                                 "partition": request.settings.partition, "requeue": request.settings.requeue})
    on_submitted(Submitted(job_id, run_dir, script))
    if not wait:
        proc.stdout.close()
        proc.stderr.close()
        proc.wait(timeout=60)
        return 0
    _, err = proc.communicate()
    return cluster_exit_code(run_dir, proc.returncode)


def cluster_exit_code(run_dir: Path, sbatch_code: int) -> int:
    """The exit code the cluster's run recorded; sbatch's (the job's) when the run recorded none."""
    try:
        record = json.loads(RunFolder(run_dir).record_path.read_text())
    except (OSError, ValueError):
        return sbatch_code
    code = record.get("exit_code")
    if record.get("status") == RunStatus.RUNNING or code is None:
        return sbatch_code
    return int(code)
