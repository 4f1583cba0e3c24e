"""The cluster as tflaunch understands it: frozen dataclasses for tasks, hosts and ssh settings,
and the rules every ``env`` follows: names tflaunch reserves, variables passed by name, which
values are hidden (secrets' names: :mod:`launcher.masking`), and the text an argument or a value may hold.

Built by :mod:`.reader` (a cluster file), :mod:`.local` (``--local N``) and the sources of
:mod:`launcher.sources` (host lists, Slurm allocations); read by :mod:`.plan` and the checks.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, Sequence

from ..masking import MASK, is_secret_name, masked_url_passwords
from ..options import DEFAULT_KEEPALIVE_TIMEOUT, MAX_RESTARTS, RESTART_DELAY
from ..options import name as option_name
from ..records.states import Role
from ..taskenv import OWNED as OWNED_TASK_ENV



ROLES = tuple(role.value for role in Role)  # in a cluster file's order
AUTO = "auto"
ALL_GPUS = "all"
# The most tasks tflaunch starts on one host from a count (--local N, a hostfile's slots): beyond the
# cores of any machine (a TensorFlow task needs a core and a few hundred MB), yet quick to plan, as
# every task's TF_CONFIG lists every task; a larger count is a typo, refused before any planning.
MAX_TASKS_PER_HOST = 1024
# Set by tflaunch itself for every task; a cluster file may not override them.
RESERVED_ENV = frozenset({"TF_CONFIG", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", *OWNED_TASK_ENV})


# One ``env`` layer (the cluster's, a host's, a task's, ``--env``). A value of None passes the
# variable by name: its value is the one in tflaunch's own environment (see value_by_name).
EnvLayer = Mapping[str, str | None]


class Network(str, enum.Enum):
    """Where a run's tasks meet the network (docs/security.md; decided by launcher.run.checks.isolation)."""

    SEALED = "sealed"  # one network namespace of the run's own; outside network through slirp4netns or pasta
    ISOLATED = "isolated"  # one network namespace of the run's own, loopback only; no start without it
    OPEN = "open"  # this machine's network, as any other program's


class RestartPolicy(str, enum.Enum):
    """What a failure of a task of one role does (the cluster file's ``restart_policy``)."""

    CLUSTER = "cluster"  # the attempt fails; the whole cluster may restart from the backup
    TASK = "task"  # the task alone restarts in place, with the same TF_CONFIG, while the others run


DEFAULT_CONNECT_TIMEOUT = 10.0  # seconds for an ssh connection when ssh.connect_timeout is not set
DEFAULT_COOLDOWN = 300.0  # seconds a host left out of a run waits before it may rejoin at a restart
DEFAULT_TASK_RESTARTS = 3  # in-place restarts allowed per task under the "task" policy, unless task_restarts says


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
    env: EnvLayer = field(default_factory=dict)


