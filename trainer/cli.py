"""Command-line options of the trainer.

Pure argparse: no TensorFlow, no side effects. Bad options or values make
argparse print one line `trainer: error: ...` (after the usage) and exit 2.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

STRATEGIES = ("auto", "multi_worker_mirrored", "mirrored", "central_storage", "parameter_server", "default")
COLLECTIVES = ("auto", "ring", "nccl")
LOOPS = ("fit", "custom")
OPTIMIZERS = ("sgd", "adam")
NAMED_DATASETS = ("digits", "mnist", "fashion_mnist")

# Environment variables that supply the --backup-dir, --checkpoint-dir and --tensorboard-dir defaults, set by
# the launcher (launcher/taskenv.py holds its copy of the names).
BACKUP_DIR_ENV = "TFLAUNCH_BACKUP_DIR"
CHECKPOINT_DIR_ENV = "TFLAUNCH_CHECKPOINT_DIR"
TENSORBOARD_DIR_ENV = "TFLAUNCH_TENSORBOARD_DIR"

# Defaults chosen so that two local workers on a 2-core machine finish in about a
# minute and reach >= 0.90 test accuracy on digits.
DEFAULT_WIDTH = 0.25
DEFAULT_EPOCHS = 8
DEFAULT_BATCH_PER_WORKER = 32
DEFAULT_LR = 0.002
DEFAULT_OPTIMIZER = "adam"
DEFAULT_SEED = 42


@dataclass(frozen=True)
class DatasetSpec:
    """Which data to train on: kind is one of digits, mnist, fashion_mnist, npz, synthetic."""

    kind: str
    path: str | None = None
    size: int | None = None

    def __str__(self) -> str:
        if self.kind == "npz":
            return f"npz:{self.path}"
        if self.kind == "synthetic":
            return f"synthetic:{self.size}"
        return self.kind


def dataset_spec(text: str) -> DatasetSpec:
    """Parse a --dataset value: digits, mnist, fashion_mnist, npz:PATH or synthetic:N."""
    if text in NAMED_DATASETS:
        return DatasetSpec(text)
    kind, sep, rest = text.partition(":")
    if sep and kind == "npz":
        if not rest:
            raise argparse.ArgumentTypeError("npz:PATH needs a path")
        return DatasetSpec("npz", path=rest)
    if sep and kind == "synthetic":
        size = int_at_least(rest, 10, "synthetic:N needs an integer N", "synthetic:N needs N >= 10")
        return DatasetSpec("synthetic", size=size)
    raise argparse.ArgumentTypeError(
        f"expected digits, mnist, fashion_mnist, npz:PATH or synthetic:N, got {text!r}"
    )


def int_at_least(text: str, minimum: int, not_int: str, too_small: str) -> int:
    """``text`` as an integer >= ``minimum``; the two messages name what was expected."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{not_int}, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{too_small}, got {value}")
    return value


def positive_int(text: str) -> int:
    return int_at_least(text, 1, "expected a positive integer", "expected a positive integer")


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def backup_every(text: str) -> int | None:
    """'epoch' -> None (back up at the end of every epoch), N -> every N steps."""
    if text == "epoch":
        return None
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected 'epoch' or a positive integer, got {text!r}") from None


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are a single line (no usage block) for log readers."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    parser = _Parser(
        prog="trainer",
        description=(
            "Train the seeds' CNN with tf.distribute. Reads TF_CONFIG when run in a cluster; "
            "prints one TFLAUNCH_METRIC line per epoch and a final one. An evaluator task "
            "evaluates the chief's checkpoints from --checkpoint-dir as they appear. "
            "Send SIGUSR1 to dump the Python stacks of all threads to stderr."
        ),
        allow_abbrev=False,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    dist = parser.add_argument_group("distribution")
    dist.add_argument("--strategy", choices=STRATEGIES, default="auto",
                      help="tf.distribute strategy; auto picks from TF_CONFIG and the visible GPUs")
    dist.add_argument("--collective", choices=COLLECTIVES, default="auto",
                      help="collective implementation for multi_worker_mirrored")
    dist.add_argument("--loop", choices=LOOPS, default="fit",
                      help="Model.fit or a custom strategy.run loop")

    data = parser.add_argument_group("data and model")
    data.add_argument("--dataset", type=dataset_spec, default=DatasetSpec("digits"), metavar="NAME",
                      help="digits (offline), mnist, fashion_mnist, npz:PATH or synthetic:N")
    data.add_argument("--width", type=positive_float, default=DEFAULT_WIDTH,
                      help="filter-count factor of the CNN")

    train = parser.add_argument_group("training")
    train.add_argument("--epochs", type=positive_int, default=DEFAULT_EPOCHS, help="epochs to train")
    train.add_argument("--steps-per-epoch", type=positive_int, default=None,
                       help="steps per epoch; none means one pass over the training split")
    batch = train.add_mutually_exclusive_group()
    batch.add_argument("--batch-per-worker", type=positive_int, default=DEFAULT_BATCH_PER_WORKER,
                       help="per-replica batch: the global batch is this times the replica count; an attempt "
                            "resuming from --backup-dir keeps the global batch of the run's first attempt")
    batch.add_argument("--global-batch", type=positive_int, default=None,
                       help="global batch of every attempt: each replica takes this divided by the replica count "
                            "(rounded to the nearest whole number when it does not divide evenly)")
    train.add_argument("--lr", type=positive_float, default=DEFAULT_LR, help="learning rate")
    train.add_argument("--optimizer", choices=OPTIMIZERS, default=DEFAULT_OPTIMIZER,
                       help="adam, or sgd with momentum 0.9")
    train.add_argument("--seed", type=int, default=DEFAULT_SEED,
                       help="seed for weights and shuffling (the data split is fixed)")

    out = parser.add_argument_group("outputs")
    out.add_argument("--model-dir", default=None,
                     help="where the chief saves the final model (SavedModel); none means not saved")
    out.add_argument("--tensorboard-dir", default=environ.get(TENSORBOARD_DIR_ENV) or None,
                     help="where the chief writes its per-epoch TensorBoard scalars (train/ and validation/); "
                          f"defaults to ${TENSORBOARD_DIR_ENV}")
    out.add_argument("--backup-dir", default=environ.get(BACKUP_DIR_ENV) or None,
                     help=f"back up training state here and resume from it; defaults to ${BACKUP_DIR_ENV}")
    out.add_argument("--checkpoint-dir", default=environ.get(CHECKPOINT_DIR_ENV) or None,
                     help="the chief writes a checkpoint here after every epoch, for an evaluator task; "
                          f"defaults to ${CHECKPOINT_DIR_ENV}")
    out.add_argument("--backup-every", type=backup_every, default="epoch", metavar="epoch|N",
                     help="back up at the end of every epoch or every N steps")
    return parser


def parse_args(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> argparse.Namespace:
    """Parse trainer options; on a user error print one line and exit 2 (argparse)."""
    import os

    parser = build_parser(os.environ if environ is None else environ)
    return parser.parse_args(argv)
