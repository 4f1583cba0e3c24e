"""The Keras the trainer builds with: tf_keras, or Keras 3 when TF_USE_LEGACY_KERAS asks for it.

trainer.__main__ sets TF_USE_LEGACY_KERAS=1 when the user left it unset, before
TensorFlow is imported, so that tf.keras and this module agree. A user's
TF_USE_LEGACY_KERAS=0 keeps Keras 3; cluster.check_keras refuses beforehand the
strategies and loops Keras 3 cannot run.
"""

from __future__ import annotations

import os

from trainer.cluster import uses_legacy_keras

LEGACY = uses_legacy_keras(os.environ)

if LEGACY:
    import tf_keras as keras
else:
    import keras

__all__ = ["LABEL", "LEGACY", "keras", "save_model"]

LABEL = f"{'tf_keras' if LEGACY else 'keras'} {keras.__version__}"


def save_model(model, directory: str) -> None:
    """Save the model as a SavedModel directory (tf_keras) or an exported SavedModel (Keras 3)."""
    if LEGACY:
        model.save(directory, save_format="tf")
    else:
        # Keras 3's model.save writes only .keras files; export() writes the SavedModel.
        model.export(directory, verbose=False)
