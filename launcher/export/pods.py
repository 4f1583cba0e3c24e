"""The cluster as pods: the planner's env for each role, and what of the file carries over.

Kubernetes runs one pod template per role, so tflaunch plans the cluster once more with every
task on its own pod (its DNS name as host, one fixed port, its GPUs renumbered from 0 as a
container sees them) and takes each role's env from :func:`launcher.cluster.plan.plan_cluster`.
Tasks of one role must then agree on everything but their index; what the file says about
machines (ssh, setup, paths, per-host settings) has no meaning in a pod and is named in a note.

With ``kubernetes.storage``, the plan's run folder is ``<storage path>/<name>`` on that volume, so
the trainer's checkpoints (``TFLAUNCH_CHECKPOINT_DIR``, for an evaluator) and, when pods may
restart, its backup (``TFLAUNCH_BACKUP_DIR``) land where the chief, the workers and the evaluator
all see them and where they outlive a pod.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Callable, Mapping

from ..cluster.plan import DEFAULT_SOURCE, RunContext, TaskLaunch, plan_cluster
from ..records.states import Role
from ..cluster.spec import (ROLES, ClusterSpec, EnvLayer, RestartPolicy, SshSettings, TaskSpec, check_override_env,
                            is_local)
from ..cluster.spec import restarts_possible as spec_restarts_possible
from ..errors import ConfigError
from ..records.folder import BACKUP
from ..records.states import plural
from ..taskenv import ATTEMPT, BACKUP_DIR, CHECKPOINT_DIR, RANK, RUN_DIR, TASK
from .settings import SECTION, KubernetesSettings, Storage

# Variables that differ between the pods of one role: the start command or the operator sets them.
# (Every pod is a host of its own: TFLAUNCH_LOCAL_RANK 0 of TFLAUNCH_LOCAL_WORLD_SIZE 1, as the plan says.)
PER_POD_ENV = ("TF_CONFIG", TASK, ATTEMPT, RANK)
# A pod has no run folder: its output goes to the container log (kubectl logs).
NO_RUN_FOLDER_ENV = (RUN_DIR,)
# Where the plan's run-folder paths (such as TFLAUNCH_CHECKPOINT_DIR) point inside a pod: a
# directory any container user may create, private to the pod.
POD_RUN_DIR = "/tmp/tflaunch/{name}"
# The roles that read or write checkpoints and backups; ps tasks only hold variables in memory.
STORAGE_ROLES = (Role.CHIEF, Role.WORKER, Role.EVALUATOR)
SECRET_SUFFIX = "env"  # the Secret of job NAME is NAME-env: one key per hidden variable


@dataclass(frozen=True)
class RolePods:
    """The pods of one role: the plan of each task, and what their one template holds."""

    role: str
    launches: tuple[TaskLaunch, ...]  # by index
    env: dict[str, str]  # the plan's env every pod of the role shares (per-pod variables left out)
    gpus: int  # nvidia.com/gpu limit per pod
    hidden: frozenset[str] = frozenset()  # variables read from the plan's Secret (see PodPlan.secret_name)
    restart: RestartPolicy = RestartPolicy.CLUSTER  # what a failed pod of the role does (the file's restart_policy)

    @property
    def count(self) -> int:
        return len(self.launches)

    def tf_config(self, index: int) -> dict:
        return json.loads(self.launches[index].env["TF_CONFIG"])

    @property
    def rank_offset(self) -> int | None:
        """The rank of the role's pod 0, every pod's being its index past it; None for a role
        without ranks (ps, evaluator). ValueError when the plan's ranks are not so."""
        if RANK not in self.launches[0].env:
            return None
        offset = int(self.launches[0].env[RANK]) - self.launches[0].index
        for launch in self.launches:
            if launch.env.get(RANK) != str(launch.index + offset):
                raise ValueError(f"the plan's rank of {launch.name} is not its index past {offset}")
        return offset


@dataclass(frozen=True)
class PodPlan:
    name: str
    settings: KubernetesSettings
    roles: tuple[RolePods, ...]  # in TF_CONFIG's role order, only roles the cluster has
    argv: tuple[str, ...]
    notes: tuple[str, ...]
    max_restarts: int = 0  # whole-cluster restarts
    task_restarts: int = 0  # in-place restarts per task of a role whose policy is "task"

    def role(self, role: str) -> RolePods | None:
        return next((r for r in self.roles if r.role == role), None)

    @property
    def secret_name(self) -> str:
        """The Secret the pods read hidden variables from (passed by name, or a secret's name)."""
        return f"{self.name}-{SECRET_SUFFIX}"

    @property
    def hidden(self) -> list[str]:
        return sorted({name for role in self.roles for name in role.hidden})


