"""Whole-cluster checks that no single value shows: roles, duplicate host:port, GPU claims; and the
warning for GPUs asked of this machine that it does not have."""

from __future__ import annotations

from typing import Callable

from ..errors import ConfigError, ConfigErrors
from .spec import AUTO, ClusterSpec, TaskSpec, is_local
from .spec import Role


def check_cluster(spec: ClusterSpec, local_hosts: frozenset[str]) -> None:
    """Raise every whole-cluster problem of ``spec`` together (see :func:`cluster_problems`)."""
    problems = cluster_problems(spec, local_hosts)
    if problems:
        raise ConfigErrors.of(problems)


def cluster_problems(spec: ClusterSpec, local_hosts: frozenset[str]) -> list[ConfigError]:
    """The roles' problems, every duplicate host:port and every GPU claimed twice, one error each."""
    fail: Callable[[str, str], ConfigError] = lambda key, msg: ConfigError(spec.source, key, msg)  # noqa: E731
    problems = []
    chiefs, workers = spec.role_tasks(Role.CHIEF), spec.role_tasks(Role.WORKER)
    if not chiefs and not workers:
        problems.append(fail("worker", "missing; expected at least one 'worker' (or a 'chief') task"))
    if len(chiefs) > 1:
        problems.append(fail("chief", f"expected at most one chief, got {len(chiefs)}"))
    if len(spec.role_tasks(Role.EVALUATOR)) > 1:
        problems.append(fail("evaluator", f"expected at most one evaluator, got {len(spec.role_tasks(Role.EVALUATOR))}"))
    if spec.has_ps and not chiefs:
        problems.append(fail("chief", "missing; a cluster with 'ps' tasks needs a chief to coordinate training"))
    floor = floor_problem(spec, spec.min_workers) if spec.training_count else None
    if floor:
        problems.append(fail("min_workers", floor))
    seen_ports: dict[tuple[str, int], TaskSpec] = {}
    for task in spec.slots:
        local = is_local(task.host, local_hosts)
        if task.port != AUTO:
            where = ("this machine" if local else task.host, int(task.port))
            if where in seen_ports:
                other = seen_ports[where]
                problems.append(fail(f"{task.key}.port", f"{task.host}:{task.port} is also used by {other.key}; "
                                                         "expected a distinct host:port"))
                continue
            seen_ports[where] = task
    return problems + _gpu_sharing_problems(spec, local_hosts)


def floor_problem(spec: ClusterSpec, min_workers: int | None) -> str | None:
    """Why ``min_workers`` cannot be the cluster's floor (more than its training tasks), or None."""
    training = spec.training_count
    if min_workers is None or min_workers <= training:
        return None
    return f"{min_workers} is more than the cluster's {training} training tasks (chief and workers); expected 1 to {training}"


def _gpu_sharing_problems(spec: ClusterSpec, local_hosts: frozenset[str]) -> list[ConfigError]:
    if spec.share_gpus:
        return []
    problems = []
    claims: dict[tuple[str, int | None], TaskSpec] = {}
    for task in spec.tasks:
        host = "this machine" if is_local(task.host, local_hosts) else task.host
        wanted: tuple[int | None, ...] = (None,) if task.gpus is None else task.gpus
        for gpu in wanted:
            # None stands for "every GPU": it collides with any claim on the same host.
            clashes = [t for (h, g), t in claims.items() if h == host and (g == gpu or g is None or gpu is None)]
            if clashes:
                label = "all GPUs" if gpu is None else f"GPU {gpu}"
                problems.append(ConfigError(spec.source, f"{task.key}.gpus",
                                            f"{label} on {task.host} is also claimed by {clashes[0].key}; "
                                            "expected distinct GPUs per host or 'share_gpus: true'"))
                break  # one line per task
            claims[(host, gpu)] = task
    return problems


def missing_gpus_warning(spec: ClusterSpec, local_hosts: frozenset[str], gpus_here: int | None) -> str | None:
    """One line when tasks on this machine are given GPU indices it does not have (``gpus_here``, as
    :func:`launcher.cluster.machine.gpu_count` counts them; None: unknown, no warning): TensorFlow
    then runs them on the CPU without a word, which a run that asked for GPUs should hear of."""
    if gpus_here is None:
        return None
    wanting = [t for t in spec.tasks if t.gpus and is_local(t.host, local_hosts)]
    missing = sorted({gpu for t in wanting for gpu in t.gpus if gpu >= gpus_here})
    if not missing:
        return None
    asked = [t.name for t in wanting if any(gpu in missing for gpu in t.gpus)]
    ids = ",".join(map(str, missing))
    to = f"{', '.join(asked[:3])}{' and others' if len(asked) > 3 else ''}"
    if gpus_here == 0:
        return (f"warning: this machine has no GPU, but GPU {ids} is given to {to}; "
                f"{'they' if len(asked) > 1 else 'it'} will run on the CPU")
    return (f"warning: this machine has {gpus_here} GPU{'s' if gpus_here > 1 else ''} (0-{gpus_here - 1}), but GPU "
            f"{ids} is given to {to}; TensorFlow will not see {'them' if len(missing) > 1 else 'it'}")
