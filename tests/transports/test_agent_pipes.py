"""The size of the pipes a real host agent gives its tasks' relayed output: wide for a few tasks at a
time, the kernel's default for the rest, and a wide one passed on when its task ends."""

from __future__ import annotations

import sys

from launcher.transports.base import ExitStatus
from launcher.agent.channel import PIPE_SIZE, WIDE_PIPES
from polling import wait_for
from test_hostagent import ended, host, log_text  # noqa: F401 (host is a fixture)

# Prints the size of its stdout pipe (F_GETPIPE_SZ), then waits for its stop.
PIPE_SIZE_THEN_WAIT = "import fcntl, time; print(fcntl.fcntl(1, 1032), flush=True); time.sleep(600)"


def pipe_size(task) -> int:
    text = wait_for(lambda: log_text(task).strip(), timeout=60, message=f"{task.name} to print its pipe's size")
    return int(text)


def test_a_few_tasks_at_a_time_get_a_wide_output_pipe(host):
    h = host()
    tasks = [h.start([sys.executable, "-c", PIPE_SIZE_THEN_WAIT], relay=True) for _ in range(WIDE_PIPES + 2)]
    sizes = [pipe_size(task) for task in tasks]
    wide = [task for task, size in zip(tasks, sizes) if size == PIPE_SIZE]
    assert len(wide) == WIDE_PIPES
    assert all(size < PIPE_SIZE for size in sizes if size != PIPE_SIZE)
    # A task that ends gives its wide pipe back: the next task gets one, and the one after does not.
    wide[0].kill()
    assert ended(wide[0]) == ExitStatus(signal=9)
    after = [h.start([sys.executable, "-c", PIPE_SIZE_THEN_WAIT], relay=True) for _ in range(2)]
    assert pipe_size(after[0]) == PIPE_SIZE
    assert pipe_size(after[1]) < PIPE_SIZE