def plan_pods(spec: ClusterSpec, settings: KubernetesSettings, name: str, command: tuple[str, ...] | None,
              pod_host: Callable[[str, int], str], override_env: EnvLayer | None = None) -> PodPlan:
    """Plan ``spec`` with task ``role``/``index`` on host ``pod_host(role, index)`` and group it by role.

    ``override_env`` is ``--env KEY=VALUE``: it wins over every ``env`` layer, as in a run. A
    variable passed by name, or whose name marks a secret, is never read: the pods take it from the
    plan's Secret (see :func:`secret_note`).
    """
    check_override_env(override_env or {})
    pod_spec = _pod_cluster(spec, settings, pod_host)
    run_dir = pod_run_dir(settings.storage, name)
    backup_dir = f"{run_dir}/{BACKUP}" if settings.storage and restarts_possible(spec) else None
    plan = plan_cluster(pod_spec, RunContext(run_id=name, run_dir=run_dir, backup_dir=backup_dir),
                        local_hosts=frozenset(), cores_by_host={}, default_python=settings.python,
                        default_workdir=settings.workdir or "", command=command, override_env=override_env,
                        pass_values=False)
    roles = []
    for role in ROLES:
        launches = tuple(sorted((l for l in plan.launches if l.role == role), key=lambda l: l.index))
        if launches:
            roles.append(replace(_role_pods(spec, role, launches), restart=spec.restart_policy[role]))
    notes = carry_over_notes(spec, settings) + storage_notes(spec, settings.storage, plan.launches) + list(plan.notes)
    pods = PodPlan(name, settings, tuple(roles), plan.launches[0].argv, tuple(notes),
                   max_restarts=int(spec.max_restarts), task_restarts=int(spec.task_restarts))
    return replace(pods, notes=pods.notes + ((secret_note(pods),) if pods.hidden else ()))


def secret_note(plan: PodPlan) -> str:
    """The Secret to create before applying the manifests, as a kubectl command with the values left out."""
    namespace = f" --namespace {plan.settings.namespace}" if plan.settings.namespace else ""
    literals = " ".join(f"--from-literal={name}=..." for name in plan.hidden)
    return (f"secret: {', '.join(plan.hidden)} come from the Secret {plan.secret_name} (their values are not "
            f"written here); create it before applying: kubectl create secret generic {plan.secret_name}"
            f"{namespace} {literals}")


def pod_run_dir(storage: Storage | None, name: str) -> str:
    """Where the plan's run-folder paths point inside a pod: on the storage volume when there is one."""
    return f"{storage.path}/{name}" if storage else POD_RUN_DIR.format(name=name)


def restarts_possible(spec: ClusterSpec) -> bool:
    """Whether a pod may start again mid-training (the rule ``tflaunch run`` follows for its backup folder)."""
    return spec_restarts_possible(spec.max_restarts, spec.restart_policy)


def _pod_cluster(spec: ClusterSpec, settings: KubernetesSettings, pod_host: Callable[[str, int], str]) -> ClusterSpec:
    tasks = tuple(replace(t, host=pod_host(t.role, t.index), address=None, port=settings.port,
                          gpus=None if t.gpus is None else tuple(range(len(t.gpus))),
                          workdir=None, python=None, setup=None) for t in spec.tasks)
    # Machine settings stay behind (see carry_over_notes); kubernetes.env is the pods' own layer.
    return replace(spec, tasks=tasks, env={**spec.env, **settings.env}, hosts={}, ssh=SshSettings(),
                   workdir=None, python=None, setup=None, share_gpus=False, log_dir=None, transport=None)


def _role_pods(spec: ClusterSpec, role: str, launches: tuple[TaskLaunch, ...]) -> RolePods:
    """One template per role: every task must agree on its env and its GPU count."""
    tasks = {t.index: t for t in spec.role_tasks(role)}
    first, first_task = launches[0], tasks[launches[0].index]
    shared = pod_env(first)
    hidden = frozenset(first.hidden) & shared.keys()
    for launch in launches[1:]:
        task = tasks[launch.index]
        # GPUs first: a different count also shows as a different CUDA_VISIBLE_DEVICES below.
        if gpu_count(task) != gpu_count(first_task):
            raise ConfigError(spec.source, f"{task.key}.gpus",
                              f"{plural(gpu_count(task), 'GPU')} here but {gpu_count(first_task)} in {first_task.key}; expected "
                              f"the same number for every {role} task, because Kubernetes starts a role's pods "
                              "from one template")
        env = pod_env(launch)
        for var in sorted(set(shared) | set(env)):
            if shared.get(var) != env.get(var) or (var in hidden) != (var in launch.hidden):
                raise ConfigError(spec.source, f"{task.key}.env",
                                  f"{var} is {_shown(env, var, launch.hidden)} here but "
                                  f"{_shown(shared, var, hidden)} in {first_task.key}; expected the same env "
                                  f"for every {role} task, because Kubernetes starts a role's pods from one template")
    return RolePods(role, launches, shared, gpu_count(first_task), hidden=hidden)


