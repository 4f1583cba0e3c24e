"""Training with a custom loop: strategy.run over strategy.experimental_distribute_dataset.

Each replica averages its per-example loss over the global batch
(tf.nn.compute_average_loss), so summing the replicas' gradients gives the
gradient of the global mean loss; the per-replica losses are summed with
strategy.reduce. Backups use tf.train.CheckpointManager with the epoch and the
step within it saved in the checkpoint.
"""

from __future__ import annotations

import shutil

import tensorflow as tf

from trainer import inputs, termination
from trainer.kerasapi import keras
from trainer.metrics import EpochClock
from trainer.session import Session
from trainer.tensorboard import logger_for

SUM = tf.distribute.ReduceOp.SUM


class CustomLoop:
    """Owns the step functions, the loss and the metric for one model under one strategy."""

    def __init__(self, session: Session, model: keras.Model, optimizer: keras.optimizers.Optimizer):
        self.session = session
        self.strategy = session.strategy
        self.model = model
        self.optimizer = optimizer
        with self.strategy.scope():
            # Build the slots now so a restored checkpoint fills them right away.
            optimizer.build(model.trainable_variables)
            self.loss_fn = keras.losses.SparseCategoricalCrossentropy(
                reduction="none")
            self.train_accuracy = keras.metrics.SparseCategoricalAccuracy()
        # Completed epochs, and steps completed in the current epoch, for resuming.
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")

    @tf.function
    def train_step(self, iterator, stop_asked):
        """One step on every replica: (the global batch's mean loss, how many replicas' workers
        had been asked to stop before it). Both are reduced together, so every worker learns of a
        SIGTERM that reached any of them after the same step, and all save there: workers that
        each looked only at their own signal could stop a step apart, one saving while another
        waits in the next step's collective for a peer that is gone."""
        global_batch = self.session.global_batch

        def step_fn(batch):
            x, y = batch
            with tf.GradientTape() as tape:
                probs = self.model(x, training=True)
                per_example = self.loss_fn(y, probs)
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            grads = tape.gradient(loss, self.model.trainable_variables)
            self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
            self.train_accuracy.update_state(y, probs)
            return tf.stack([tf.cast(loss, tf.float32), stop_asked])

        per_replica = self.strategy.run(step_fn, args=(next(iterator),))
        loss, stops = tf.unstack(self.strategy.reduce(SUM, per_replica, axis=None))
        return loss, stops

    @tf.function
    def eval_step(self, batch):
        def step_fn(batch):
            x, y = batch
            probs = self.model(x, training=False)
            y = tf.cast(y, tf.int32)
            predicted = tf.argmax(probs, axis=-1, output_type=tf.int32)
            return (tf.reduce_sum(self.loss_fn(y, probs)),
                    tf.reduce_sum(tf.cast(tf.equal(predicted, y), tf.float32)),
                    tf.cast(tf.shape(y)[0], tf.float32))

        per_replica = self.strategy.run(step_fn, args=(batch,))
        return [self.strategy.reduce(SUM, value, axis=None) for value in per_replica]

    def evaluate(self, x, y) -> tuple[float, float]:
        """(mean loss, accuracy) over x, y, sharded across the workers."""
        dataset = self.strategy.experimental_distribute_dataset(
            inputs.eval_dataset(x, y, self.session.global_batch))
        loss_sum = correct = count = 0.0
        # tf.distribute hands empty batches to workers whose shard ran out, so
        # every worker runs the same number of steps and sums stay exact.
        for batch in dataset:
            batch_loss, batch_correct, batch_count = self.eval_step(batch)
            loss_sum += float(batch_loss)
            correct += float(batch_correct)
            count += float(batch_count)
        return loss_sum / max(count, 1.0), correct / max(count, 1.0)

    def train(self, checkpoints=None) -> None:
        """Train for --epochs; checkpoints, when given, gets a checkpoint after every epoch."""
        session, args, splits = self.session, self.session.args, self.session.splits
        backup = Backup(session, self) if args.backup_dir else None
        first_epoch, first_step = backup.restore() if backup else (0, 0)
        dataset = self.strategy.experimental_distribute_dataset(
            inputs.train_dataset(splits.x_train, splits.y_train, session.global_batch, args.seed))
        iterator = iter(dataset)
        scalars = logger_for(session.tensorboard_write_dir())
        clock = EpochClock(session.global_batch)
        # Counted across epochs, as BackupAndRestore counts batches for --backup-every N.
        steps_since_backup = 0
        for epoch in range(first_epoch, args.epochs):
            clock.begin()
            self.train_accuracy.reset_state()
            total_loss, steps = 0.0, 0
            for step in range(first_step if epoch == first_epoch else 0, session.steps_per_epoch):
                loss, stops = self.train_step(iterator, tf.constant(float(termination.requested())))
                total_loss += float(loss)
                steps += 1
                clock.step_done()
                steps_since_backup += 1
                if backup and args.backup_every and steps_since_backup >= args.backup_every:
                    backup.save(epoch, step + 1)
                    steps_since_backup = 0
                if backup and float(stops) > 0:
                    termination.saving()
                    backup.save(epoch, step + 1)
                    session.reporter.say(f"SIGTERM: backup saved in epoch {epoch + 1} after step {step + 1}; "
                                        "the next run resumes after it")
                    termination.end()
            val_loss, val_accuracy = self.evaluate(splits.x_val, splits.y_val)
            logs = {"loss": total_loss / max(steps, 1), "accuracy": float(self.train_accuracy.result()),
                    "val_loss": val_loss, "val_accuracy": val_accuracy}
            if backup and not args.backup_every:
                backup.save(epoch + 1, 0)
            if checkpoints is not None:
                checkpoints.save(epoch + 1)
            if scalars is not None:
                scalars.epoch(epoch + 1, logs)
            session.reporter.epoch(
                epoch=epoch + 1, logs=logs, timing=clock.figures(clock.samples_per_second()),
                global_batch=session.global_batch, replicas=session.replicas, epochs=args.epochs)
        if backup:
            backup.finish()
        if scalars is not None:
            scalars.close()


