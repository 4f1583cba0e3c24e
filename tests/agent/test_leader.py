"""A task's leader and its process group are signalled only while they are the task's: the leader
while /proc shows the process that started when it did at its number, its group only while that
process leads it; once the agent has reaped the leader, nothing at all; and no descriptor is held
per task. Real
processes throughout; a number reused by another process is played by a real stranger."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from launcher.agent.trees import Leader
from polling import wait_for

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except FileNotFoundError:
        return True


def test_a_live_leader_is_killed_with_its_whole_group(procs):
    task = procs(["sh", "-c", f"{' '.join(SLEEP[:2])} 'import time; time.sleep(600)' & wait"])
    wait_for(lambda: open(f"/proc/{task.pid}/task/{task.pid}/children").read().split(), timeout=10,
             message="the task's child")
    child = int(open(f"/proc/{task.pid}/task/{task.pid}/children").read().split()[0])
    leader = Leader(task.pid)
    leader.signal(signal.SIGKILL)
    assert task.wait(10) == -signal.SIGKILL
    wait_for(lambda: gone(child), timeout=10, message="the leader's child, in its group, to end")


def test_a_reaped_leader_gets_no_signal_and_neither_does_its_number(procs):
    task = procs(SLEEP)
    leader = Leader(task.pid)
    os.kill(task.pid, signal.SIGKILL)
    task.wait()
    leader.reap()
    stranger = procs(SLEEP)  # leads a group of its own, as a reused number would
    leader.pid = stranger.pid
    leader.signal(signal.SIGKILL)
    assert stranger.poll() is None and not gone(stranger.pid)


def test_a_number_that_names_another_process_gets_no_signal(procs):
    task = procs(SLEEP)
    leader = Leader(task.pid)
    time.sleep(0.05)  # /proc counts start times in clock ticks (10 ms): a reused number comes later
    stranger = procs(SLEEP)  # another process at the leader's number: another start time
    leader.pid = stranger.pid
    assert not leader.owns_group() and not leader.is_there()
    leader.signal(signal.SIGTERM)
    time.sleep(0.2)
    assert stranger.poll() is None and not gone(stranger.pid)
    leader.pid = task.pid  # its own number again: the leader is there and gets it
    leader.signal(signal.SIGTERM)
    assert task.wait(10) == -signal.SIGTERM


def test_a_leader_holds_no_descriptor(procs):
    tasks = [procs(SLEEP) for _ in range(20)]
    opened = len(os.listdir("/proc/self/fd"))
    leaders = [Leader(task.pid) for task in tasks]
    assert len(os.listdir("/proc/self/fd")) == opened, leaders
