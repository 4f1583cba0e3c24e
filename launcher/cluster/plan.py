"""The launch plan: a validated cluster spec turned into one :class:`TaskLaunch` per task.

``plan_cluster`` is a pure function of its arguments: no processes, no environment reads. The
environment each task gets is layered, later layers winning:

1. the environment tflaunch itself runs with (local tasks) or the login environment (ssh tasks);
2. tflaunch's defaults: ``PYTHONUNBUFFERED=1``, thread limits for tasks that share a host's cores,
   ``TF_FORCE_GPU_ALLOW_GROWTH=true`` for tasks that share a GPU, ``TF_USE_LEGACY_KERAS=1`` for
   multi-task clusters, ``TFLAUNCH_BACKUP_DIR=<run folder>/backup`` when restarts are allowed,
   ``TFLAUNCH_CHECKPOINT_DIR=<run folder>/checkpoints`` when there is an evaluator (the trainer's
   chief writes per-epoch checkpoints there and its evaluator reads them),
   ``TFLAUNCH_TENSORBOARD_DIR=<run folder>/tensorboard`` always (where TensorBoard scalars go, so
   ``tflaunch tensorboard`` finds them);
   a default that is already set in tflaunch's own environment keeps the user's value instead,
   for every task (remote ones get it passed along);
3. the cluster's ``env``; 4. the host's ``env`` (``hosts:`` section); 5. the task's ``env``;
6. ``--env KEY=VALUE`` from the command line;
   a variable of layers 3-6 given by name (no value) takes its value from tflaunch's own
   environment, and is hidden with every variable whose name marks a secret: the launch keeps
   the value for the task and the names in ``hidden`` (see :mod:`.spec` for the rule);
7. what tflaunch owns and nobody overrides: ``TF_CONFIG`` (the evaluator is in its own only, see
   ``task_cluster``; kept in parts, see below), ``CUDA_VISIBLE_DEVICES``
   (and ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` with it), ``TFLAUNCH_TASK``, ``TFLAUNCH_RUN_ID``,
   ``TFLAUNCH_RUN_DIR``, ``TFLAUNCH_ATTEMPT``, and the rank variables of :mod:`.ranks`
   (``TFLAUNCH_RANK``, ``TFLAUNCH_WORLD_SIZE``, ``TFLAUNCH_LOCAL_RANK``, ``TFLAUNCH_LOCAL_WORLD_SIZE``).

Thread rule: when ``n`` tasks share a host with ``c`` known cores, each gets
``TF_NUM_INTRAOP_THREADS = OMP_NUM_THREADS = max(1, c // n)`` and ``TF_NUM_INTEROP_THREADS = 2``
(with a single inter-op thread ParameterServerStrategy's coordinator deadlocks; two idle ones cost
nothing). ``threads: N`` sets N intra-op threads for every task, ``threads: off`` sets nothing, and
any of these variables in a user ``env`` wins.

TF_CONFIG names every task, so a cluster's TF_CONFIGs kept as text grow with the square of its
size: a launch keeps its TF_CONFIG in parts instead (:mod:`.tfconfig`), the cluster's JSON text
made once per plan and shared by every launch. A TF_CONFIG longer than Linux lets one environment
variable be is refused when the cluster is planned.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Mapping

from ..records.folder import CHECKPOINTS, TENSORBOARD
from ..taskenv import ATTEMPT, BACKUP_DIR, CHECKPOINT_DIR, RUN_DIR, RUN_ID, TASK, TENSORBOARD_DIR
from .spec import (AUTO, DEFAULT_CONNECT_TIMEOUT, OTHER_HOSTS_ONLY, ROLES, ClusterSpec, EnvLayer, SshSettings, TaskSpec,
                   hidden_names, is_local, masked_env, value_by_name)
from .commands import LEGACY_KERAS_NOTE, ScriptText, runs_python
from .ranks import TRAINING_ROLES, rank_env
from .tfconfig import TaskEnv, TfConfig, check_tf_config_size
from .spec import Role

DEFAULT_COMMAND = ("python", "-m", "trainer")
PYTHON_NAMES = ("python", "python3")
THIS_MACHINE = "localhost"  # key for this machine in ``cores_by_host``
INTEROP_THREADS = 2
@dataclass(frozen=True)
class TaskLaunch:
    """Everything needed to start one task on its host."""

    name: str
    role: str
    index: int
    host: str
    address: str  # host:port as the other tasks see it
    local: bool
    argv: tuple[str, ...]
    env: Mapping[str, str]  # only what tflaunch adds to the task's inherited environment
    workdir: str
    setup: str | None = None  # a shell line run before the command (remote activation)
    ssh: SshSettings | None = None  # None for tasks on this machine
    gpus: tuple[int, ...] | None = ()
    python: str = "python3"  # the task's interpreter (also runs tflaunch's remote agent)
    transport: str = "local"  # which launcher.transports module starts it
    env_sources: Mapping[str, str] = field(default_factory=dict)  # variable -> the layer that set it
    hidden: frozenset[str] = frozenset()  # variables whose values are never written or shown (spec.hidden_names)
    attempt: int = 1  # the attempt this launch belongs to (its env says so to the task, as text)
    # Namespace files a task on this machine joins before it starts, its user namespace first: a
    # sealed run's network (launcher/run/checks/isolation.py). Empty: this machine's network.
    netns: tuple[str, ...] = ()
    # What that network lacks, as (why, fix): a sealed run's without outside network, an isolated
    # run's. A diagnosis names it when the task fails of a name or network error. Empty: nothing.
    offline: tuple[str, ...] = ()
    # Seconds between its agent's looks at its threads, for the straggler rule; None: not watched.
    watch_every: float | None = None

    @property
    def connect_timeout(self) -> float:
        """Seconds an ssh connection to its host may take (ssh's ``connect_timeout``, else the default)."""
        return (self.ssh.connect_timeout if self.ssh else None) or DEFAULT_CONNECT_TIMEOUT

    def shown_env(self, tf_cluster: bool = True) -> dict[str, str]:
        """``env`` as run.json, ``--dry-run`` and messages may show it: hidden values masked; without
        ``tf_cluster``, TF_CONFIG without its cluster (for a record that holds the cluster once)."""
        tf_config = self.env.tf_config if isinstance(self.env, TaskEnv) else None
        if tf_cluster or tf_config is None:
            return masked_env(self.env, self.hidden)
        return masked_env(self.env.with_task_text(), self.hidden)


@dataclass(frozen=True)
class RunContext:
    """Facts about this run that end up in every task's environment."""

    run_id: str
    run_dir: str
    attempt: int = 1
    backup_dir: str | None = None  # offered to the trainer as TFLAUNCH_BACKUP_DIR (restarts resume)
    # Seconds between the agents' looks at the training tasks' threads (launcher/run/faults/stragglers.py);
    # None: not watched.
    watch_every: float | None = None


@dataclass(frozen=True)
class Plan:
    launches: tuple[TaskLaunch, ...]
    notes: tuple[str, ...] = field(default=())  # what tflaunch decided on the user's behalf


def plan_cluster(
    spec: ClusterSpec,
    context: RunContext,
    *,
    local_hosts: frozenset[str],
    cores_by_host: Mapping[str, int],
    default_python: str,
    default_workdir: str,
    command: tuple[str, ...] | None = None,
    inherited_env: Mapping[str, str] | None = None,
    override_env: EnvLayer | None = None,
    pass_values: bool = True,
    script_text: ScriptText | None = None,
) -> Plan:
    """One launch record per task, in the order roles appear in TF_CONFIG.

    ``inherited_env`` is the environment tflaunch runs with: a variable set there wins over
    tflaunch's defaults (as torchrun leaves a user's OMP_NUM_THREADS alone) and is passed to every
    task, remote ones too; a variable passed by name takes its value from there. ``override_env``
    (``--env KEY=VALUE``) wins over every ``env`` layer. ``pass_values=False`` (an export, whose
    manifest refers to such a variable instead) leaves a by-name variable's value empty.
    ``script_text`` reads a Python script a task on this machine runs, for the Keras note
    (:mod:`.commands`); without it, every script counts as one that may run Keras.
    """
    inherited_env = inherited_env or {}
    override_env = override_env or {}
    unresolved = [t.key for t in spec.tasks if t.port == AUTO]
    if unresolved:
        raise ValueError(f"ports still 'auto' for {', '.join(unresolved)}; reserve them before planning")
    cluster = tf_cluster(spec)
    cluster_text = cluster_texts(cluster)
    check_tf_config_size(spec, cluster_text)
    argv_template = command or spec.command or DEFAULT_COMMAND
    host_of = {t.name: THIS_MACHINE if is_local(t.host, local_hosts) else t.host for t in spec.tasks}
    per_host: dict[str, int] = {}
    for host in host_of.values():
        per_host[host] = per_host.get(host, 0) + 1
    shared_gpu_tasks = _tasks_sharing_gpus(spec, host_of)
    ranks = rank_env(spec.tasks, host_of)
    legacy_keras = len(spec.tasks) > 1
    has_evaluator = bool(spec.role_tasks(Role.EVALUATOR))
    watch = context.watch_every if spec.synchronous else None  # once: it counts the cluster's tasks

    launches = []
    secrets = _SecretNames()
    # One host's tasks share its ssh settings: made once per host.
    ssh_by_host = {host: spec.ssh.overridden_by(spec.hosts[host].ssh if host in spec.hosts else SshSettings())
                   for host in {t.host for t in spec.tasks}}
    for task in spec.tasks:
        host_settings = spec.hosts.get(task.host)
        host_env = host_settings.env if host_settings else {}
        defaults: dict[str, str] = {"PYTHONUNBUFFERED": "1"}
        defaults.update(thread_env(spec.threads, cores_by_host.get(host_of[task.name]), per_host[host_of[task.name]]))
        if task.name in shared_gpu_tasks:
            defaults["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"
        if legacy_keras:
            defaults["TF_USE_LEGACY_KERAS"] = "1"
        if context.backup_dir:
            defaults[BACKUP_DIR] = context.backup_dir
        if has_evaluator:
            defaults[CHECKPOINT_DIR] = f"{context.run_dir}/{CHECKPOINTS}"
        defaults[TENSORBOARD_DIR] = f"{context.run_dir}/{TENSORBOARD}"
        env, sources = layer_env([
            (DEFAULT_SOURCE, {k: v for k, v in defaults.items() if k not in inherited_env}),
            (INHERITED_SOURCE, {k: inherited_env[k] for k in defaults if k in inherited_env}),
            ("env", spec.env),
            (f"hosts.{task.host}.env", host_env),
            (f"{task.key}.env", task.env),
            ("--env", override_env),
            (OWNED_SOURCE, {**owned_env(task, cluster_text, context), **ranks[task.name]}),
        ])
        by_name = [name for name, value in env.items() if value is None]
        for name in by_name:
            source, key = (("--env", name) if sources[name] == "--env"
                           else (spec.source, f"{sources[name]}.{name}"))
            env[name] = value_by_name(name, inherited_env, source, key) if pass_values else ""
        local = host_of[task.name] == THIS_MACHINE
        python = _first(task.python, host_settings and host_settings.python, spec.python) or default_python
        argv = tuple([python, *argv_template[1:]] if argv_template[0] in PYTHON_NAMES else argv_template)
        launches.append(TaskLaunch(
            name=task.name,
            role=task.role,
            index=task.index,
            host=task.host,
            address=task.tf_address,
            local=local,
            argv=argv,
            env=TaskEnv(env),
            workdir=_first(task.workdir, host_settings and host_settings.workdir, spec.workdir) or default_workdir,
            setup=_first(task.setup, host_settings and host_settings.setup, spec.setup),
            ssh=None if local else ssh_by_host[task.host],
            gpus=task.gpus,
            python=python,
            transport=("local" if local and spec.transport in OTHER_HOSTS_ONLY else spec.transport)
            or ("local" if local else "ssh"),
            env_sources=sources,
            hidden=secrets.secret_names(env) | frozenset(by_name),
            attempt=context.attempt,
            watch_every=watch if task.role in TRAINING_ROLES else None,
        ))
    notes = []
    # The note applies where tflaunch chose legacy Keras for a Python program, not where the user did.
    if any(l.env_sources.get("TF_USE_LEGACY_KERAS") == DEFAULT_SOURCE
           and runs_python(l.argv, l.python, l.workdir, script_text if l.local else None)
           for l in {(l.argv, l.python, l.workdir, l.local): l for l in launches}.values()):
        notes.append(LEGACY_KERAS_NOTE)
    return Plan(tuple(launches), tuple(notes))


class _SecretNames:
    """Which variables of an env mark secrets by their names, looked up once per set of names
    (the tasks of a cluster mostly share theirs)."""

    def __init__(self) -> None:
        self._known: dict[tuple[str, ...], frozenset[str]] = {}

    def secret_names(self, env: Mapping[str, object]) -> frozenset[str]:
        names = tuple(env)
        found = self._known.get(names)
        if found is None:
            found = self._known[names] = hidden_names(env)
        return found


DEFAULT_SOURCE = "tflaunch default"
INHERITED_SOURCE = "tflaunch's environment"
OWNED_SOURCE = "tflaunch"


def layer_env(layers: list[tuple[str, EnvLayer]]) -> tuple[dict[str, str | None], dict[str, str]]:
    """Merge ``(source, env)`` layers, later winning; also say which layer set each variable."""
    env: dict[str, str | None] = {}
    sources: dict[str, str] = {}
    for source, values in layers:
        for key, value in values.items():
            env[key] = value
            sources[key] = source
    return env, sources


def check_cluster_fits(spec: ClusterSpec) -> None:
    """Refuse, before anything starts, a cluster whose TF_CONFIG no task could be given (the check
    :func:`plan_cluster` makes, for a caller that plans only some of the tasks first)."""
    check_tf_config_size(spec, cluster_texts(tf_cluster(spec)))


def tf_cluster(spec: ClusterSpec) -> dict[str, list[str]]:
    """The ``cluster`` part of TF_CONFIG: every role with its tasks' addresses, by index."""
    cluster: dict[str, list[str]] = {}
    for role in ROLES:
        tasks = sorted(spec.role_tasks(role), key=lambda t: t.index)
        if tasks:
            cluster[role] = [t.tf_address for t in tasks]
    return cluster


def task_cluster(role: str, cluster: Mapping[str, list[str]]) -> dict[str, list[str]]:
    """The cluster a task of ``role`` sees in its TF_CONFIG: the evaluator is in its own only.

    A ParameterServerStrategy chief connects to every task its cluster names and waits forever for
    an evaluator, which runs no server (TensorFlow issue 46169); MultiWorkerMirroredStrategy ignores
    the evaluator, and an evaluator needs no server of its own to read checkpoints.
    """
    if role == Role.EVALUATOR:
        return dict(cluster)
    return {r: addresses for r, addresses in cluster.items() if r != Role.EVALUATOR}


def cluster_texts(cluster: Mapping[str, list[str]]) -> dict[bool, str]:
    """The JSON text of the cluster each task sees, built once: ``True`` for the evaluator's own
    (the whole cluster), ``False`` for every other task's (see :func:`task_cluster`)."""
    text = {evaluator: json.dumps(task_cluster(Role.EVALUATOR if evaluator else Role.WORKER, cluster), separators=(",", ":"))
            for evaluator in (False, True)}
    if text[True] == text[False]:
        text[True] = text[False]  # one string for all: every launch shares it
    return text


def owned_env(task: TaskSpec, cluster_text: Mapping[bool, str], context: RunContext) -> dict[str, str | TfConfig]:
    """The variables tflaunch sets for ``task`` and no layer may override (TF_CONFIG in parts)."""
    env: dict[str, str | TfConfig] = {
        "TF_CONFIG": TfConfig(cluster_text[task.role == Role.EVALUATOR], task.role, task.index),
        TASK: task.name,
        RUN_ID: context.run_id,
        RUN_DIR: context.run_dir,
        ATTEMPT: str(context.attempt),
    }
    env.update(gpu_env(task.gpus))
    return env


def gpu_env(gpus: tuple[int, ...] | None) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES for a task's GPU list: "-1" hides every GPU, None leaves all visible."""
    if gpus is None:
        return {}
    if not gpus:
        return {"CUDA_VISIBLE_DEVICES": "-1"}
    # PCI bus order makes the indices mean what nvidia-smi shows, not CUDA's "fastest first".
    return {"CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus)), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def thread_env(threads: int | str, cores: int | None, tasks_on_host: int) -> dict[str, str]:
    """Thread limits for one task (see the module docstring for the rule)."""
    if threads == "off":
        return {}
    if threads == AUTO:
        if cores is None or tasks_on_host <= 1:
            return {}
        threads = max(1, cores // tasks_on_host)
    intra = int(threads)
    return {"TF_NUM_INTRAOP_THREADS": str(intra), "TF_NUM_INTEROP_THREADS": str(INTEROP_THREADS),
            "OMP_NUM_THREADS": str(intra)}


def _tasks_sharing_gpus(spec: ClusterSpec, host_of: Mapping[str, str]) -> set[str]:
    """Names of tasks whose GPUs overlap another task's on the same host (GPUs None: every GPU).

    Counted per host and GPU rather than compared in pairs: a host of a thousand tasks is one pass."""
    by_host: dict[str, list[TaskSpec]] = {}
    for task in spec.tasks:
        if task.gpus != ():
            by_host.setdefault(host_of[task.name], []).append(task)
    sharing: set[str] = set()
    for tasks in by_host.values():
        if len(tasks) < 2:
            continue
        if any(task.gpus is None for task in tasks):
            sharing.update(task.name for task in tasks)  # one sees every GPU: it shares with each of the others
            continue
        count = Counter(gpu for task in tasks for gpu in set(task.gpus))
        sharing.update(task.name for task in tasks if any(count[gpu] > 1 for gpu in task.gpus))
    return sharing


def _first(*values: str | None) -> str | None:
    for value in values:
        if value:
            return value
    return None