class Backup:
    """Checkpoints the model, optimizer, epoch and step for resuming a custom-loop run.

    Every worker saves (the same pattern as BackupAndRestore); all restore from the chief's folder.
    """

    def __init__(self, session: Session, loop: CustomLoop):
        self.session = session
        self.loop = loop
        read_dir, write_dir = session.backup_dirs()
        checkpoint = tf.train.Checkpoint(model=loop.model, optimizer=loop.optimizer,
                                         epoch=loop.epoch, step=loop.step)
        self.reader = tf.train.CheckpointManager(checkpoint, read_dir, max_to_keep=1)
        self.writer = (self.reader if write_dir == read_dir
                       else tf.train.CheckpointManager(checkpoint, write_dir, max_to_keep=1))

    def restore(self) -> tuple[int, int]:
        """(epoch, step) to start from: (0, 0) without a backup."""
        if self.reader.restore_or_initialize() is None:
            return 0, 0
        keeper = self.session.keeper
        epoch, step = keeper.resume_point(int(self.loop.epoch.numpy()), int(self.loop.step.numpy()))
        note = keeper.note(epoch)
        if note:
            self.session.reporter.say(note)
        where = f"epoch {epoch + 1}" + (f" step {step + 1}" if step else "")
        self.session.reporter.say(f"resuming from backup at {where}")
        return epoch, step

    def save(self, epoch: int, step: int) -> None:
        self.loop.epoch.assign(epoch)
        self.loop.step.assign(step)
        self.session.keeper.before_backup()
        self.writer.save()
        self.session.keeper.after_backup()
        if self.writer is not self.reader:
            shutil.rmtree(self.writer.directory, ignore_errors=True)

    def finish(self) -> None:
        """A finished run leaves no backup, so the next run starts afresh (as BackupAndRestore does)."""
        if self.writer is self.reader:
            shutil.rmtree(self.reader.directory, ignore_errors=True)
