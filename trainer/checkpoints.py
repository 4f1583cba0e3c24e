"""Per-epoch checkpoints for an evaluator task, written while training.

tf.train.Checkpoint(model=..., optimizer=...) saved by a CheckpointManager as
ckpt-<epoch> (epochs counted from 1), the layout tf.keras.utils.SidecarEvaluator
also reads. The last KEEP checkpoints are kept. Every worker saves, as TensorFlow
requires under MultiWorkerMirroredStrategy; only the chief writes into
--checkpoint-dir, the others into a scratch folder that is removed after each save.
When training has ended the chief writes the marker of trainer.handoff.
"""

from __future__ import annotations

import os
import shutil

import tensorflow as tf

from trainer import handoff
from trainer.session import Session

KEEP = 3


class EpochCheckpoints:
    def __init__(self, session: Session, model, optimizer):
        self.session = session
        directory = session.checkpoint_write_dir()
        if session.is_chief:
            os.makedirs(directory, exist_ok=True)
            # A marker from an earlier run in this folder must not end this run's evaluator.
            handoff.remove_marker(directory)
        checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
        self.manager = tf.train.CheckpointManager(checkpoint, directory, max_to_keep=KEEP, checkpoint_name="ckpt")

    def save(self, epoch: int) -> None:
        """Save the state after ``epoch`` (counted from 1)."""
        self.manager.save(checkpoint_number=epoch)
        if not self.session.is_chief:
            shutil.rmtree(self.manager.directory, ignore_errors=True)

    def finish(self, epochs: int) -> None:
        """Tell the evaluator that training has ended (chief only)."""
        latest = self.manager.latest_checkpoint
        if self.session.is_chief and latest:
            handoff.write_marker(self.manager.directory, epochs=epochs, checkpoint=latest,
                                 run_id=handoff.run_id_of(os.environ))


def for_session(session: Session, model, optimizer) -> EpochCheckpoints | None:
    return EpochCheckpoints(session, model, optimizer) if session.args.checkpoint_dir else None
