"""Training with Model.fit, under any strategy including ParameterServerStrategy (tf_keras).

Backups use BackupAndRestore, which restores the weights,
optimizer and epoch at the start of fit and writes non-chief backups to the
per-worker folders TensorFlow requires.

Under ParameterServerStrategy the workers train from a DatasetCreator (Keras
creates it on each worker with ClusterCoordinator.create_per_worker_dataset, so a
worker restarted in place gets its dataset again: see trainer.ps), and the
chief evaluates (validation each epoch, test at the end) itself with the current
variables from the ps tasks: Keras's distributed "exact evaluation" cannot shard
in-memory data in TF 2.21 ("Could not apply FILE based sharding").
"""

from __future__ import annotations

import time
from typing import Callable

import tensorflow as tf

from trainer import inputs, termination
from trainer.evaluation import exact_evaluator
from trainer.kerasapi import keras
from trainer.metrics import EpochClock
from trainer.session import Session
from trainer.tensorboard import ScalarLogger, logger_for
from trainer.strategy import is_parameter_server


class EpochMetrics(keras.callbacks.Callback):
    """Prints one metric line per epoch and says where a resumed run starts.

    Epoch-level hooks only, as ParameterServerStrategy requires: the rate is timed
    over the epoch's training phase and left out for the run's first epoch.
    validate, when given, computes val_loss and val_accuracy for the line.
    scalars, when given, also gets each epoch's values for TensorBoard.
    """

    def __init__(self, session: Session, validate: Callable[[], dict] | None = None,
                 scalars: ScalarLogger | None = None):
        super().__init__()
        self.session = session
        self.validate = validate
        self.scalars = scalars
        self.clock = EpochClock(session.global_batch)
        self.epoch = 0
        self.first_epoch: int | None = None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        if self.first_epoch is None:
            self.first_epoch = epoch
            self._announce_start(epoch, 0)
        self.clock.begin()

    def _announce_start(self, epoch: int, step: int) -> None:
        # BackupAndRestore moves fit's starting point; this is where it shows.
        if epoch > 0 or step > 0:
            where = f"epoch {epoch + 1}" + (f" step {step + 1}" if step > 0 else "")
            self.session.reporter.say(f"resuming from backup at {where}")

    def on_epoch_end(self, epoch, logs=None):
        self.clock.train_done(self.session.steps_per_epoch)
        logs = dict(logs or {})
        if self.validate is not None:
            logs.update(self.validate())
        rate = self.clock.samples_per_second() if epoch > self.first_epoch else None
        self._report(epoch, logs, rate)

    def _report(self, epoch, logs, rate) -> None:
        if self.scalars is not None:
            self.scalars.epoch(epoch + 1, logs)
        self.session.reporter.epoch(
            epoch=epoch + 1, logs=logs, timing=self.clock.figures(rate),
            global_batch=self.session.global_batch, replicas=self.session.replicas,
            epochs=self.session.args.epochs)


class StepMetrics(EpochMetrics):
    """EpochMetrics with per-step timing, so the rate leaves out each epoch's first step."""

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        self.clock.begin()

    def on_train_batch_begin(self, batch, logs=None):
        if self.first_epoch is None:
            self.first_epoch = self.epoch
            self._announce_start(self.epoch, batch)

    def on_train_batch_end(self, batch, logs=None):
        self.clock.step_done()

    def on_epoch_end(self, epoch, logs=None):
        self._report(epoch, dict(logs or {}), self.clock.samples_per_second())


class EpochCheckpointer(keras.callbacks.Callback):
    """Saves the per-epoch checkpoint an evaluator task reads (trainer.checkpoints)."""

    def __init__(self, checkpoints):
        super().__init__()
        self.checkpoints = checkpoints

    def on_epoch_end(self, epoch, logs=None):
        self.checkpoints.save(epoch + 1)


def compile_model(model: keras.Model, optimizer: keras.optimizers.Optimizer) -> None:
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", metrics=["accuracy"])


