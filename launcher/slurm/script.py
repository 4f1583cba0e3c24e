"""The sbatch script ``tflaunch submit`` writes: readable, every ``#SBATCH`` line saying what it asks for.

Pure: a :class:`JobRequest` in, the script's text out. The script ``exec``s tflaunch so that
tflaunch *is* the batch shell: Slurm's ``--signal=B:USR1@S`` then reaches it at once (bash would
run a trap only after its foreground command ended).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from ..masking import masked_argv
from ..records.folder import BACKUP, RECORD, SLURM_OUTPUT
from .section import SlurmSettings


@dataclass(frozen=True)
class JobRequest:
    """Everything the script needs: the allocation to ask for and the tflaunch command to run in it."""

    run_dir: str  # absolute
    workdir: str  # absolute; the job starts here
    python: str  # the interpreter that runs tflaunch in the job
    settings: SlurmSettings
    cluster_file: str | None = None  # absolute
    command: tuple[str, ...] = ()  # after --
    run_options: tuple[str, ...] = ()  # passed on to 'tflaunch --slurm' (--max-restarts 2, --grace 10, ...)
    submitted_argv: tuple[str, ...] = field(default=())  # how the user called submit, for the header

    @property
    def job_name(self) -> str:
        return f"tflaunch-{self.run_dir.rstrip('/').rsplit('/', 1)[-1]}"


def sbatch_lines(request: JobRequest) -> list[tuple[str, str]]:
    """(``#SBATCH`` option, what it is for) in the order the script lists them."""
    s = request.settings
    lines = [(f"--job-name={request.job_name}", "the name squeue and sacct show"),
             (f"--nodes={(s.nodes or 0) + s.spares}",
              f"nodes to allocate: {s.nodes} for the tasks, {s.spares} spare{'s' if s.spares > 1 else ''}"
              if s.spares else "nodes to allocate"),
             (f"--ntasks-per-node={s.ntasks_per_node or 1}", "task slots per node: one TensorFlow task each")]
    if s.spares:
        lines.append(("--no-kill", "a failed node does not end the job: a spare stands in at the next restart"))
    if s.partition:
        lines.append((f"--partition={s.partition}", "partition (queue) to run in"))
    if s.time:
        lines.append((f"--time={s.time}", "time limit"))
    if s.account:
        lines.append((f"--account={s.account}", "account charged for the job"))
    if s.gpus_per_task:
        lines.append((f"--gpus-per-task={s.gpus_per_task}", "GPUs Slurm binds to each task (CUDA_VISIBLE_DEVICES)"))
    lines += [(f"--chdir={request.workdir}", "tasks start where 'tflaunch submit' ran"),
              (f"--output={request.run_dir}/{SLURM_OUTPUT}", "tflaunch's own console output, in the run folder")]
    if s.requeue:
        lines += [(f"--signal=B:USR1@{s.warning_seconds}",
                   f"warn tflaunch (the batch shell) {s.warning_seconds} s before the end; it saves and requeues"),
                  ("--requeue", "the job may be requeued; it resumes from the run folder's backup"),
                  ("--open-mode=append", "a requeued job appends to its output instead of truncating it")]
    lines += [(option, "from --sbatch-option / slurm.sbatch_options") for option in s.sbatch_options]
    return lines


def tflaunch_argv(request: JobRequest) -> list[str]:
    """The command the job runs: ``tflaunch --slurm`` with the roles, the run folder and the options."""
    s = request.settings
    argv = [request.python, "-m", "launcher", "run", "--slurm"]
    if request.cluster_file:
        argv.append(request.cluster_file)
    if s.chief:
        argv.append("--chief")
    if s.ps:
        argv += ["--ps", str(s.ps)]
    if s.evaluator:
        argv.append("--evaluator")
    if s.spares:
        argv += ["--spares", str(s.spares)]
    if s.requeue:
        argv.append("--requeue")
    argv += ["--run-dir", request.run_dir, *request.run_options]
    if request.command:
        argv += ["--", *request.command]
    return argv


def render_script(request: JobRequest) -> str:
    width = max(len(option) for option, _ in sbatch_lines(request)) + len("#SBATCH ") + 2
    out = ["#!/bin/bash",
           # One line: sbatch stops reading #SBATCH lines at the first line that is not a comment.
           # Masked: a secret typed on submit's command line is not repeated here (the exec line below
           # holds only what the job must run).
           "# Written by 'tflaunch submit'" + (f": {_one_line(shlex.join(masked_argv(request.submitted_argv)))}"
                                               if request.submitted_argv else ""),
           f"# Run folder: {request.run_dir} ({RECORD}, logs, {BACKUP}/ of this job)",
           "#"]
    out += [f"{('#SBATCH ' + option).ljust(width)}# {why}" for option, why in sbatch_lines(request)]
    out += ["",
            "# tflaunch starts one srun step, whose agent on each node starts that node's tasks (roles: chief",
            "# on the first slot, ps next, evaluator last, workers the rest), and supervises them.",
            "# exec: tflaunch replaces this shell, so Slurm's signals reach it directly and its exit code",
            "# is the job's.",
            f"exec {shlex.join(tflaunch_argv(request))}",
            ""]
    return "\n".join(out)


def _one_line(text: str) -> str:
    return text.replace("\r", "\\r").replace("\n", "\\n")
