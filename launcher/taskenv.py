"""The ``TFLAUNCH_*`` variables tflaunch puts in every task's environment, by name: their one owner
on the launcher's side.

The plan writes them (:mod:`launcher.cluster.plan`), the cluster checks reserve them, the export
writes them into pods and start scripts, and readers of a run record find paths in them. The
trainer reads some of them and keeps its own copy of those names, because the launcher and the
trainer never import each other; a test holds the two copies equal. The host agent's own variables
(``TFLAUNCH_AGENT_*``) are the agent's, in :mod:`launcher.agent.protocol`.

:data:`ENV_NAME` is what any variable of a task's environment may be called, wherever it is given
(a cluster file's ``env``, ``--env``, launch()'s ``env``).
"""

from __future__ import annotations

import re

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # a variable name, as a POSIX shell takes it

# Set for every task by tflaunch alone; no env layer may change them.
TASK = "TFLAUNCH_TASK"  # the task's name: worker-0, chief-0
RUN_ID = "TFLAUNCH_RUN_ID"
RUN_DIR = "TFLAUNCH_RUN_DIR"
ATTEMPT = "TFLAUNCH_ATTEMPT"  # 1, then one more for each restart of the whole cluster
# Ranks and sizes, as torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (launcher.cluster.ranks)
RANK = "TFLAUNCH_RANK"  # chief and workers only: 0 for the chief, then the workers by index
WORLD_SIZE = "TFLAUNCH_WORLD_SIZE"  # every task: the number of training tasks (chief and workers)
LOCAL_RANK = "TFLAUNCH_LOCAL_RANK"  # chief and workers only: its place among those on its host
LOCAL_WORLD_SIZE = "TFLAUNCH_LOCAL_WORLD_SIZE"  # chief and workers only: how many of those its host runs

# Offered by tflaunch (paths in the run folder); a value in tflaunch's own environment or an env
# layer wins.
BACKUP_DIR = "TFLAUNCH_BACKUP_DIR"  # when the run may restart: the trainer's BackupAndRestore folder
CHECKPOINT_DIR = "TFLAUNCH_CHECKPOINT_DIR"  # when there is an evaluator: the chief's per-epoch checkpoints
TENSORBOARD_DIR = "TFLAUNCH_TENSORBOARD_DIR"  # always: where TensorBoard scalars go
# Not a task's: tflaunch's own, on every node of a run its nodes join (launcher/sources/joined.py).
RDZV_TOKEN = "TFLAUNCH_RDZV_TOKEN"  # the token every node of such a run proves

OWNED = (TASK, RUN_ID, RUN_DIR, ATTEMPT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE)
OFFERED = (BACKUP_DIR, CHECKPOINT_DIR, TENSORBOARD_DIR)
