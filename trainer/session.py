"""What one training run knows once its strategy exists, and where this task writes.

Only the chief writes into --model-dir, --tensorboard-dir and --checkpoint-dir. The other workers
still take part in saving models and checkpoints (under MultiWorkerMirroredStrategy saving may
read synchronised variables, which needs every worker), but they write into a
private temporary directory that is removed when the run ends, even on error.
TensorBoard scalars are plain eager writes of values every worker already has, so the other
workers write none.
Backups follow TensorFlow's layout: the chief writes BACKUP/chief, other workers
write BACKUP/workertemp_<index> and remove it after each backup.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any

from trainer.cluster import TaskInfo
from trainer.data import Splits
from trainer.metrics import Reporter
from trainer.resize import Keeper


@dataclass
class Session:
    """Everything the training loops need; built by trainer.train once the strategy exists."""

    args: argparse.Namespace
    task: TaskInfo
    strategy: Any
    splits: Splits
    reporter: Reporter
    replicas: int
    global_batch: int
    steps_per_epoch: int
    scratch: "Scratch" = field(default=None)
    keeper: Keeper | None = None  # with --backup-dir: the record of the cluster's shape (trainer.resize)

    @property
    def is_chief(self) -> bool:
        return self.task.is_chief

    def model_write_dir(self) -> str | None:
        if not self.args.model_dir:
            return None
        return self.args.model_dir if self.is_chief else self.scratch.path("model")

    def tensorboard_write_dir(self) -> str | None:
        return self.args.tensorboard_dir if self.is_chief else None

    def checkpoint_write_dir(self) -> str | None:
        if not self.args.checkpoint_dir:
            return None
        return self.args.checkpoint_dir if self.is_chief else self.scratch.path("checkpoints")

    def backup_dirs(self) -> tuple[str, str] | None:
        """(read_dir, write_dir) for custom-loop backups, or None without --backup-dir."""
        if not self.args.backup_dir:
            return None
        read_dir = os.path.join(self.args.backup_dir, "chief")
        if self.is_chief:
            return read_dir, read_dir
        return read_dir, os.path.join(self.args.backup_dir, f"workertemp_{self.task.task_index}")


class Scratch:
    """A temporary directory for a non-chief task's throwaway outputs, created on first use."""

    def __init__(self, label: str):
        self._label = label
        self._root: str | None = None

    def path(self, name: str) -> str:
        if self._root is None:
            self._root = tempfile.mkdtemp(prefix=f"trainer-{self._label}-")
        return os.path.join(self._root, name)

    def remove(self) -> None:
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def __enter__(self) -> "Scratch":
        return self

    def __exit__(self, *exc_info) -> None:
        self.remove()
