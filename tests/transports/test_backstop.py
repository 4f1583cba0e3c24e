"""tflaunch's own backstop for a task on this machine (its agent is gone or ignored a KILL) kills
the task's group only while the process at the task's pid is the task's: it carries the task's
mark and leads its own group. The agent reaps the task, not tflaunch, so the number may by then
belong to another process (as root, another user's group)."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from launcher.agent.protocol import OWNER_VARIABLE
from launcher.transports.local import kill_group
from polling import wait_for

SLEEP = "import time; time.sleep(600)"


def test_a_process_without_the_tasks_mark_is_left_alone(procs):
    stranger = procs([sys.executable, "-c", SLEEP])  # another process now at the task's number
    kill_group(stranger.pid, 7)
    assert stranger.poll() is None


def test_another_tasks_process_is_left_alone(procs):
    other = procs([sys.executable, "-c", SLEEP], env={**os.environ, OWNER_VARIABLE: "8"})
    kill_group(other.pid, 7)
    assert other.poll() is None


def test_the_tasks_own_group_is_killed(procs):
    task = procs(["sh", "-c", f"{sys.executable} -c '{SLEEP}' & wait"], env={**os.environ, OWNER_VARIABLE: "7"})
    children = f"/proc/{task.pid}/task/{task.pid}/children"
    wait_for(lambda: open(children).read().split(), timeout=10, message="the task's child")
    child = int(open(children).read().split()[0])
    wait_for(lambda: OWNER_VARIABLE.encode() in open(f"/proc/{task.pid}/environ", "rb").read(), timeout=10,
             message="the task's environment")
    kill_group(task.pid, 7)
    assert task.wait(10) == -signal.SIGKILL
    wait_for(lambda: not os.path.exists(f"/proc/{child}") or
             open(f"/proc/{child}/stat", "rb").read().rsplit(b")", 1)[1].split()[0] == b"Z",
             timeout=10, message="the task's child to be killed with its group")
