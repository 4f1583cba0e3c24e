"""The cluster as tflaunch understands it: frozen dataclasses for tasks, hosts and ssh settings.

Built by :mod:`config` (from a cluster file or ``--local`` options) and read by :mod:`plan`.
"""

from __future__ import annotations

import enum

from dataclasses import dataclass, field, replace
from typing import Any, Mapping

ROLES = ("chief", "worker", "ps", "evaluator")
AUTO = "auto"
ALL_GPUS = "all"
# Set by tflaunch itself for every task; a cluster file may not override them.
RESERVED_ENV = frozenset(
    {"TF_CONFIG", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "TFLAUNCH_TASK", "TFLAUNCH_RUN_ID", "TFLAUNCH_RUN_DIR", "TFLAUNCH_ATTEMPT"}
)


class RestartPolicy(str, enum.Enum):
    """What a failure of a task of one role does (the cluster file's ``restart_policy``)."""

    CLUSTER = "cluster"  # the attempt fails; the whole cluster may restart from the backup
    TASK = "task"  # the task alone restarts in place, with the same TF_CONFIG, while the others run


@dataclass(frozen=True)
class SshSettings:
    """How to reach a host with the system ``ssh`` client; None means "ssh's own default"."""

    user: str | None = None
    port: int | None = None
    identity_file: str | None = None
    options: tuple[str, ...] = ()
    connect_timeout: float | None = None
    keepalive_timeout: float | None = None

    def overridden_by(self, other: "SshSettings") -> "SshSettings":
        """These settings with every field that ``other`` sets taken from ``other``."""
        return SshSettings(
            user=other.user or self.user,
            port=other.port or self.port,
            identity_file=other.identity_file or self.identity_file,
            options=other.options + self.options,  # ssh keeps the first value it sees
            connect_timeout=other.connect_timeout or self.connect_timeout,
            keepalive_timeout=other.keepalive_timeout or self.keepalive_timeout,
        )


@dataclass(frozen=True)
class HostSettings:
    """Per-host settings from the ``hosts:`` section."""

    ssh: SshSettings = SshSettings()
    workdir: str | None = None
    python: str | None = None
    setup: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskSpec:
    """One task of the cluster as the file describes it (ports may still be ``auto``)."""

    role: str
    index: int
    host: str
    port: int | str  # an int, or AUTO until ports are reserved
    address: str | None = None  # the name other tasks use to reach it; defaults to host
    gpus: tuple[int, ...] | None = ()  # () = CPU only, None = all GPUs visible
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str | None = None
    python: str | None = None
    setup: str | None = None
    key: str = ""  # key path in the file, for messages

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}"

    @property
    def tf_address(self) -> str:
        host = self.address or self.host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"  # IPv6 literal
        return f"{host}:{self.port}"


@dataclass(frozen=True)
class ClusterSpec:
    """A whole validated cluster: its tasks plus cluster-wide settings."""

    source: str
    tasks: tuple[TaskSpec, ...]
    command: tuple[str, ...] | None = None  # None = the built-in trainer
    env: Mapping[str, str] = field(default_factory=dict)
    log_dir: str | None = None
    share_gpus: bool = False
    threads: int | str = AUTO  # AUTO, "off", or a thread count per task
    workdir: str | None = None
    python: str | None = None
    setup: str | None = None
    ssh: SshSettings = SshSettings()
    hosts: Mapping[str, HostSettings] = field(default_factory=dict)
    max_restarts: int = 0
    restart_delay: float = 1.0
    # The transport that starts every task (see launcher.sources); None: 'local' or 'ssh' by host.
    transport: str | None = None
    restart_policy_by_role: Mapping[str, RestartPolicy] = field(default_factory=dict)  # as the file says
    task_restarts: int = 3  # in-place restarts allowed per task under the "task" policy
    isolate_network: bool = False  # every task in one network namespace of the run's own (all local)

    @property
    def restart_policy(self) -> dict[str, RestartPolicy]:
        """Each role's policy: the file's choice, else ``task`` for ParameterServer workers, else ``cluster``.

        ParameterServerStrategy's coordinator tolerates a worker that dies and comes back with the
        same TF_CONFIG; every other role's failure breaks the collective or the coordination.
        """
        policy = {role: RestartPolicy.CLUSTER for role in ROLES}
        if self.has_ps:
            policy["worker"] = RestartPolicy.TASK
        policy.update(self.restart_policy_by_role)
        return policy
    # The raw ``kubernetes:`` section; only ``tflaunch export`` reads it (launcher.export.settings).
    kubernetes: Mapping[str, Any] | None = None
    # The raw ``slurm:`` section; the Slurm source and ``tflaunch submit`` read it (launcher.slurm.section).
    slurm: Mapping[str, Any] | None = None

    def role_tasks(self, role: str) -> tuple[TaskSpec, ...]:
        return tuple(t for t in self.tasks if t.role == role)

    @property
    def has_ps(self) -> bool:
        return any(t.role == "ps" for t in self.tasks)

    def with_ports(self, ports: Mapping[str, int]) -> "ClusterSpec":
        """The same cluster with the ``auto`` ports of the named tasks filled in."""
        tasks = tuple(replace(t, port=ports[t.name]) if t.name in ports else t for t in self.tasks)
        return replace(self, tasks=tasks)


def is_local(host: str, local_hosts: frozenset[str]) -> bool:
    """Whether ``host`` names this machine (any loopback address counts)."""
    from .machine import is_loopback

    return host in local_hosts or host == "localhost" or is_loopback(host)


def restarts_possible(max_restarts: int, restart_policy: Mapping[str, "RestartPolicy"]) -> bool:
    """Whether a task may start again mid-training, so that a backup has something to resume:
    whole-cluster restarts, or a role whose tasks restart alone (ParameterServer workers by default)."""
    return int(max_restarts) > 0 or RestartPolicy.TASK in restart_policy.values()


def check_override_env(env: Mapping[str, str]) -> None:
    """``--env`` may set anything but the variables tflaunch writes for every task."""
    from ..errors import ConfigError

    for key in env:
        if key in RESERVED_ENV:
            raise ConfigError("--env", key, "is set by tflaunch for every task and cannot be overridden")
