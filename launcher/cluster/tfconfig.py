"""A task's TF_CONFIG kept in parts, so that a cluster of n tasks costs n, not n squared.

TF_CONFIG names every task of the cluster, so n TF_CONFIGs kept as text take n times the
cluster's size (about 80 MB for 2,048 tasks, 1.3 GB for 8,192). A :class:`TfConfig` holds the
cluster's JSON text, one string shared by every task that sees that cluster, and the task's own
role and index; a launch's env (a :class:`TaskEnv`) renders it as text only when it is read. The
transports send each cluster to a host's agent once, and the agent writes each task's TF_CONFIG
(see :mod:`launcher.agent.starting`). Linux refuses an environment variable longer than
``ENV_STRING_MAX``, so a cluster whose TF_CONFIG would be is refused when it is planned.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Mapping, Union

from ..errors import ConfigError
from .spec import ClusterSpec
from .spec import Role

# Linux refuses an environment string ("NAME=value" and its NUL) longer than 32 pages (MAX_ARG_STRLEN).
ENV_STRING_MAX = 32 * 4096


@dataclass(frozen=True)
class TfConfig:
    """A task's TF_CONFIG in parts: ``cluster`` is the JSON text of the cluster the task sees (one
    string shared by all the tasks that see the same cluster), ``role`` and ``index`` its own.
    Its repr leaves the cluster out: it is as long as the cluster is large."""

    cluster: str = field(repr=False)
    role: str
    index: int

    def text(self) -> str:
        """TF_CONFIG as the task gets it (the same text as ``json.dumps`` with compact separators)."""
        return f'{{"cluster":{self.cluster},{self._task()}}}'

    def task_text(self) -> str:
        """TF_CONFIG without its cluster: ``{"task": {...}}``."""
        return f'{{{self._task()}}}'

    def _task(self) -> str:
        return f'"task":{{"type":{_json_text(self.role)},"index":{self.index}}}'


@functools.lru_cache(maxsize=64)  # a role's name, written for every task of a cluster of thousands
def _json_text(text: str) -> str:
    return json.dumps(text)


class TaskEnv(MutableMapping[str, str]):
    """A task's added environment: a mapping whose ``TF_CONFIG`` is kept as a :class:`TfConfig`,
    rendered as text only when it is read."""

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, Union[str, TfConfig]]):
        self._values = dict(values)

    def __getitem__(self, key: str) -> str:
        value = self._values[key]
        return value.text() if isinstance(value, TfConfig) else value

    def __setitem__(self, key: str, value: str) -> None:
        self._values[key] = value

    def __delitem__(self, key: str) -> None:
        del self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"TaskEnv({self._values!r})"

    @property
    def tf_config(self) -> TfConfig | None:
        value = self._values.get("TF_CONFIG")
        return value if isinstance(value, TfConfig) else None

    def with_task_text(self) -> dict[str, str]:
        """Every variable, in order, with a TF_CONFIG kept in parts as its task alone (``{"task": ...}``)."""
        return {key: value.task_text() if isinstance(value, TfConfig) else value for key, value in self._values.items()}

    def without_tf_config(self) -> dict[str, str]:
        """Every variable but a TF_CONFIG kept in parts (which the caller sends by its parts)."""
        return {key: value for key, value in self._values.items() if not isinstance(value, TfConfig)}


def tf_config_parts(env: Mapping[str, str]) -> tuple[TfConfig | None, dict[str, str]]:
    """(the TF_CONFIG in parts, every other variable) of a launch's env; (None, all of it) when
    TF_CONFIG is plain text (a launch made by hand) or absent."""
    if isinstance(env, TaskEnv) and env.tf_config is not None:
        return env.tf_config, env.without_tf_config()
    return None, dict(env)


def check_tf_config_size(spec: ClusterSpec, cluster_text: Mapping[bool, str]) -> None:
    """Refuse a cluster whose TF_CONFIG cannot reach a task: execve refuses the whole start (E2BIG)."""
    longest = max((TfConfig(cluster_text[t.role == Role.EVALUATOR], t.role, t.index) for t in spec.tasks),
                  key=lambda tf: len(tf.cluster) + len(tf.role) + len(str(tf.index)), default=None)
    if longest is None:
        return
    size = len("TF_CONFIG=") + len(longest.text().encode()) + 1
    if size > ENV_STRING_MAX:
        raise ConfigError(spec.source, "", f"{len(spec.tasks)} tasks: their TF_CONFIG takes {size:,} bytes, more "
                          f"than the {ENV_STRING_MAX:,} Linux lets one environment variable have (MAX_ARG_STRLEN); "
                          "shorter host names or fewer tasks (several GPUs per task) fit")
