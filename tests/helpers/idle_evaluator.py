"""An evaluator that never evaluates, beside the built-in trainer.

Run as the command of every task: the evaluator task (TF_CONFIG task type
"evaluator") prints one line and then waits until it is stopped, running no
TensorFlow server; every other task becomes `python -m trainer ARGS...`.
It shows whether training is held up by an evaluator that does nothing.
"""

from __future__ import annotations

import json
import os
import signal
import sys


def main() -> int:
    task = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task", {})
    if task.get("type") != "evaluator":
        os.execv(sys.executable, [sys.executable, "-m", "trainer", *sys.argv[1:]])
    print("idle evaluator: waiting to be stopped", flush=True)
    signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main())