@dataclass(frozen=True)
class TaskSpec:
    """One task of the cluster as the file describes it (ports may still be ``auto``)."""

    role: str
    index: int
    host: str
    port: int | str  # an int, or AUTO until ports are reserved
    address: str | None = None  # the name other tasks use to reach it; defaults to host
    gpus: tuple[int, ...] | None = ()  # () = CPU only, None = all GPUs visible
    env: EnvLayer = field(default_factory=dict)
    workdir: str | None = None
    python: str | None = None
    setup: str | None = None
    key: str = ""  # key path in the file, for messages

    # Cached: a plan asks for each task's name a dozen times, and a cluster has thousands of tasks.
    # (A frozen dataclass keeps it: cached_property writes the instance's __dict__ directly.)
    @functools.cached_property
    def name(self) -> str:
        return f"{self.role}-{self.index}"

    @functools.cached_property
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
    env: EnvLayer = field(default_factory=dict)
    log_dir: str | None = None
    log_group: str | None = None  # the group run folders are shared with (launcher.options.group_id); None: nobody
    share_gpus: bool = False
    threads: int | str = AUTO  # AUTO, "off", or a thread count per task
    workdir: str | None = None
    python: str | None = None
    setup: str | None = None
    ssh: SshSettings = SshSettings()
    hosts: Mapping[str, HostSettings] = field(default_factory=dict)
    max_restarts: int = MAX_RESTARTS
    restart_delay: float = RESTART_DELAY
    # The transport that starts every task (see launcher.sources); None: 'local' or 'ssh' by host.
    # One of OTHER_HOSTS_ONLY starts the other hosts' tasks only; this machine's are 'local'.
    transport: str | None = None
    restart_policy_by_role: Mapping[str, RestartPolicy] = field(default_factory=dict)  # as the file says
    task_restarts: int = DEFAULT_TASK_RESTARTS
    # As the file asks (isolate_network: true/false), until the run decides: None leaves it to the run.
    network: Network | None = None
    # Hosts that stand in for lost ones (one slot each, role "spare"; see cluster/placement.py), the
    # fewest training tasks an attempt may run with (None: never shrink), and how long a host left out
    # waits before it may rejoin.
    spares: tuple[TaskSpec, ...] = ()
    min_workers: int | None = None
    cooldown: float = DEFAULT_COOLDOWN

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
    # The raw ``ray:`` section; the Ray source reads it (launcher.sources.ray).
    ray: Mapping[str, Any] | None = None

    def role_tasks(self, role: str) -> tuple[TaskSpec, ...]:
        return tuple(t for t in self.tasks if t.role == role)

    @property
    def has_ps(self) -> bool:
        return any(t.role == Role.PS for t in self.tasks)

    @property
    def training_count(self) -> int:
        """The tasks that train (chief and workers): TensorFlow's worker count, what ``min_workers`` counts."""
        return sum(1 for t in self.tasks if t.role in (Role.CHIEF, Role.WORKER))

    @property
    def synchronous(self) -> bool:
        """Whether every step waits for every training task (two or more of them, no ``ps``): where a
        straggler holds the others back."""
        return not self.has_ps and self.training_count >= 2

    @property
    def slots(self) -> tuple[TaskSpec, ...]:
        """The tasks and the spare slots: every place a task may run, each with a port."""
        return self.tasks + self.spares

    def with_ports(self, ports: Mapping[str, int]) -> "ClusterSpec":
        """The same cluster with the ``auto`` ports of the named tasks and spare slots filled in."""
        tasks = tuple(replace(t, port=ports[t.name]) if t.name in ports else t for t in self.tasks)
        spares = tuple(replace(t, port=ports[t.name]) if t.name in ports else t for t in self.spares)
        return replace(self, tasks=tasks, spares=spares)


    def at_addresses(self, addresses: Mapping[str, str]) -> "ClusterSpec":
        """The same cluster with the tasks and spare slots of the named hosts reached at the given
        addresses (a node that joined the run again from a new address)."""
        if not any(task.host in addresses and task.address != addresses[task.host] for task in self.slots):
            return self
        tasks = tuple(replace(t, address=addresses[t.host]) if t.host in addresses else t for t in self.tasks)
        spares = tuple(replace(t, address=addresses[t.host]) if t.host in addresses else t for t in self.spares)
        return replace(self, tasks=tasks, spares=spares)


OTHER_HOSTS_ONLY = frozenset({"joined"})  # transports whose agents are on other hosts: nodes that joined the run


def is_local(host: str, local_hosts: frozenset[str]) -> bool:
    """Whether ``host`` names this machine (any loopback address counts)."""
    return host in local_hosts or host == "localhost" or is_loopback(host)


@functools.lru_cache(maxsize=4096)  # asked several times per task, of a few distinct hosts, at every start
def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (127.0.0.0/8, ::1, [::1], ::ffff:127.x.y.z).

    Parsed as an address: ``127.foo.example`` is a name like any other, which DNS may point anywhere.
    """
    import ipaddress

    try:
        address = ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or bool(mapped and mapped.is_loopback)


def restarts_possible(max_restarts: int, restart_policy: Mapping[str, "RestartPolicy"]) -> bool:
    """Whether a task may start again mid-training, so that a backup has something to resume:
    whole-cluster restarts, or a role whose tasks restart alone (ParameterServer workers by default)."""
    return int(max_restarts) > 0 or RestartPolicy.TASK in restart_policy.values()


def check_override_env(env: EnvLayer) -> None:
    """``--env`` may set anything but the variables tflaunch writes for every task, to UTF-8 text."""
    from ..errors import ConfigError

    for key, value in env.items():
        if key in RESERVED_ENV:
            raise ConfigError(option_name("env"), key, "is set by tflaunch for every task and cannot be overridden")
        if value is not None:
            check_text(value, option_name("env"), key)


# -- secrets: passed by name, masked where shown ------------------------------------------------
#
# A variable given without a value (``--env KEY``, ``KEY:`` in a file's env, ``None`` in the Python
# API) takes the value of the same variable in tflaunch's own environment when the run is planned,
# as ``docker run -e KEY`` and ``sbatch --export=KEY`` do, so the value is on no command line and
# in no file. Such a variable, and one whose name marks a secret, reaches the task through the
# agent's channel and is masked wherever tflaunch writes or prints it (launcher.masking).


def hidden_names(env: Mapping[str, str | None], by_name: Iterable[str] = ()) -> frozenset[str]:
    """The variables of ``env`` whose values are never shown: those passed by name and secrets' names."""
    return frozenset(by_name) | {key for key in env if is_secret_name(key)}


