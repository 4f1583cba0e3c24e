"""The cluster as plain shell commands, one per task, to paste on each task's machine.

For machines where nothing can be installed: each line is ``[cd WORKDIR &&] [setup &&] env VAR=...
COMMAND``, with the env the plan gives that task, exactly what ``tflaunch run`` would start but
without supervision. Every value is quoted with ``shlex.quote``; only ``setup`` is shell, as in a run;
the comments escape what they show (:func:`.manifest.comment`). A variable passed by name, or whose
name marks a secret, is written as ``KEY="$KEY"``: the value comes from the shell that runs the
line, never from this text.

Nothing of this machine goes into another machine's line: where the cluster file names no
``workdir`` or ``python``, a line for another host runs in the folder it is started in, with that
host's own ``python3`` (its venv, when one is active), and the run folder's paths
(``TFLAUNCH_CHECKPOINT_DIR``) are relative to that folder. This machine's lines run in this
machine's working folder with tflaunch's interpreter, as a run would.
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping

from ..cluster.plan import RunContext, plan_cluster
from ..cluster.spec import AUTO, ClusterSpec, EnvLayer, SshSettings, is_local
from .manifest import comment
from .pods import NO_RUN_FOLDER_ENV
from ..records.folder import DEFAULT_LOG_DIR
from ..records.states import plural

FIRST_PORT = 2222
REMOTE_PYTHON = "python3"  # another host's own interpreter, found on its PATH: every Python install has python3


@dataclass(frozen=True)
class ShellExport:
    text: str
    notes: tuple[str, ...]


def shell_commands(spec: ClusterSpec, name: str, *, local_hosts: frozenset[str], cores_by_host: Mapping[str, int],
                   command: tuple[str, ...] | None, override_env: EnvLayer | None = None,
                   this_python: str = sys.executable, this_workdir: str | None = None) -> ShellExport:
    """One commented shell line per task, in TF_CONFIG's order. ``this_python`` and ``this_workdir``
    (default: the current folder) are this machine's lines' defaults; other hosts' are their own."""
    spec, notes = _fixed_ports(spec, local_hosts)
    spec, elsewhere = _own_defaults(spec, local_hosts, this_workdir or os.getcwd())
    # Run-folder paths (TFLAUNCH_CHECKPOINT_DIR) go where a run's folder would, relative to each
    # line's folder: a run expects every host to share it.
    run_dir = str(Path(spec.log_dir or DEFAULT_LOG_DIR, name))
    plan = plan_cluster(spec, RunContext(run_id=name, run_dir=run_dir), local_hosts=local_hosts,
                        cores_by_host=cores_by_host, default_python=this_python, default_workdir="",
                        command=command, override_env=override_env, pass_values=False)
    lines = [comment(f"{plural(len(plan.launches), 'task')}; run each command on the machine named above it, all at "
                     "about the same time.")]
    if elsewhere:
        lines.append(comment(f"On {', '.join(elsewhere)}: '{REMOTE_PYTHON}' is that host's own (activate its venv "
                             "first), and a line without 'cd' runs in the folder you start it in."))
    hidden: set[str] = set()
    for launch in plan.launches:
        env = {k: v for k, v in launch.env.items() if k not in NO_RUN_FOLDER_ENV}
        steps = [f"cd -- {shlex.quote(launch.workdir)}"] if launch.workdir else []
        if launch.setup and not launch.local:
            steps.append(launch.setup)
        # A hidden variable is the shell's own "$KEY" on that machine: its value is written nowhere.
        assignments = [f'{k}="${k}"' if k in launch.hidden else shlex.quote(f"{k}={v}") for k, v in env.items()]
        steps.append(" ".join(["env", *assignments, shlex.join(launch.argv)]))
        hidden.update(k for k in env if k in launch.hidden)
        where = "this machine" if launch.local else launch.host
        lines += ["", comment(f"{launch.name} on {where} (listens on {launch.address})"), " && ".join(steps)]
    if spec.ssh != SshSettings() or any(h.ssh != SshSettings() for h in spec.hosts.values()):
        notes.append("ssh: not used; you start each command on its machine yourself")
    if spec.max_restarts:
        notes.append("max_restarts: not used; nothing supervises or restarts these commands")
    if hidden:
        names = sorted(hidden)
        notes.append(f"secret: {', '.join(names)}: written as \"$NAME\" (the values are not written here); set "
                     "them in the shell of each machine before running its command")
    return ShellExport("\n".join(lines) + "\n", tuple(notes) + plan.notes)


def _own_defaults(spec: ClusterSpec, local_hosts: frozenset[str], this_workdir: str) -> tuple[ClusterSpec, list[str]]:
    """``spec`` with each task's folder and interpreter where the file gives none: this machine's
    folder for its tasks; ``python3`` for other hosts' tasks, whose lines then run where they are
    started. Also the hosts whose lines rely on that, for the comment that says so."""
    tasks, elsewhere = [], []
    for task in spec.tasks:
        host = spec.hosts.get(task.host)
        workdir = task.workdir or (host and host.workdir) or spec.workdir
        python = task.python or (host and host.python) or spec.python
        if is_local(task.host, local_hosts):
            task = replace(task, workdir=workdir or this_workdir)
        else:
            task = replace(task, python=python or REMOTE_PYTHON)
            if not (workdir and python) and task.host not in elsewhere:
                elsewhere.append(task.host)
        tasks.append(task)
    return replace(spec, tasks=tuple(tasks)), elsewhere


def _fixed_ports(spec: ClusterSpec, local_hosts: frozenset[str]) -> tuple[ClusterSpec, list[str]]:
    """``auto`` ports become fixed ones, from 2222 up on each machine, skipping ports the file names."""
    machine = {t.name: "localhost" if is_local(t.host, local_hosts) else t.host for t in spec.tasks}
    taken = {(machine[t.name], t.port) for t in spec.tasks if t.port != AUTO}
    chosen: dict[str, int] = {}
    for task in spec.tasks:
        if task.port == AUTO:
            port = FIRST_PORT
            while (machine[task.name], port) in taken:
                port += 1
            taken.add((machine[task.name], port))
            chosen[task.name] = port
    if not chosen:
        return spec, []
    listing = ", ".join(f"{name} {port}" for name, port in chosen.items())
    note = f"port: 'auto' needs tflaunch to pick free ports at launch; fixed ports instead: {listing}"
    return spec.with_ports(chosen), [note]
