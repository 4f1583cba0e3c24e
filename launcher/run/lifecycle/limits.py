"""Open-file limits: tflaunch raises its own soft limit to the hard one (its tasks keep the user's),
and refuses a run that would not fit before anything starts.

What a run holds open grows with its hosts, not its tasks: per host a channel to its agent (two
pipe ends and a file for the carrier's messages, or one connection from a Slurm node); per task
nothing while it runs, because the output pump keeps at most ``OPEN_FILES`` (:mod:`launcher.run.output`) of the task logs
open and each transport's log writer, which appends their relayed output, at most
``transports.base.OPEN_LOGS``.
"""

from __future__ import annotations

from ...cluster.machine import raise_open_files_limit
from ...cluster.spec import ClusterSpec, is_local
from ...errors import EnvironmentProblem
from ...records.states import plural
from ...transports.base import OPEN_LOGS
from ..output import OPEN_FILES

BASE = 48  # the interpreter, the console, the run's own files, signal and wakeup pipes, the port lock
PER_HOST = 4


def descriptors_needed(tasks: int, hosts: int, remote_tasks: int) -> int:
    # The local transport's log writer and a remote one's each keep their own few files open.
    writers = min(tasks - remote_tasks, OPEN_LOGS) + min(remote_tasks, OPEN_LOGS)
    return BASE + PER_HOST * hosts + min(tasks, OPEN_FILES) + writers


def check_open_files(spec: ClusterSpec, local_hosts: frozenset[str]) -> int:
    """Raise the limit, then refuse the run in one line if it still cannot hold what it needs;
    returns how many descriptors the limit leaves to spare beyond that."""
    limit = raise_open_files_limit()
    local = [is_local(task.host, local_hosts) and spec.transport is None for task in spec.tasks]
    hosts = len({"localhost" if here else task.host for task, here in zip(spec.tasks, local)})
    needed = descriptors_needed(len(spec.tasks), hosts, local.count(False))
    if needed > limit:
        raise EnvironmentProblem(f"{spec.source}: this run needs about {needed} open files ({plural(len(spec.tasks), 'task')} on "
                                 f"{plural(hosts, 'host')}), but the limit is {limit} and cannot "
                                 f"be raised further; raise it with 'ulimit -n {needed}' (or in "
                                 "/etc/security/limits.conf) and run again")
    return limit - needed
