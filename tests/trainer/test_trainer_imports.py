"""The trainer's pure modules load without TensorFlow, seen from a fresh interpreter (a real process, so
the fast tier's, not the unit tier's)."""

from __future__ import annotations

import subprocess
import sys


def test_pure_modules_do_not_import_tensorflow():
    code = ("import sys, trainer.cli, trainer.cluster, trainer.data, trainer.metrics, trainer.session, "
            "trainer.handoff;"
            "trainer.data.load(trainer.cli.DatasetSpec('digits'));"
            "print(sorted(m for m in ('tensorflow', 'tf_keras', 'keras', 'sklearn', 'scipy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    # Nor scikit-learn and SciPy: the default data's loading reads scikit-learn's file without them.
    assert out.stdout.strip() == "[]"
