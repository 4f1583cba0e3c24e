"""Cluster files turned into a validated :class:`ClusterSpec` (``--local N`` is :mod:`.local`'s).

Everything here is pure: YAML text in, frozen dataclasses out. Each validation error is a
:class:`ConfigError` naming the file, the key path, the bad value and what was expected; the
reader goes on past one, and raises every error it found together (:class:`ConfigErrors`).
Nothing starts before the whole file has been checked.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError, ConfigErrors
from ..options import MAX_RESTARTS, RESTART_DELAY
from .yamlfile import ClusterLoader, DuplicateKey
from .checks import cluster_problems
from .fields import FieldReader, join_key, show
from .placement import SPARE_ROLE
from .spec import (  # noqa: F401  (re-exported: the spec is part of this module's interface)
    AUTO,
    DEFAULT_COOLDOWN,
    DEFAULT_TASK_RESTARTS,
    ROLES,
    ClusterSpec,
    Network,
    RestartPolicy,
    HostSettings,
    SshSettings,
    TaskSpec,
    check_text,
    Role,
    text_problem,
)

CLUSTER_KEYS = ("command", "env", "log_dir", "log_group", "share_gpus", "threads", "workdir", "python", "setup", "ssh",
                "hosts", "max_restarts", "restart_delay", "restart_policy", "task_restarts", "kubernetes", "slurm", "ray", "isolate_network",
                "spares", "min_workers", "cooldown") + ROLES
TASK_KEYS = ("host", "port", "address", "gpus", "env", "workdir", "python", "setup")
HOST_KEYS = ("ssh", "workdir", "python", "setup", "env")
SSH_KEYS = ("user", "port", "identity_file", "options", "connect_timeout", "keepalive_timeout")


# ---------------------------------------------------------------------------------------------
# Loading


def load_cluster_file(path: str | Path, local_hosts: frozenset[str], slurm_template: bool = False) -> ClusterSpec:
    """Read and validate a cluster file; ``local_hosts`` are the names of this machine.

    ``slurm_template``: read for Slurm, where a file with a ``slurm:`` section and no roles is
    complete (the roles come from the allocation).
    """
    source = str(path)
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise ConfigError(source, "", "no such cluster file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(source, "", f"cannot read cluster file ({exc})") from None
    return parse_cluster(text, source, local_hosts, slurm_template)


def parse_cluster(text: str, source: str, local_hosts: frozenset[str], slurm_template: bool = False) -> ClusterSpec:
    """Validate cluster YAML text. ``source`` names it in error messages."""
    try:
        data = yaml.load(text, Loader=ClusterLoader)  # noqa: S506 - a SafeLoader subclass
    except DuplicateKey as exc:
        raise ConfigError(source, f"line {exc.line}", f"key {exc.key!r} appears twice; expected each key once") from None
    except UnicodeEncodeError:  # text from the API holding what no file can (a lone surrogate)
        check_text(text, source, "")
        raise
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "YAML"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(source, where, f"invalid YAML: {problem}") from None
    # YAML refuses a NUL or a lone surrogate written as itself (above): only an escape, which takes
    # a backslash, puts either in a string, so a text without one has no string to walk for them.
    return _ClusterReader(source, local_hosts, slurm_template).read(data, clean="\\" not in text)


def parse_host_port(value: str) -> tuple[str, str]:
    """Split ``host:port`` (or ``[v6]:port``) into its parts; the port stays a string."""
    if value.startswith("["):
        host, sep, rest = value[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise ValueError(value)
        return host, rest[1:]
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise ValueError(value)
    return host, port


class _ClusterReader(FieldReader):
    """Walks the YAML document: roles and tasks, ``hosts`` and ``ssh``; values go through FieldReader."""

    def __init__(self, source: str, local_hosts: frozenset[str], slurm_template: bool = False):
        super().__init__(source)
        self.local_hosts = local_hosts
        self.slurm_template = slurm_template

    def read(self, data: Any, clean: bool = False) -> ClusterSpec:
        """The spec of the whole document; every problem found in it is raised together (one line each).
        ``clean``: the text it was read from cannot have made a string that fails :func:`text_problem`
        (it has no escape), so its strings are not walked."""
        if data is None:
            raise self.fail("", "the cluster file is empty; expected roles such as 'worker:'")
        if isinstance(data, list):  # short form: a list of host:port workers
            data = {Role.WORKER.value: data}
        if not clean:
            self.collect(lambda: self._check_strings(data, ""), None)
        mapping = self.expect_mapping(data, "", "a mapping of cluster keys or a list of host:port workers")
        self.collect(lambda: self.check_keys(mapping, CLUSTER_KEYS, ""), None)
        tasks: list[TaskSpec] = []
        for role in ROLES:
            if role in mapping:
                tasks += self._read_role(role, mapping[role])
        tasks_read = not self.problems  # the whole-cluster checks below need every task
        get, collect = mapping.get, self.collect
        spec = ClusterSpec(
            source=self.source,
            tasks=tuple(tasks),
            command=collect(lambda: self.read_command(mapping["command"], "command"), None) if "command" in mapping else None,
            env=collect(lambda: self.read_env(get("env"), "env"), {}),
            log_dir=collect(lambda: self.optional_str(mapping, "log_dir", ""), None),
            log_group=collect(lambda: self._read_log_group(get("log_group")), None),
            share_gpus=collect(lambda: self.read_bool(get("share_gpus", False), "share_gpus"), False),
            threads=collect(lambda: self.read_threads(get("threads", AUTO)), AUTO),
            workdir=collect(lambda: self.optional_str(mapping, "workdir", ""), None),
            python=collect(lambda: self.optional_str(mapping, "python", ""), None),
            setup=collect(lambda: self.optional_str(mapping, "setup", ""), None),
            ssh=collect(lambda: self._read_ssh(get("ssh"), "ssh"), SshSettings()),
            hosts=self._read_hosts(get("hosts")),
            max_restarts=collect(lambda: self.read_count(get("max_restarts", MAX_RESTARTS), "max_restarts"), 0),
            restart_delay=collect(lambda: self.read_seconds(get("restart_delay", RESTART_DELAY), "restart_delay",
                                                            allow_zero=True), RESTART_DELAY),
            restart_policy_by_role=collect(lambda: self._read_restart_policy(get("restart_policy")), {}),
            task_restarts=int(collect(lambda: self.read_count(get("task_restarts", DEFAULT_TASK_RESTARTS),
                                                              "task_restarts"), 0)),
            network=collect(lambda: self._read_network(get("isolate_network")), None),
            spares=tuple(self._read_role("spares", get("spares"))) if get("spares") is not None else (),
            min_workers=None if get("min_workers") is None else collect(
                lambda: self.read_count(mapping["min_workers"], "min_workers", least=1), None),
            cooldown=collect(lambda: self.read_seconds(get("cooldown", DEFAULT_COOLDOWN), "cooldown",
                                                       allow_zero=True), DEFAULT_COOLDOWN),
            kubernetes=None if get("kubernetes") is None else collect(lambda: self.expect_mapping(
                mapping["kubernetes"], "kubernetes", "a mapping of Kubernetes settings"), None),
            slurm=None if get("slurm") is None else collect(lambda: self.expect_mapping(
                mapping["slurm"], "slurm", "a mapping of Slurm settings"), None),
            ray=None if get("ray") is None else collect(lambda: self.expect_mapping(
                mapping["ray"], "ray", "a mapping of Ray settings"), None),
        )
        if spec.ray is not None and tasks_read:
            if spec.tasks or spec.spares:
                self.problems.append(self.fail("ray", "this file's tasks are placed on the Ray cluster's nodes: drop "
                                               "its roles and spares (ray.nnodes, ray.tasks_per_node and ray.spares "
                                               "say how many)"))
            elif not self.problems:
                return spec  # the tasks come from the Ray cluster
        if spec.slurm is not None and not spec.tasks and tasks_read:
            if self.slurm_template and not self.problems:
                return spec  # the roles come from the Slurm allocation
            if not self.slurm_template:
                self.problems.append(self.fail("slurm", "this file's roles come from a Slurm allocation; run it with "
                                               f"'tflaunch submit {self.source}', or inside an allocation with "
                                               f"'tflaunch --slurm {self.source}'"))
        elif tasks_read:
            self.problems += cluster_problems(spec, self.local_hosts)
        task_hosts = sorted({t.host for t in spec.slots})
        for name in spec.hosts if tasks_read else ():
            if name not in task_hosts:
                import difflib  # only a mistake needs it

                close = difflib.get_close_matches(name, task_hosts, n=1)
                hint = f"did you mean '{close[0]}'?" if close else f"expected one of the tasks' hosts: {', '.join(task_hosts)}"
                self.problems.append(self.fail(f"hosts.{name}", f"no task runs on this host; {hint}"))
        if self.problems:
            # In the file's order of its top-level keys: the lines read as the file does.
            order = {str(name): place for place, name in enumerate(mapping)}
            raise ConfigErrors.of(sorted(self.problems, key=lambda e: order.get(re.split(r"[.\[]", e.key)[0], -1)))
        return spec

    def _check_strings(self, value: Any, key: str) -> None:
        """Every string of the document can reach a process (no NUL, UTF-8 only): YAML's "\\0" and
        "\\udcff" escapes make either, which would otherwise fail only when a task starts."""
        if isinstance(value, str):
            if text_problem(value):
                check_text(value, self.source, key or "top level")
        elif isinstance(value, (dict, list)):
            # A value's key is put together only to go into a container or to name a bad string:
            # this walks every value of the file, at every start.
            mapping = isinstance(value, dict)
            for name, item in (value.items() if mapping else enumerate(value)):
                if mapping and isinstance(name, str) and text_problem(name):
                    check_text(name, self.source, f"{key or 'top level'} key {show(name[:20])}")
                if isinstance(item, (dict, list)) or (isinstance(item, str) and text_problem(item)):
                    self._check_strings(item, join_key(key, str(name)) if mapping else f"{key}[{name}]")

    def _read_log_group(self, value: Any) -> str | None:
        """A group's name or number; whether this user may give it a run folder is the run's check
        (the machine's groups are not the file's to know)."""
        if value is None:
            return None
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return str(value)
        if isinstance(value, str) and value.strip():
            return value.strip()
        raise self.fail("log_group", f"expected the name or number of a group, got {show(value)}")

    def _read_network(self, value: Any) -> Network | None:
        """``isolate_network``: true isolates the tasks, false leaves them on this machine's network,
        and without the key the run decides (sealed when every task is on this machine)."""
        if value is None:
            return None
        return Network.ISOLATED if self.read_bool(value, "isolate_network") else Network.OPEN

    def _read_restart_policy(self, value: Any) -> dict[str, RestartPolicy]:
        if value is None:
            return {}
        mapping = self.expect_mapping(value, "restart_policy", "a mapping of role to 'cluster' or 'task'")
        self.check_keys(mapping, ROLES, "restart_policy")
        choices = [p.value for p in RestartPolicy]
        policy = {}
        for role, raw in mapping.items():
            if raw not in choices:
                raise self.fail(f"restart_policy.{role}", f"expected one of {', '.join(choices)}, got {show(raw)}")
            policy[role] = RestartPolicy(raw)
        return policy

    def _read_role(self, role: str, value: Any) -> list[TaskSpec]:
        if isinstance(value, (dict, str)):
            value = [value]  # a single task written without the list
        if not isinstance(value, list):
            self.problems.append(self.fail(role, f"expected a list of tasks, got {show(value)}"))
            return []
        tasks = [self.collect(lambda: self._read_task(role, i, item), None) for i, item in enumerate(value)]
        return [task for task in tasks if task is not None]

    def _read_task(self, role: str, index: int, item: Any) -> TaskSpec:
        key = f"{role}[{index}]"
        role = SPARE_ROLE if role == "spares" else role
        if isinstance(item, str):
            item = {"host": item}  # "host:port" short form, split below
        mapping = self.expect_mapping(item, key, "a task mapping or a 'host:port' string")
        problems = len(self.problems)
        collect = self.collect
        collect(lambda: self.check_keys(mapping, TASK_KEYS, key), None)
        if "host" not in mapping:
            raise self.fail(f"{key}.host", "missing; expected the task's host name")
        host = self.read_host(mapping["host"], f"{key}.host")
        port: Any = mapping.get("port")
        if port is None:  # "host:port", else any free port ('auto')
            try:
                host, port = parse_host_port(host)
            except ValueError:
                if ":" in host and not host.startswith("["):
                    raise self.fail(f"{key}.host", f"expected HOST or HOST:PORT, got {host!r}") from None
                port = AUTO
        elif ":" in host and not host.startswith("[") and host.count(":") == 1:
            raise self.fail(f"{key}.host", f"{host!r} has a port and 'port' is also set; expected one of them")
        # A key the entry leaves out takes its default unread: most entries give a host and a port
        # alone, and a cluster file has thousands of them.
        task = TaskSpec(
            role=role,
            index=index,
            host=host.strip("[]"),
            port=collect(lambda: self.read_port(port, f"{key}.port"), AUTO),
            address=collect(lambda: self.optional_str(mapping, "address", key), None) if "address" in mapping else None,
            gpus=collect(lambda: self.read_gpus(mapping["gpus"], f"{key}.gpus"), ()) if "gpus" in mapping else (),
            env=collect(lambda: self.read_env(mapping["env"], f"{key}.env"), {}) if "env" in mapping else {},
            workdir=collect(lambda: self.optional_str(mapping, "workdir", key), None) if "workdir" in mapping else None,
            python=collect(lambda: self.optional_str(mapping, "python", key), None) if "python" in mapping else None,
            setup=collect(lambda: self.optional_str(mapping, "setup", key), None) if "setup" in mapping else None,
            key=key,
        )
        return task if len(self.problems) == problems else None

    def _read_ssh(self, value: Any, key: str) -> SshSettings:
        if value is None:
            return SshSettings()
        mapping = self.expect_mapping(value, key, "a mapping of ssh settings")
        self.check_keys(mapping, SSH_KEYS, key)
        options = mapping.get("options", [])
        if isinstance(options, str):
            try:
                options = shlex.split(options)
            except ValueError as exc:
                raise self.fail(f"{key}.options", f"cannot split {options!r} ({exc})") from None
        if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
            raise self.fail(f"{key}.options", f"expected a list of ssh arguments, got {show(options)}")
        port = mapping.get("port")
        return SshSettings(
            user=self.optional_str(mapping, "user", key),
            port=None if port is None else self.read_fixed_port(port, f"{key}.port"),
            identity_file=self.optional_str(mapping, "identity_file", key),
            options=tuple(options),
            connect_timeout=self.optional_seconds(mapping, "connect_timeout", key),
            keepalive_timeout=self.optional_seconds(mapping, "keepalive_timeout", key),
        )

    def _read_hosts(self, value: Any) -> dict[str, HostSettings]:
        if value is None:
            return {}
        mapping = self.collect(lambda: self.expect_mapping(value, "hosts", "a mapping of host name to host settings"), {})
        hosts: dict[str, HostSettings] = {}
        for name, raw in mapping.items():
            settings = self.collect(lambda: self._read_host_settings(name, raw), None)
            if settings is not None:
                hosts[str(name)] = settings
        return hosts

    def _read_host_settings(self, name: Any, raw: Any) -> HostSettings:
        key = f"hosts.{name}"
        self.read_host(name, key)
        settings = self.expect_mapping(raw or {}, key, "a mapping of host settings")
        self.check_keys(settings, HOST_KEYS, key)
        return HostSettings(
            ssh=self._read_ssh(settings.get("ssh"), f"{key}.ssh"),
            workdir=self.optional_str(settings, "workdir", key),
            python=self.optional_str(settings, "python", key),
            setup=self.optional_str(settings, "setup", key),
            env=self.read_env(settings.get("env"), f"{key}.env"),
        )

