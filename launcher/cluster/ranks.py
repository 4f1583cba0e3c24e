"""Each task's rank and the cluster's size, as torchrun users know them: ``TFLAUNCH_RANK``,
``TFLAUNCH_WORLD_SIZE``, ``TFLAUNCH_LOCAL_RANK`` and ``TFLAUNCH_LOCAL_WORLD_SIZE``.

:func:`rank_env` is pure: the cluster's tasks and the host each runs on in, the variables out.

- The training tasks are the chief and the workers. They are ranked as TensorFlow ranks them
  (``tf.distribute``'s ``multi_worker_util.id_in_cluster``, MultiWorkerMirroredStrategy's task
  order): the chief is rank 0, then worker ``i`` is rank ``i + 1`` (``i`` when there is no
  chief). So rank 0 is the task that saves, and a rank is the task's place in TF_CONFIG's chief
  and worker lists, in that order.
- ``TFLAUNCH_WORLD_SIZE`` is the number of training tasks, as TensorFlow's ``worker_count``.
- ``TFLAUNCH_LOCAL_RANK`` is a training task's place among the training tasks on its host, in
  rank order; ``TFLAUNCH_LOCAL_WORLD_SIZE`` is how many of them that host runs.
- ``ps`` and ``evaluator`` tasks train no replica: they get ``TFLAUNCH_WORLD_SIZE`` only, and no
  rank, so that a ``rank == 0`` test never picks one of them (TensorFlow gives a ps no id, and
  an evaluator one of its own, 0, which would clash with the chief's).
"""

from __future__ import annotations

from typing import Mapping, Sequence

from ..taskenv import LOCAL_RANK, LOCAL_WORLD_SIZE, RANK, WORLD_SIZE
from .spec import Role, TaskSpec

TRAINING_ROLES = (Role.CHIEF, Role.WORKER)  # in rank order


def deciding_roles(has_ps: bool) -> tuple[Role, ...]:
    """The roles whose success ends training: the chief alone with ps tasks (its workers wait in
    ``server.join()``), else the chief and the workers."""
    return (Role.CHIEF,) if has_ps else TRAINING_ROLES


def rank_env(tasks: Sequence[TaskSpec], host_of: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """Task name -> its rank variables (rules in the module docstring). ``host_of``: task name ->
    the machine it runs on, one name per machine (tasks of one host count together)."""
    order = {role: place for place, role in enumerate(TRAINING_ROLES)}
    training = sorted((t for t in tasks if t.role in order), key=lambda t: (order[t.role], t.index))
    size = str(len(training))
    per_host: dict[str, list[str]] = {}
    local_rank: dict[str, int] = {}  # a task's place among its host's training tasks, in rank order
    for task in training:
        mates = per_host.setdefault(host_of[task.name], [])
        local_rank[task.name] = len(mates)
        mates.append(task.name)
    ranked = {task.name: rank for rank, task in enumerate(training)}
    env = {}
    for task in tasks:
        name = task.name
        rank = ranked.get(name)
        if rank is None:
            env[name] = {WORLD_SIZE: size}
            continue
        env[name] = {RANK: str(rank), WORLD_SIZE: size, LOCAL_RANK: str(local_rank[name]),
                     LOCAL_WORLD_SIZE: str(len(per_host[host_of[name]]))}
    return env