def masked_env(env: Mapping[str, str], hidden: Iterable[str]) -> dict[str, str]:
    """``env`` as it may be written or shown: every hidden variable's value replaced by MASK, and
    the password of a URL in any other value."""
    hidden = frozenset(hidden)
    return {key: MASK if key in hidden or is_secret_name(key) else masked_url_passwords(value)
            for key, value in env.items()}


# -- text that can reach a process ------------------------------------------------------------


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be an argument or an environment value, or None.

    A NUL ends a C string (execve would cut the value short); a byte that is not UTF-8 reaches
    Python as a lone surrogate (PEP 383) that the agents' channel, run.json and the logs cannot
    carry. The value itself is never quoted: it may be a secret.
    """
    nul = value.find("\0")
    if nul >= 0:
        return f"contains a NUL byte at position {nul}"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        char = ord(value[exc.start])
        what = f"byte 0x{char - 0xDC00:02x}" if 0xDC80 <= char <= 0xDCFF else f"character U+{char:04X}"
        return f"is not valid UTF-8 ({what} at position {exc.start})"
    return None


def check_text(value: str, source: str, key: str) -> None:
    """Raise ConfigError naming ``source`` and ``key`` when ``value`` cannot reach a process (see text_problem)."""
    from ..errors import ConfigError

    problem = text_problem(value)
    if problem:
        raise ConfigError(source, key, f"{problem}; expected UTF-8 text without NUL bytes")


def value_by_name(name: str, environ: Mapping[str, str], source: str, key: str) -> str:
    """The value of a variable passed by name: tflaunch's own ``environ[name]``, checked."""
    from ..errors import ConfigError

    if name not in environ:
        raise ConfigError(source, key, f"is passed by name (no value given), but tflaunch's environment has no "
                                       f"{name}; set it there (export {name}=...) or give a value")
    value = environ[name]
    problem = text_problem(value)
    if problem:
        raise ConfigError(source, key, f"its value in tflaunch's environment {problem}; expected UTF-8 text "
                                       "without NUL bytes")
    return value


def env_layers(spec: ClusterSpec) -> list[tuple[str, str, EnvLayer]]:
    """Every ``env`` of the cluster as (source, key prefix, variables), in the order the plan layers them."""
    layers: list[tuple[str, str, EnvLayer]] = [(spec.source, "env", spec.env)]
    layers += [(spec.source, f"hosts.{host}.env", settings.env) for host, settings in spec.hosts.items()]
    layers += [(spec.source, f"{task.key}.env", task.env) for task in spec.tasks]
    return layers


def check_launch_input(spec: ClusterSpec, override_env: EnvLayer, command: Sequence[str] | None,
                       environ: Mapping[str, str] | None) -> None:
    """Before anything starts: ``--env`` (see check_override_env), the command's words, and every
    variable passed by name, which must be set in ``environ`` (None: not looked up, as for an export,
    where the value comes from the target's own environment or a Kubernetes Secret)."""
    check_override_env(override_env)
    for i, word in enumerate(command or ()):
        check_text(word, "command", f"argument {i + 1}")
    if environ is None:
        return
    given = {key for key, value in override_env.items() if value is not None}  # --env NAME=VALUE wins
    layers = [(False, source, prefix, env) for source, prefix, env in env_layers(spec)]
    for override, source, prefix, env in [*layers, (True, option_name("env"), "", override_env)]:
        for name, value in env.items():
            if value is None and (override or name not in given):
                value_by_name(name, environ, source, f"{prefix}.{name}" if prefix else name)
