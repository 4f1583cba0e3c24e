"""Each task's resource readings, taken every ``sample`` seconds (at its multiples on the wall
clock: :func:`until_sample`) and sent as one ``R`` frame
(:data:`.protocol.Frame.READINGS`): a line per living task, ``id rss_bytes cpu_seconds processes
waited_seconds`` of the task's whole tree, and for a watched task its threads' totals after them
(:class:`.threads.ThreadWatch`, which looks at them every :func:`look_gap` seconds). tflaunch takes
a reading of a process on its own machine the same way (:func:`tree_reading`).
"""

import os
import random

from .trees import descendants, run_delay, stat_fields


LOOK_EVERY = 2.0  # seconds between looks at a watched task's threads, on average, unless its task says


def look_gap(every=LOOK_EVERY, draw=random.random):
    """Seconds from one look at the threads to the next: ``every`` on average, drawn anew each time
    between half and one and a half of it. Looks a fixed period apart alias with a training step's
    own period (2 s is five steps of 0.4 s): each look would find an input thread at the same point
    of its step, asleep at every look or at none, however long it sleeps per step."""
    return every * (0.5 + draw())


def until_sample(every, wall, sampled=False):
    """Seconds until the agent's next sample: at the multiples of ``every`` seconds of the wall
    clock, so that all the agents of a run sample at the same moments and tflaunch, whose links'
    thread wakes for each frame it reads, reads the run's readings together rather than one host's
    at a time. Right after a sample (``sampled``), never sooner than half a period."""
    wait = every - wall % every
    return wait + every if sampled and wait < every / 2.0 else wait


def usage(pids, page=os.sysconf("SC_PAGE_SIZE"), ticks=os.sysconf("SC_CLK_TCK")):
    """(resident bytes, CPU seconds, {pid: seconds its main thread waited for a CPU}) of ``pids``;
    the first one's reaped children's CPU counts too."""
    rss = cpu = 0
    waits = {}
    for n, pid in enumerate(pids):
        fields = stat_fields(pid)
        if fields is None:
            continue
        try:
            with open("/proc/%d/statm" % pid, "rb") as statm:
                rss += int(statm.read().split()[1]) * page
        except (OSError, IndexError, ValueError):
            continue
        cpu += int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if n == 0 else 0)
        waits[pid] = run_delay(pid)
    return rss, cpu / float(ticks), waits


class Waiting(object):
    """The seconds a task's processes waited for a CPU, as a running total like its CPU time: what
    a process had waited when last read stays counted once it ended. The kernel's count goes with
    the process, where its CPU time goes on in its parent's count of reaped children, and a task
    whose work runs in short-lived processes (a shell script, an interpreter shim) would seem to
    wait for nothing."""

    def __init__(self):
        self.last = {}
        self.gone = 0.0

    def total(self, waits):
        """The running total, given each living process's count now (``waits``: pid -> seconds)."""
        for pid, seconds in self.last.items():
            if pid not in waits:
                self.gone += seconds
        self.last = waits
        return self.gone + sum(waits.values())


def tree_reading(pid):
    """(resident bytes, CPU seconds, processes) of ``pid``'s whole tree: one task's reading (for
    ``tflaunch status``, which shows CPU and memory, not what the rules judge by)."""
    tree = [pid] + descendants(pid)
    rss, cpu, _ = usage(tree)
    return rss, cpu, len(tree)


def readings(processes):
    """The payload of one ``R`` frame: a line per living task of ``processes`` (the agent's
    :class:`.starting.Process` objects; helpers left out), or b"" when none lives."""
    lines = []
    for process in processes:
        if process.status is None and process.pid is not None and process.fields.get("kind") != "helper":
            tree = process.tree = [process.pid] + descendants(process.pid)
            rss, cpu, waits = usage(tree)
            if process.waiting is None:
                process.waiting = Waiting()
            line = "%d %d %.3f %d %.3f" % (process.id, rss, cpu, len(tree), process.waiting.total(waits))
            if process.threads is not None and process.threads.looks:
                line += " " + process.threads.totals()  # see .threads.ThreadWatch
            lines.append(line)
    return "\n".join(lines).encode()