def train(session: Session, model: keras.Model, checkpoints=None) -> None:
    """Run Model.fit for --epochs, resuming from --backup-dir when it holds a backup.

    checkpoints, when given, gets a checkpoint after every epoch (for an evaluator task).
    """
    args, splits = session.args, session.splits
    ps_mode = is_parameter_server(session.strategy)
    scalars = logger_for(session.tensorboard_write_dir())
    callbacks = []
    if args.backup_dir:
        backup = backup_callback(session)
        callbacks.append(backup)
        if not ps_mode:  # Keras allows no batch-level callbacks under ParameterServerStrategy
            callbacks.append(SaveOnTermination(session, backup))
    if ps_mode:
        from trainer.ps import watch_workers

        watch_workers(session.reporter)
        evaluate_here = exact_evaluator(model, session.global_batch)

        def validate() -> dict:
            loss, accuracy = evaluate_here(splits.x_val, splits.y_val)
            return {"val_loss": loss, "val_accuracy": accuracy}

        callbacks.append(EpochMetrics(session, validate, scalars))
        train_data = keras.utils.experimental.DatasetCreator(inputs.per_worker_train_fn(
            splits.x_train, splits.y_train, session.global_batch, args.seed))
        val_data = None
    else:
        callbacks.append(StepMetrics(session, scalars=scalars))
        train_data = inputs.train_dataset(splits.x_train, splits.y_train, session.global_batch, args.seed)
        val_data = inputs.eval_dataset(splits.x_val, splits.y_val, session.global_batch)
    if checkpoints is not None:
        callbacks.append(EpochCheckpointer(checkpoints))
    try:
        model.fit(train_data, epochs=args.epochs, steps_per_epoch=session.steps_per_epoch,
                  validation_data=val_data, callbacks=callbacks, verbose=0,
                  shuffle=False)  # the datasets shuffle themselves; Keras 3 warns otherwise
    finally:
        if scalars is not None:
            scalars.close()


class SaveOnTermination(keras.callbacks.Callback):
    """After SIGTERM (trainer.termination): write the backup at the end of the current step, then end.

    Under MultiWorkerMirroredStrategy the workers must stop after the same step: a worker that looked
    only at its own signal could go on into the next step's collective and wait there for a peer
    that is saving and gone. So each worker's request is summed over every replica, after the same
    steps on every worker: after each of the first TIMED_STEPS + 1 steps, which also time the steps;
    the reduction after the last of them also sums each worker's proposed spacing
    (:func:`termination.agreed_every`), and from then on the workers agree every that many steps
    (about termination.AGREE_SECONDS of training), counted from that step on each of them (fit runs
    the same steps on every worker). A lone worker, or another strategy, looks at its own request
    after every step.
    """

    TIMED_STEPS = 8  # after the first step, which traces the step function

    def __init__(self, session: Session, backup: keras.callbacks.Callback):
        super().__init__()
        self.session = session
        self.backup = backup
        self.epoch = 0
        self._reduce = None  # the cross-worker sum of (asked, proposed spacing), once traced
        self._steps = 0  # steps ended since fit started, then since the spacing was agreed: the same on every worker
        self._every: int | None = None  # steps between two agreements, once the workers have agreed on it
        self._timed_from: float | None = None  # when the first step ended (the timing starts there)

    def _stop_asked(self) -> bool:
        """Whether this worker, or any worker when they agree after this step, was asked to stop."""
        asked = termination.requested()
        strategy = self.model.distribute_strategy
        if (not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
                or self.session.task.num_training_tasks <= 1):
            return asked
        self._steps += 1
        steps = self._steps
        if steps == 1 and self._every is None:
            self._timed_from = time.monotonic()
        timing_ends = self._every is None and steps == self.TIMED_STEPS + 1
        if self._every is not None and steps % self._every:
            return False  # between agreements: a request waits for the next one
        proposal = 0.0
        if timing_ends:
            proposal = float(termination.agreed_every((time.monotonic() - self._timed_from) / self.TIMED_STEPS))
        if self._reduce is None:
            @tf.function
            def reduce(values):
                return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: values), axis=None)
            self._reduce = reduce
        any_asked, proposals = (float(x) for x in self._reduce(tf.constant([float(asked), proposal])))
        if timing_ends:
            self._every = termination.shared_every(proposals, strategy.num_replicas_in_sync)
            self._steps = 0  # the agreements fall every _every steps from here, on every worker
            self.session.reporter.say(f"SIGTERM: the workers agree on stopping every {self._every} "
                                      f"step{'s' if self._every > 1 else ''}")
        return any_asked > 0

    def on_epoch_begin(self, epoch, logs=None) -> None:
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None) -> None:
        if not self._stop_asked():
            return
        termination.saving()
        where = f"in epoch {self.epoch + 1} after step {batch + 1}"
        # BackupAndRestore keeps the epoch and batch to record in two variables of its training
        # state (set as epochs and batches begin); back_up() saves them with the weights.
        state = self.backup._training_state
        if isinstance(self.backup.save_freq, int):
            # As BackupAndRestore saves for save_freq=N: fit resumes after this batch.
            state.back_up(self.epoch, batch)
            self.session.reporter.say(f"SIGTERM: backup saved {where}; the next run resumes after it")
        else:
            # With epoch-level backups a restore starts at the epoch after the recorded one, so
            # record the previous one: the next run repeats this epoch from the saved weights.
            state._ckpt_saved_epoch.assign(self.epoch - 1)
            state.back_up(self.epoch - 1)
            self.session.reporter.say(f"SIGTERM: backup saved {where}; the next run repeats epoch "
                                      f"{self.epoch + 1} from these weights")
        termination.end()


