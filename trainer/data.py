"""Loading, checking, splitting and scaling the training data, in numpy.

Nothing here imports TensorFlow except the mnist/fashion_mnist download, which
goes through tf_keras.datasets. Images come out as float32 (N, H, W, C) arrays
standardised per pixel as scikit-learn's StandardScaler does, fitted on the training split only; labels
are int32 class ids in 0..NUM_CLASSES-1.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

import numpy as np

from trainer.cli import DatasetSpec

NUM_CLASSES = 10
# Fixed so that every worker, and every rerun, sees the same split.
SPLIT_SEED = 20240607
VAL_FRACTION = 0.15
TEST_FRACTION = 0.15


class DataError(Exception):
    """The data cannot be loaded or is not usable; the message names the source and the key."""


@dataclass(frozen=True)
class Splits:
    """Train, validation and test arrays, ready for the model."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    def sizes(self) -> str:
        return f"train={len(self.x_train)} val={len(self.x_val)} test={len(self.x_test)}"


@dataclass(frozen=True)
class RawData:
    """Arrays as loaded; x_test/y_test are None when the source has no test split."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray | None = None
    y_test: np.ndarray | None = None


def load(spec: DatasetSpec) -> Splits:
    """Load the data named by spec, then split and scale it."""
    if spec.kind == "digits":
        raw = load_digits()
    elif spec.kind in ("mnist", "fashion_mnist"):
        raw = load_keras_dataset(spec.kind)
    elif spec.kind == "npz":
        raw = load_npz(spec.path)
    elif spec.kind == "synthetic":
        raw = make_synthetic(spec.size)
    else:
        raise DataError(f"unknown dataset kind {spec.kind!r}")
    return split_and_scale(raw, str(spec))


def load_digits() -> RawData:
    """scikit-learn's 1,797 8x8 digit images, shipped with the package (works offline): read from
    its data file as scikit-learn's own loader reads it, and through that loader where the file is
    not where scikit-learn keeps it."""
    path = _digits_file()
    if path is None:
        from sklearn.datasets import load_digits as sk_load_digits

        bunch = sk_load_digits()
        return RawData(bunch.images.astype(np.float32), bunch.target.astype(np.int32))
    table = np.loadtxt(path, delimiter=",", dtype=np.float32)  # 64 pixels, then the label
    return RawData(table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(np.int32))


def _digits_file() -> str | None:
    """The digits' file in the installed scikit-learn, found without importing it: its import (and
    SciPy's, which comes with it) cost every task 1.4 s of CPU here, more than the rest of its data."""
    spec = importlib.util.find_spec("sklearn")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        path = os.path.join(folder, "datasets", "data", "digits.csv.gz")
        if os.path.isfile(path):
            return path
    return None


def load_keras_dataset(name: str) -> RawData:
    """mnist or fashion_mnist through tf_keras.datasets (downloads on first use)."""
    # Importing tf_keras loads TensorFlow but does not start its runtime, so the
    # strategy can still be created afterwards.
    try:
        from tf_keras import datasets

        module = getattr(datasets, name)
        (x_train, y_train), (x_test, y_test) = module.load_data()
    except Exception as exc:  # the download raises several kinds of errors
        reason = " ".join(str(exc).split())[:200]
        raise DataError(
            f"{name}: could not be downloaded ({type(exc).__name__}: {reason}); "
            "use --dataset digits or --dataset npz:PATH instead"
        ) from None
    return RawData(x_train, y_train, x_test, y_test)


