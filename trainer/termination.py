"""SIGTERM during training: write the backup at the next step boundary, then end by SIGTERM.

A supervisor stops a task with SIGTERM and gives it a grace period; a batch scheduler does the
same when it preempts a job or a time limit is near. With a backup folder, the trainer uses that
grace to save where it is, so the next run resumes from that step instead of the last epoch:

- :func:`install` puts a handler on SIGTERM and a wakeup pipe under it. The handler itself only
  runs between Python bytecodes, which never happens while a step is stuck in a collective whose
  peer is gone, so a thread woken through the pipe keeps a deadline: if the training loop has not
  saved within ``deadline`` seconds, the process ends by SIGTERM anyway.
- the training loops call :func:`requested` after each step; when it is true they call
  :func:`saving` (a step ended: the deadline is met, and the save itself, which takes longer on a
  chief writing a large model or on a loaded machine, is bounded by the supervisor's grace alone),
  save a backup and call :func:`end`, which ends the process by SIGTERM (exit status -15, as before).

Without a backup folder (or for a ps task, which has nothing to save) SIGTERM keeps its default
action: the process ends at once.

Workers that train together must stop after the same step (a worker that went on would wait in
the next step's collective for a peer that is gone), so they agree on whether any of them was asked:
the custom loop within the reduction each step makes anyway, the fit loop by a reduction of its own,
which :func:`agreed_every` spaces out to every few steps on a schedule all of them share.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading

_requested = threading.Event()
_deadline_seconds = 3.0
_saving = threading.Event()  # a step ended after the request: the deadline no longer applies

# The fit loop's workers agree on stopping about this often once they know their steps' time: a
# request waits at most that long besides its step, far within the deadline, and the reduction (5 to
# 7 ms between two CPU workers here) is paid twice a second rather than after every step.
AGREE_SECONDS = 0.5
AGREE_AT_MOST = 1000  # steps between two agreements, however short the steps


def install(saves: bool, deadline: float = 3.0) -> None:
    """Main thread, after the strategy exists (TensorFlow's notifier replaces SIGTERM's handler)."""
    global _deadline_seconds
    if not saves:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        return
    _deadline_seconds = deadline
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.signal(signal.SIGTERM, lambda signum, frame: _requested.set())
    signal.set_wakeup_fd(write_fd)
    threading.Thread(target=_watch, args=(read_fd,), name="trainer-sigterm", daemon=True).start()


def requested() -> bool:
    return _requested.is_set()


def saving() -> None:
    """A step ended after the request and the backup is being written: the deadline is met."""
    _saving.set()


def agreed_every(step_seconds: float, seconds: float = AGREE_SECONDS) -> int:
    """How many steps apart one worker proposes the agreements, from its mean step time: as many as
    fit in ``seconds``, at least 1 and at most AGREE_AT_MOST. The workers sum their proposals in
    one reduction (whole numbers, so every worker gets the same sum) and each uses
    :func:`shared_every` of it."""
    if not step_seconds > 0:  # no time measured (or not a number): every step, as before the timing
        return 1
    return max(1, min(AGREE_AT_MOST, int(seconds / step_seconds)))


def shared_every(proposals_sum: float, proposers: int) -> int:
    """The spacing every worker uses: the mean of their proposals, rounded down (at least 1). The
    sum is of whole numbers below 2**24, exact in float32, and identical on every worker."""
    return max(1, int(round(proposals_sum)) // max(1, proposers))


def end() -> None:
    """End the process by SIGTERM, as the default action would have."""
    sys.stdout.flush()
    sys.stderr.flush()
    _default_action_and_kill()


def _watch(read_fd: int) -> None:
    while True:
        data = os.read(read_fd, 64)
        if not data or signal.SIGTERM in data:
            break
    _requested.set()
    threading.Timer(_deadline_seconds, _give_up).start()


def _give_up() -> None:
    if _saving.is_set():
        return
    print(f"trainer: SIGTERM: no step ended within {_deadline_seconds:g} s to save a backup; exiting",
          file=sys.stderr, flush=True)
    _default_action_and_kill()


def _default_action_and_kill() -> None:
    # signal.signal() may only be called from the main thread; the C library's may be called from any.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal(signal.SIGTERM, ctypes.c_void_p(0))  # SIG_DFL
    os.kill(os.getpid(), signal.SIGTERM)
