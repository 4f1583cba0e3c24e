"""``tflaunch submit``: a new run folder, the sbatch script in it, ``sbatch``, and optionally the wait.

The folder exists before the job runs, so ``tflaunch runs`` lists the job while it is pending
(``slurm.json`` holds its id); inside the job ``tflaunch --slurm --run-dir`` writes the run there.

``--env KEY=VALUE`` is written into the script for the job's tflaunch. ``--env KEY`` (by name) is
written as the name alone: its value reaches the job in the environment sbatch passes on
(``--export``, ALL unless said otherwise), never in the script. So a by-name variable must be set
here and passed by the job's ``--export``, and a variable whose name marks a secret must be passed
by name: its value would otherwise be written into the script.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..cluster.reader import load_cluster_file
from ..cluster.spec import value_by_name
from ..masking import is_secret_name
from ..errors import ConfigError
from ..units import group_id
from ..records.files import write_atomically
from ..records.folder import DEFAULT_LOG_DIR, RUN_ID_PLACEHOLDER, SBATCH_SCRIPT, RunFolder, iso_time
from ..records.slurm import write_slurm_record
from ..records.states import RunStatus, plural
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
    log_group: str | None = None
    argv: tuple[str, ...] = ()
    env: Mapping[str, str | None] = field(default_factory=dict)  # --env: a value, or None (by name)


@dataclass(frozen=True)
class Submitted:
    job_id: str
    run_dir: Path
    script: Path


def job_request(options: SubmitOptions, run_dir: str) -> tuple[JobRequest, str, str | None]:
    """The validated request, the log directory and the group run folders are shared with (None:
    nobody); ConfigError (exit 2) names the bad option."""
    settings, log_dir, cluster_file, log_group = SlurmSettings(), options.log_dir, None, options.log_group
    if options.cluster_file:
        cluster_file = os.path.abspath(options.cluster_file)
        spec = load_cluster_file(options.cluster_file, frozenset(), slurm_template=True)
        if spec.tasks:
            raise ConfigError(options.cluster_file, spec.tasks[0].role, "'tflaunch submit' takes the roles from "
                              "the allocation; remove the role lists and use the 'slurm:' section")
        settings = read_slurm_section(options.cluster_file, spec.slurm)
        log_dir = log_dir or spec.log_dir
        if log_group is None and spec.log_group is not None:
            log_group = spec.log_group
            try:
                group_id(log_group)
            except ValueError as exc:
                raise ConfigError(options.cluster_file, "log_group", str(exc)) from None
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
                         (settings.ntasks_per_node or 1,) * settings.nodes, nodelist=plural(settings.nodes, "node"))
    carve_roles(planned, chief=settings.chief, ps=settings.ps, evaluator=settings.evaluator, source=source)
    workdir = os.getcwd()
    log_dir_key = ("submit", "--log-dir") if options.log_dir else (source, "log_dir")
    for where, what, path in (("submit", "the working directory", workdir), (*log_dir_key, log_dir),
                              ("submit", "the run folder", run_dir)):
        problem = script_text_problem(path)
        if problem:
            raise ConfigError(where, what, problem)
    env_options = job_env_options(options.env, settings.sbatch_options, os.environ)
    request = JobRequest(run_dir=run_dir, workdir=workdir, python=sys.executable, settings=settings,
                         cluster_file=cluster_file, command=options.command,
                         run_options=(*options.run_options, *env_options), submitted_argv=options.argv)
    return request, log_dir or DEFAULT_LOG_DIR, log_group


def job_env_options(env: Mapping[str, str | None], sbatch_options: Sequence[str],
                    environ: Mapping[str, str]) -> list[str]:
    """The job's ``--env`` options: ``KEY=VALUE`` as given, ``KEY`` alone for a variable passed by
    name, which must be set in ``environ`` and passed on by sbatch (see the module docstring)."""
    exports = [option for option in sbatch_options if option.startswith("--export=")]
    if exports:  # sbatch's last --export wins
        said = exports[-1]
    else:  # else SBATCH_EXPORT in this environment, else ALL
        said = f"SBATCH_EXPORT={environ['SBATCH_EXPORT']}" if "SBATCH_EXPORT" in environ else "--export=ALL"
    export = said.split("=", 1)[1].split(",")
    words: list[str] = []
    for name, value in env.items():
        key = f"--env {name}"
        if value is None:
            value_by_name(name, environ, "submit", key)
            if not {"ALL", name} & set(export):
                raise ConfigError("submit", key, f"is passed by name, but {said} keeps {name} from the job; pass "
                                  f"it on with --export=ALL or an --export list that names {name}")
            words += ["--env", name]
            continue
        if is_secret_name(name):
            raise ConfigError("submit", key, f"its name marks a secret, whose value would be written into "
                              f"{SBATCH_SCRIPT}; set {name} here and pass it by name: --env {name}")
        problem = script_text_problem(value)
        if problem:
            raise ConfigError("submit", key, problem)
        words += ["--env", f"{name}={value}"]
    return words


def dry_run(options: SubmitOptions) -> str:
    """The script submit would write, with a stand-in run folder."""
    _, log_dir, _ = job_request(options, "")
    request, _, _ = job_request(options, str(Path(log_dir).resolve() / RUN_ID_PLACEHOLDER))
    return render_script(request)


def submit(options: SubmitOptions, wait: bool, on_submitted: Callable[[Submitted], None]) -> int:
    """Write the script into a new run folder and submit it; with ``wait``, the cluster's exit code."""
    _, log_dir, log_group = job_request(options, "")
    folder = RunFolder.create(log_dir, options.cluster_file or "submit", group=log_group)
    run_dir = folder.path.resolve()
    request, _, _ = job_request(options, str(run_dir))
    script = run_dir / SBATCH_SCRIPT
    write_atomically(script, render_script(request))
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
                                 "nodes": request.settings.nodes, "spares": request.settings.spares,
                                 "ntasks_per_node": request.settings.ntasks_per_node or 1,
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