def make_synthetic(size: int) -> RawData:
    """size random 28x28x1 images with random labels in 0..9 (for throughput benchmarks)."""
    rng = np.random.default_rng(SPLIT_SEED)
    x = rng.random((size, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, NUM_CLASSES, size=size, dtype=np.int32)
    return RawData(x, y)


def load_npz(path: str) -> RawData:
    """Read and check an npz with x_train, y_train and optionally x_test, y_test."""
    source = f"npz:{path}"
    if not os.path.isfile(path):
        raise DataError(f"{source}: not a file")
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
    except Exception as exc:  # np.load raises OSError, ValueError, BadZipFile, EOFError...
        raise DataError(f"{source}: cannot read it as an .npz file ({type(exc).__name__}: {exc})") from None
    return check_arrays(arrays, source)


def check_arrays(arrays: dict[str, np.ndarray], source: str) -> RawData:
    """Validate npz-style arrays, naming the source and the key of the first problem."""
    for key in ("x_train", "y_train"):
        if key not in arrays:
            raise DataError(f"{source}: missing key {key!r} (found: {', '.join(sorted(arrays)) or 'none'})")
    if ("x_test" in arrays) != ("y_test" in arrays):
        missing = "y_test" if "x_test" in arrays else "x_test"
        raise DataError(f"{source}: missing key {missing!r} (x_test and y_test go together)")
    x_train = _check_images(arrays["x_train"], source, "x_train")
    y_train = _check_labels(arrays["y_train"], source, "y_train", len(x_train))
    if len(x_train) < 10:
        raise DataError(f"{source}: x_train: need at least 10 samples, got {len(x_train)}")
    x_test = y_test = None
    if "x_test" in arrays:
        x_test = _check_images(arrays["x_test"], source, "x_test")
        y_test = _check_labels(arrays["y_test"], source, "y_test", len(x_test))
        if x_test.shape[1:] != x_train.shape[1:]:
            raise DataError(
                f"{source}: x_test: image shape {x_test.shape[1:]} differs from x_train's {x_train.shape[1:]}"
            )
        if len(x_test) == 0:
            raise DataError(f"{source}: x_test: empty")
    return RawData(x_train, y_train, x_test, y_test)


def _check_images(x: np.ndarray, source: str, key: str) -> np.ndarray:
    if x.ndim == 3:
        x = x[..., np.newaxis]
    if x.ndim != 4:
        raise DataError(f"{source}: {key}: expected shape (N, H, W) or (N, H, W, C), got {x.shape}")
    if x.shape[1] < 2 or x.shape[2] < 2:
        raise DataError(f"{source}: {key}: images must be at least 2x2, got {x.shape[1]}x{x.shape[2]}")
    if not (np.issubdtype(x.dtype, np.number) or x.dtype == np.bool_):
        raise DataError(f"{source}: {key}: expected numbers, got dtype {x.dtype}")
    x = x.astype(np.float32)
    if not np.all(np.isfinite(x)):
        raise DataError(f"{source}: {key}: contains NaN or infinity")
    return x


def _check_labels(y: np.ndarray, source: str, key: str, expected_len: int) -> np.ndarray:
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1:
        raise DataError(f"{source}: {key}: expected shape (N,) of class ids, got {y.shape}")
    if len(y) != expected_len:
        images_key = "x_" + key.split("_", 1)[1]
        raise DataError(f"{source}: {key}: {len(y)} labels but {images_key} has {expected_len} images")
    if not np.issubdtype(y.dtype, np.integer):
        if not np.issubdtype(y.dtype, np.floating) or not np.all(np.isfinite(y)) or np.any(y != np.round(y)):
            raise DataError(f"{source}: {key}: expected integer class ids, got dtype {y.dtype}")
    if len(y) and (y.min() < 0 or y.max() >= NUM_CLASSES):
        raise DataError(
            f"{source}: {key}: class ids must be in 0..{NUM_CLASSES - 1}, got {y.min():g}..{y.max():g}"
        )
    return y.astype(np.int32)


def split_and_scale(raw: RawData, name: str) -> Splits:
    """Split off validation (and test, when the source has none) with a fixed seed,
    then standardise every split with a scaler fitted on the training split only."""
    rng = np.random.default_rng(SPLIT_SEED)
    n = len(raw.x_train)
    order = rng.permutation(n)
    if raw.x_test is None:
        n_test = max(1, int(round(n * TEST_FRACTION)))
        test_idx, order = order[:n_test], order[n_test:]
        x_test, y_test = raw.x_train[test_idx], raw.y_train[test_idx]
    else:
        x_test, y_test = raw.x_test, raw.y_test
    n_val = max(1, int(round(n * VAL_FRACTION)))
    val_idx, train_idx = order[:n_val], order[n_val:]
    if len(train_idx) == 0:
        raise DataError(f"{name}: too few samples ({n}) to split off validation and test")
    x_train, y_train = raw.x_train[train_idx], raw.y_train[train_idx]
    x_val, y_val = raw.x_train[val_idx], raw.y_train[val_idx]
    scaler = fit_scaler(x_train)
    return Splits(
        name=name,
        x_train=scaler(x_train), y_train=np.asarray(y_train, np.int32),
        x_val=scaler(x_val), y_val=np.asarray(y_val, np.int32),
        x_test=scaler(x_test), y_test=np.asarray(y_test, np.int32),
    )


def fit_scaler(x_train: np.ndarray):
    """A function standardising images per pixel, fitted on x_train, as scikit-learn's
    StandardScaler does: each pixel less its mean over x_train, over its standard deviation there;
    a pixel constant over x_train (within rounding) is only centred."""
    x_train = _as_images(x_train)
    shape = x_train.shape[1:]
    flat = x_train.reshape(len(x_train), -1).astype(np.float64)
    mean, scale = flat.mean(axis=0), flat.std(axis=0)
    scale[scale <= np.finfo(np.float32).eps * np.maximum(np.abs(mean), 1.0)] = 1.0

    def transform(x: np.ndarray) -> np.ndarray:
        x = _as_images(x)
        flat = (x.reshape(len(x), -1) - mean) / scale
        return flat.reshape((len(x),) + shape).astype(np.float32)

    return transform


def _as_images(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return x[..., np.newaxis] if x.ndim == 3 else x
