"""The trainer's SIGTERM deadline (trainer.termination) in a process of its own, without TensorFlow:
it bounds the wait for a step to end, not the save that follows it."""

from __future__ import annotations

import signal
import subprocess
import sys

from conftest import ROOT

# A stand-in for a training loop: asked to stop, it "steps" for STEP s, then (with "save") says it
# saves, saves for SAVE s, says it saved and ends as the trainer does.
LOOP = """
import sys, time
from trainer import termination
step, save, saves = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "save"
termination.install(saves=True, deadline=0.5)
print("ready", flush=True)
while not termination.requested():
    time.sleep(0.01)
time.sleep(step)  # the step in progress when SIGTERM came
if saves:
    termination.saving()
    time.sleep(save)  # the backup written, slower than the deadline
    print("saved", flush=True)
termination.end()
"""


def stopped(step: float, save: float, saves: bool) -> tuple[int, str, str]:
    proc = subprocess.Popen([sys.executable, "-c", LOOP, str(step), str(save), "save" if saves else "no"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    return proc.returncode, out, err


def test_a_save_that_outlasts_the_deadline_is_finished_and_the_process_ends_by_sigterm():
    code, out, err = stopped(step=0.1, save=1.5, saves=True)
    assert code == -signal.SIGTERM, err
    assert "saved" in out and "no step ended" not in err, (out, err)


def test_a_step_that_does_not_end_within_the_deadline_ends_the_process_by_sigterm_with_one_line():
    code, out, err = stopped(step=5.0, save=0.0, saves=True)
    assert code == -signal.SIGTERM
    assert "saved" not in out
    assert err.strip() == "trainer: SIGTERM: no step ended within 0.5 s to save a backup; exiting", err
