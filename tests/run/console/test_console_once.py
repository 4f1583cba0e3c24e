"""What the console says once: a hang's verdict, once per attempt."""

from __future__ import annotations

import json

import pytest

from conftest import TASK

EPOCH = "print:TFLAUNCH_METRIC " + json.dumps({"kind": "epoch", "epoch": 1, "loss": 1.0})


@pytest.mark.timeout(60)
def test_a_hang_verdict_is_said_once_per_attempt(tflaunch):
    # worker-2 stops in another place than the others: each attempt's verdict names it, once.
    done = tflaunch.run("--local", "3", "--hang-timeout", "2", "--max-restarts", "1", "--restart-delay", "0.2",
                        "--", "python", TASK, EPOCH, "sleep-if:worker-2:100", "forever")
    assert done.returncode == 124, done.stderr
    verdicts = [line for line in done.stderr.splitlines() if "worker-2 differs from the rest" in line]
    assert len(verdicts) == 2, done.stderr  # attempt 1's in its restart line, attempt 2's in the summary
    assert verdicts[0].startswith("tflaunch: attempt 1 failed (hang timeout: no training progress for 2 s; ")
    assert verdicts[1].startswith(f"tflaunch: run {done.run_dir.name} failed after 2 attempts: hang timeout")
    assert done.stderr.count("tflaunch: hang timeout: no training progress for 2 s: stopping the cluster\n") == 2
