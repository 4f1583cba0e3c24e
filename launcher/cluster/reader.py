"""Cluster files turned into a validated :class:`ClusterSpec` (``--local N`` is :mod:`.local`'s).

Everything here is pure: YAML text in, frozen dataclasses out. Each validation error is a
:class:`ConfigError` naming the file, the key path, the bad value and what was expected.
Nothing starts before the whole file has been checked.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError
from ..options import MAX_RESTARTS, RESTART_DELAY
from .yamlfile import ClusterLoader, DuplicateKey
from .checks import check_cluster
from .fields import FieldReader, join_key, show
from .spec import (  # noqa: F401  (re-exported: the spec is part of this module's interface)
    AUTO,
    DEFAULT_TASK_RESTARTS,
    ROLES,
    ClusterSpec,
    RestartPolicy,
    HostSettings,
    SshSettings,
    TaskSpec,
    check_text,
    is_local,
    text_problem,
)

CLUSTER_KEYS = ("command", "env", "log_dir", "share_gpus", "threads", "workdir", "python", "setup", "ssh",
                "hosts", "max_restarts", "restart_delay", "restart_policy", "task_restarts", "kubernetes", "slurm", "isolate_network") + ROLES
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
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "YAML"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(source, where, f"invalid YAML: {problem}") from None
    return _ClusterReader(source, local_hosts, slurm_template).read(data)


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

    def read(self, data: Any) -> ClusterSpec:
        if data is None:
            raise self.fail("", "the cluster file is empty; expected roles such as 'worker:'")
        if isinstance(data, list):  # short form: a list of host:port workers
            data = {"worker": data}
        self._check_strings(data, "")
        mapping = self.expect_mapping(data, "", "a mapping of cluster keys or a list of host:port workers")
        self.check_keys(mapping, CLUSTER_KEYS, "")
        tasks: list[TaskSpec] = []
        for role in ROLES:
            if role in mapping:
                tasks += self._read_role(role, mapping[role])
        spec = ClusterSpec(
            source=self.source,
            tasks=tuple(tasks),
            command=self.read_command(mapping["command"], "command") if "command" in mapping else None,
            env=self.read_env(mapping.get("env"), "env"),
            log_dir=self.optional_str(mapping, "log_dir", ""),
            share_gpus=self.read_bool(mapping.get("share_gpus", False), "share_gpus"),
            threads=self.read_threads(mapping.get("threads", AUTO)),
            workdir=self.optional_str(mapping, "workdir", ""),
            python=self.optional_str(mapping, "python", ""),
            setup=self.optional_str(mapping, "setup", ""),
            ssh=self._read_ssh(mapping.get("ssh"), "ssh"),
            hosts=self._read_hosts(mapping.get("hosts")),
            max_restarts=self.read_count(mapping.get("max_restarts", MAX_RESTARTS), "max_restarts"),
            restart_delay=self.read_seconds(mapping.get("restart_delay", RESTART_DELAY), "restart_delay", allow_zero=True),
            restart_policy_by_role=self._read_restart_policy(mapping.get("restart_policy")),
            task_restarts=int(self.read_count(mapping.get("task_restarts", DEFAULT_TASK_RESTARTS), "task_restarts")),
            isolate_network=self.read_bool(mapping.get("isolate_network", False), "isolate_network"),
            kubernetes=None if mapping.get("kubernetes") is None else self.expect_mapping(
                mapping["kubernetes"], "kubernetes", "a mapping of Kubernetes settings"),
            slurm=None if mapping.get("slurm") is None else self.expect_mapping(
                mapping["slurm"], "slurm", "a mapping of Slurm settings"),
        )
        if spec.slurm is not None and not spec.tasks:
            if self.slurm_template:
                return spec  # the roles come from the Slurm allocation
            raise self.fail("slurm", "this file's roles come from a Slurm allocation; run it with 'tflaunch "
                            f"submit {self.source}', or inside an allocation with 'tflaunch --slurm {self.source}'")
        check_cluster(spec, self.local_hosts)
        task_hosts = sorted({t.host for t in spec.tasks})
        for name in spec.hosts:
            if name not in task_hosts:
                import difflib  # only a mistake needs it

                close = difflib.get_close_matches(name, task_hosts, n=1)
                hint = f"did you mean '{close[0]}'?" if close else f"expected one of the tasks' hosts: {', '.join(task_hosts)}"
                raise self.fail(f"hosts.{name}", f"no task runs on this host; {hint}")
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
            raise self.fail(role, f"expected a list of tasks, got {show(value)}")
        return [self._read_task(role, i, item) for i, item in enumerate(value)]

    def _read_task(self, role: str, index: int, item: Any) -> TaskSpec:
        key = f"{role}[{index}]"
        if isinstance(item, str):
            item = {"host": item}  # "host:port" short form, split below
        mapping = self.expect_mapping(item, key, "a task mapping or a 'host:port' string")
        self.check_keys(mapping, TASK_KEYS, key)
        if "host" not in mapping:
            raise self.fail(f"{key}.host", "missing; expected the task's host name")
        host = self.read_host(mapping["host"], f"{key}.host")
        port: Any = mapping.get("port")
        if port is None:
            try:
                host, port = parse_host_port(host)
            except ValueError:
                raise self.fail(f"{key}.port", f"missing; expected a port 1-65535 or 'auto' (host is {host!r})") from None
        elif ":" in host and not host.startswith("[") and host.count(":") == 1:
            raise self.fail(f"{key}.host", f"{host!r} has a port and 'port' is also set; expected one of them")
        return TaskSpec(
            role=role,
            index=index,
            host=host.strip("[]"),
            port=self.read_port(port, f"{key}.port"),
            address=self.optional_str(mapping, "address", key),
            gpus=self.read_gpus(mapping.get("gpus", []), f"{key}.gpus"),
            env=self.read_env(mapping.get("env"), f"{key}.env"),
            workdir=self.optional_str(mapping, "workdir", key),
            python=self.optional_str(mapping, "python", key),
            setup=self.optional_str(mapping, "setup", key),
            key=key,
        )

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
            port=None if port is None else self.read_ssh_port(port, f"{key}.port"),
            identity_file=self.optional_str(mapping, "identity_file", key),
            options=tuple(options),
            connect_timeout=self.optional_seconds(mapping, "connect_timeout", key),
            keepalive_timeout=self.optional_seconds(mapping, "keepalive_timeout", key),
        )

    def _read_hosts(self, value: Any) -> dict[str, HostSettings]:
        if value is None:
            return {}
        mapping = self.expect_mapping(value, "hosts", "a mapping of host name to host settings")
        hosts: dict[str, HostSettings] = {}
        for name, raw in mapping.items():
            key = f"hosts.{name}"
            name = self.read_host(name, key)
            settings = self.expect_mapping(raw or {}, key, "a mapping of host settings")
            self.check_keys(settings, HOST_KEYS, key)
            hosts[str(name)] = HostSettings(
                ssh=self._read_ssh(settings.get("ssh"), f"{key}.ssh"),
                workdir=self.optional_str(settings, "workdir", key),
                python=self.optional_str(settings, "python", key),
                setup=self.optional_str(settings, "setup", key),
                env=self.read_env(settings.get("env"), f"{key}.env"),
            )
        return hosts

