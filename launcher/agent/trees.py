"""Process trees on Linux, read from /proc: a process's children and descendants, which of them
carry a task's mark, whether they live, and signals to them.

The agent is a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``): whatever a task starts in a
session of its own, or by double-forking, comes back to the agent rather than to init, is known
by the ``TFLAUNCH_AGENT_TASK`` variable it inherited, and is stopped (and reported as a leftover)
when its task ends.
"""

import os

try:  # the C module: the signal wrapper imports enum, which costs start-up time
    import _signal as signal
except ImportError:
    import signal

from .protocol import OWNER_VARIABLE

PR_SET_CHILD_SUBREAPER = 36

def become_subreaper():
    """Orphaned descendants come to this process instead of init (Linux 3.4+)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def children_of(pid):
    """Direct children of ``pid`` (threads' children included), from /proc."""
    found = []
    try:
        threads = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return found
    for tid in threads:
        try:
            with open("/proc/%d/task/%s/children" % (pid, tid), "rb") as listing:
                found.extend(int(p) for p in listing.read().split())
        except (OSError, ValueError):
            continue
    return found


def descendants(pid):
    found, todo = [], [pid]
    while todo:
        for child in children_of(todo.pop()):
            found.append(child)
            todo.append(child)
    return found


def owner_of(pid):
    """The agent's process id named in a process's environment, if it has one of ours."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as environ:
            for item in environ.read().split(b"\0"):
                if item.startswith(OWNER_VARIABLE.encode() + b"="):
                    return int(item.split(b"=", 1)[1])
    except (OSError, ValueError):
        pass
    return None


def process_name(pid):
    try:
        with open("/proc/%d/comm" % pid, "rb") as comm:
            return comm.read().decode("utf-8", "replace").strip() or "?"
    except OSError:
        return "?"


def stat_fields(pid):
    """The fields of /proc/<pid>/stat after the command name (state first, so utime is [11]), or
    None when the process is gone; the name, in parentheses, may hold spaces and parentheses."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def read_small(path, size=256):
    """The first bytes of a small /proc file, or None when it is gone (the thread ended)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, size)
    except OSError:
        return None
    finally:
        os.close(fd)


def schedstat(path):
    """(nanoseconds runnable but waiting for a CPU, times scheduled) so far, from a schedstat file
    of /proc (a process's main thread's, or a thread's), or None when it is gone or says otherwise."""
    try:
        _, delay, slices = [int(word) for word in read_small(path).split()[:3]]
    except (AttributeError, ValueError):
        return None
    return delay, slices


def run_delay(pid):
    """Seconds the main thread of ``pid`` spent runnable but waiting for a CPU so far, or 0.0 when
    the kernel does not say or it is gone."""
    counts = schedstat("/proc/%d/schedstat" % pid)
    return counts[0] / 1e9 if counts is not None else 0.0


def alive(pid):
    fields = stat_fields(pid)
    return bool(fields) and fields[0] != b"Z"


def handles(pid, signum):
    """Whether process ``pid`` catches or ignores ``signum`` (True when that cannot be read)."""
    try:
        with open("/proc/%d/status" % pid, "rb") as status:
            masks = [line.split()[1] for line in status if line.startswith((b"SigCgt:", b"SigIgn:"))]
        return len(masks) != 2 or any(int(mask, 16) >> (signum - 1) & 1 for mask in masks)
    except (OSError, ValueError, IndexError):
        return True


def send(pid, signum):
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


class Leader(object):
    """A task's first process, which leads the task's process group. The agent reaps its own
    children, so the leader's pid (the group's id) is not reused before the reap; after it, nothing
    is sent. The group is signalled only while /proc shows the process that started when the
    leader did still leading it; else the leader alone, while /proc shows that process at its
    number. No descriptor is held per task (a pidfd would be one per task, and 200 tasks under a
    common ``ulimit -n`` of 256 would run out)."""

    def __init__(self, pid):
        self.pid = pid
        self.reaped = False
        fields = stat_fields(pid)
        self.started = fields and fields[19]  # with the pid, it names this one process

    def is_there(self):
        """Whether /proc shows the leader, not reaped, at its number: the process that started when
        it did."""
        if self.reaped or not self.started:
            return False
        fields = stat_fields(self.pid)
        return bool(fields) and fields[19] == self.started

    def owns_group(self):
        """Whether /proc shows the leader, not reaped, leading a group: the process at ``pid`` that
        started when it did, its group's id its own. (Read when a signal goes, not at the start:
        a forked task makes its group only after the fork returned here.)"""
        if not self.is_there():
            return False
        fields = stat_fields(self.pid)
        return bool(fields) and fields[2] == b"%d" % self.pid

    def signal(self, signum):
        if self.owns_group():
            try:
                os.killpg(self.pid, signum)
            except (ProcessLookupError, PermissionError):
                pass
        elif self.is_there():
            try:
                os.kill(self.pid, signum)
            except (ProcessLookupError, PermissionError):
                pass  # it has exited

    def reap(self):
        """The agent reaped it: its number is free for any process from now on."""
        self.reaped = True


def lead_session():
    """Whether the agent leads its own session, made now if it can be (the leader of a process group
    cannot make one, as under srun, which starts each task as one: then each task gets a session of
    its own).

    The tasks share it, each in a process group of its own, rather than a session each: Linux's
    autogroup scheduling (``kernel.sched_autogroup_enabled``, on by default) shares the CPU between
    sessions first, so eight busy tasks in eight sessions would hold eight shares against the one of
    tflaunch, which relays their output and falls behind it, and against each other user's session
    on a shared host. In one session they hold one share, as torchrun's workers, which share its
    session, do. No terminal reaches them either way: the agent's session has none."""
    try:
        os.setsid()
    except OSError:
        pass  # it leads a process group: its session, whoever's, stays as it is
    return os.getsid(0) == os.getpid()