class ResizableBackup(keras.callbacks.BackupAndRestore):
    """BackupAndRestore that resumes a backup written by a cluster of another shape at the start of
    its epoch, and keeps the record of the shape beside the checkpoint (trainer.resize).

    BackupAndRestore restores the saved epoch and batch in on_train_begin, and fit then derives where
    to start from them; setting them here, to the epoch and batch before the start chosen, moves it.
    """

    def __init__(self, session: Session):
        super().__init__(session.args.backup_dir, save_freq=session.args.backup_every or "epoch",
                         delete_checkpoint=True)
        self.session = session

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        state, keeper = self._training_state, self.session.keeper
        back_up = state.back_up

        def back_up_and_record(epoch, batch=0):  # every backup, SaveOnTermination's too, goes here
            keeper.before_backup()
            back_up(epoch, batch)
            keeper.after_backup()

        state.back_up = back_up_and_record
        epoch = int(keras.backend.get_value(state._ckpt_saved_epoch))
        batch = int(keras.backend.get_value(state._ckpt_saved_batch))
        if epoch < 0:
            return  # no backup: a fresh start
        if isinstance(self.save_freq, int) and batch >= 0:
            first_epoch, first_step = keeper.resume_point(epoch, batch + 1)
        else:  # an epoch-level backup is taken after its epoch
            first_epoch, first_step = epoch + 1, 0
        note = keeper.note(first_epoch)
        if note:
            self.session.reporter.say(note)
        if first_step:
            saved = (first_epoch, first_step - 1)
        else:  # as after the last step of the epoch before (for save_freq="epoch" only the epoch counts)
            saved = (first_epoch - 1, self.session.steps_per_epoch - 1)
        state._ckpt_saved_epoch.assign(saved[0])
        state._ckpt_saved_batch.assign(saved[1])


def backup_callback(session: Session) -> keras.callbacks.Callback:
    """ResizableBackup into --backup-dir, also under CentralStorageStrategy."""
    callback = ResizableBackup(session)
    central_storage = tf.distribute.experimental.CentralStorageStrategy
    if isinstance(session.strategy, central_storage) and hasattr(callback, "_supported_strategies"):
        # tf_keras refuses strategies outside a fixed list, although its training-state
        # checkpoint works with this single-worker one (resumed mid-epoch in the tests).
        callback._supported_strategies = (*callback._supported_strategies, central_storage)
    return callback


def evaluate(session: Session, model: keras.Model) -> tuple[float, float]:
    """(test_loss, test_accuracy) on the test split."""
    splits = session.splits
    if is_parameter_server(session.strategy):
        return exact_evaluator(model, session.global_batch)(splits.x_test, splits.y_test)
    test_data = inputs.eval_dataset(splits.x_test, splits.y_test, session.global_batch)
    results = model.evaluate(test_data, verbose=0, return_dict=True)
    return float(results["loss"]), float(results["accuracy"])