def storage_notes(spec: ClusterSpec, storage: Storage | None, launches: tuple[TaskLaunch, ...]) -> list[str]:
    """What will not work for want of storage the pods share: the evaluator's checkpoints, restarts' backups.

    A variable the user set (``env``, ``kubernetes.env``, ``--env``) is their choice of storage:
    no note for it.
    """
    notes = []
    chosen = {var for l in launches for var, source in l.env_sources.items() if source != DEFAULT_SOURCE}
    checkpoints = sorted({l.env[CHECKPOINT_DIR] for l in launches if CHECKPOINT_DIR in l.env})
    if checkpoints and CHECKPOINT_DIR not in chosen and not (storage and storage.shared):
        if storage:
            notes.append(f"{SECTION}.storage: empty_dir gives each pod a directory of its own at {storage.path}, so "
                         f"the evaluator never sees the checkpoints the chief writes to {checkpoints[0]}; expected "
                         "'claim: NAME' (a PersistentVolumeClaim the chief and evaluator pods both mount)")
        else:
            notes.append(f"evaluator: it evaluates the checkpoints the chief writes to {CHECKPOINT_DIR}, which is "
                         f"{checkpoints[0]} inside each pod, where the evaluator pod never sees them; set "
                         f"{SECTION}.storage ('claim: NAME') to a volume the chief and evaluator pods both mount")
    if restarts_possible(spec) and BACKUP_DIR not in chosen and not (storage and storage.shared):
        why = "max_restarts" if int(spec.max_restarts) else "restart_policy"
        if storage:
            notes.append(f"{SECTION}.storage: with empty_dir a replaced pod starts with an empty {storage.path}, so "
                         f"restarted pods ({why}) train from scratch; 'claim: NAME' keeps the backup")
        else:
            notes.append(f"{why}: restarted pods train from scratch: the backup they would resume from needs a "
                         f"volume that outlives a pod; set {SECTION}.storage ('claim: NAME')")
    return notes


def pod_env(launch: TaskLaunch) -> dict[str, str]:
    """The plan's env for ``launch`` without the variables that differ from pod to pod or need a run folder."""
    return {k: v for k, v in launch.env.items() if k not in PER_POD_ENV and k not in NO_RUN_FOLDER_ENV}


def gpu_count(task: TaskSpec) -> int:
    return 0 if task.gpus is None else len(task.gpus)


def _shown(env: Mapping[str, str], var: str, hidden: frozenset[str]) -> str:
    if var not in env:
        return "unset"
    return "hidden (passed by name, or a secret's name)" if var in hidden else repr(env[var])


def carry_over_notes(spec: ClusterSpec, settings: KubernetesSettings) -> list[str]:
    """One line for each setting of the file that pods cannot honour as written, and what happens instead."""
    notes = []
    ports = sorted({str(t.port) for t in spec.tasks if t.port != settings.port})
    if ports:
        notes.append(f"port: every pod listens on port {settings.port} (kubernetes.port), since each pod has its "
                     f"own address; the cluster's ports ({', '.join(ports)}) are not used")
    hosts = sorted({t.host for t in spec.tasks if not is_local(t.host, frozenset())})
    if hosts:
        notes.append(f"host: each task runs in its own pod instead of on {', '.join(hosts)}")
    if any(t.address for t in spec.tasks):
        notes.append("address: replaced by the pods' DNS names in TF_CONFIG")
    if spec.ssh != SshSettings() or any(h.ssh != SshSettings() for h in spec.hosts.values()):
        notes.append("ssh: not used; Kubernetes starts the pods")
    _note_machine_field(notes, spec, "setup", "not run in pods; build what it prepares into the image")
    _note_machine_field(notes, spec, "workdir",
                        f"not used (a path on your hosts); containers start in "
                        f"{settings.workdir or 'the image working directory'} (kubernetes.workdir)")
    _note_machine_field(notes, spec, "python",
                        f"not used (a path on your hosts); 'python' in the command is {settings.python} "
                        "(kubernetes.python)")
    for host, host_settings in spec.hosts.items():
        if host_settings.env:
            notes.append(f"hosts.{host}.env: not used (per-host settings); put the variables in 'env' or "
                         "kubernetes.env")
    every_gpu = [t.key for t in spec.tasks if t.gpus is None]
    if every_gpu:
        notes.append(f"gpus: 'all' ({', '.join(every_gpu)}) requests no GPU from Kubernetes; list GPU indices "
                     "to get that many")
    if spec.share_gpus:
        notes.append("share_gpus: not used; each pod gets GPUs of its own")
    if spec.log_dir or spec.log_group:
        keys = ", ".join(key for key in ("log_dir", "log_group") if getattr(spec, key))
        notes.append(f"{keys}: not used; read the pods' output with kubectl logs")
    if spec.max_restarts:
        notes.append("restart_delay: not used; the controller restarts pods at once")
    if spec.spares or spec.min_workers is not None:
        notes.append("spares, min_workers: not used; Kubernetes schedules each pod on any node that fits, and "
                     "reschedules a pod whose node is lost")
    return notes


def _note_machine_field(notes: list[str], spec: ClusterSpec, name: str, message: str) -> None:
    keys = [name] if getattr(spec, name) else []
    keys += [f"hosts.{h}.{name}" for h, s in spec.hosts.items() if getattr(s, name)]
    keys += [f"{t.key}.{name}" for t in spec.tasks if getattr(t, name)]
    if keys:
        notes.append(f"{', '.join(keys)}: {message}")
