"""The cluster that ``--local N [--chief] [--ps K] [--gpus LIST]`` describes (pure, validated)."""

from __future__ import annotations

from ..errors import ConfigError
from ..options import name
from .checks import check_cluster
from .spec import AUTO, MAX_TASKS_PER_HOST, ClusterSpec, TaskSpec
from .spec import Role


def local_cluster(
    workers: int,
    *,
    chief: bool = False,
    ps: int = 0,
    gpus: tuple[int, ...] = (),
    command: tuple[str, ...] | None = None,
    log_dir: str | None = None,
    threads: int | str = AUTO,
    source: str | None = None,
) -> ClusterSpec:
    """The cluster that ``--local N [--chief] [--ps K] [--gpus LIST]`` describes.

    GPUs are dealt round-robin to the chief and workers (ps tasks stay on the CPU); when there
    are more such tasks than GPUs they share, which the user asked for by naming the GPUs.
    """
    source = source or f"--local {workers}"
    if workers < 1:
        raise ConfigError(source, name("local"), f"expected at least 1 worker, got {workers}")
    if ps < 0:
        raise ConfigError(source, name("ps"), f"expected 0 or more ps tasks, got {ps}")
    if workers + ps + int(chief or ps > 0) > MAX_TASKS_PER_HOST:
        raise ConfigError(source, name("local"), f"expected at most {MAX_TASKS_PER_HOST} tasks on this machine in "
                                                 f"all, got {workers + ps + int(chief or ps > 0)}")
    if ps and not chief:
        chief = True  # ParameterServerStrategy needs a coordinator: the chief
    if any(g < 0 for g in gpus) or len(set(gpus)) != len(gpus):
        raise ConfigError(source, name("gpus"), f"expected distinct GPU indices >= 0, got {','.join(map(str, gpus))}")
    roles = ([Role.CHIEF.value] if chief else []) + [Role.WORKER.value] * workers
    tasks: list[TaskSpec] = []
    counters = {Role.CHIEF: 0, Role.WORKER: 0}
    for n, role in enumerate(roles):
        task_gpus = (gpus[n % len(gpus)],) if gpus else ()
        tasks.append(TaskSpec(role, counters[role], "localhost", AUTO, gpus=task_gpus, key=f"{role}[{counters[role]}]"))
        counters[role] += 1
    tasks += [TaskSpec(Role.PS.value, i, "localhost", AUTO, key=f"{Role.PS}[{i}]") for i in range(ps)]
    spec = ClusterSpec(source=source, tasks=tuple(tasks), command=command, log_dir=log_dir,
                       share_gpus=bool(gpus) and len(roles) > len(gpus), threads=threads)
    check_cluster(spec, frozenset({"localhost"}))
    return spec
