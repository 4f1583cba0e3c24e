"""Ending the agent's processes: reaping them, finding and stopping what each left behind, then
reporting its exit; and stopping everything when tflaunch is gone. :class:`EndingProcesses` is
the part of :class:`.loop.Agent` that does it.
"""

import os
import time

try:  # the C module: the signal wrapper imports enum, which costs start-up time
    import _signal as signal
except ImportError:
    import signal

from .protocol import Status
from .trees import alive, children_of, descendants, owner_of, process_name, send

SETTLE = 0.1  # after a TERM to a task's group: its members get this long to end before counting leftovers


class EndingProcesses(object):
    """The part of :class:`.loop.Agent` that ends processes: it uses the agent's ``processes``,
    ``by_pid``, ``drain_until``, ``control``, ``me``, ``eof_grace`` and its ``say`` and ``close_pipes``."""

    def reap(self):
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            process = self.by_pid.pop(pid, None)
            if process is not None:
                process.leader.reap()
                process.status = status
                process.read_after = 0.0  # its last output and its pipe's end are read at once
                process.settle_until = time.monotonic() + (SETTLE if process.termed or process.hurry else 0.0)

    def advance(self):
        """Move every ended process on: its leftovers found and stopped, then its exit reported."""
        now = time.monotonic()
        for process in self.processes.values():
            if process.status is None or process.reported or process.exec_fd is not None:
                continue
            if process.settle_until is not None:
                # The rest of its group got the TERM too: wait (up to SETTLE) only while any of it lives.
                if now < process.settle_until and any(alive(pid) for pid in self.tree_of(process)):
                    continue
                process.settle_until = None
                found = self.tree_of(process)
                for pid in found:
                    process.leftovers.setdefault(pid, process_name(pid))
                    send(pid, signal.SIGTERM)
                process.stopping_at = now + (0.0 if process.hurry else process.grace) if found else None
            if process.stopping_at is not None:
                found = [pid for pid in self.tree_of(process) if alive(pid)]
                if found and now < process.stopping_at:
                    continue
                for pid in found:
                    process.leftovers.setdefault(pid, process_name(pid))
                    send(pid, signal.SIGKILL)
                if found:
                    process.stopping_at = now + 0.1  # SIGKILL again (new forks too) until none is left
                    continue
                process.stopping_at = None
            if process.out_fd is not None:
                # Its output is not all relayed yet. Its tree is gone, so only a process that left
                # the tree unmarked can still hold the pipe: give that a second, then close.
                until = self.drain_until.setdefault(process.id, now + 1.0)
                if now < until:
                    continue
            self.drain_until.pop(process.id, None)
            self.finish(process)

    def finish(self, process):
        self.close_pipes(process)
        for pid in sorted(process.leftovers):
            self.say(process, "%s %d %s" % (Status.LEFTOVER, pid, process.leftovers[pid]))
        status = process.status
        # The TERM ended it when it died of a signal, or exited after it while catching SIGTERM;
        # an exit code from a process that leaves SIGTERM to its default came before the TERM.
        stopped = process.termed and (os.WIFSIGNALED(status) or process.catches_term)
        termed = " " + Status.TERMED if stopped else ""
        if os.WIFSIGNALED(status):
            self.say(process, "%s %s%d%s" % (Status.EXIT, Status.SIGNAL, os.WTERMSIG(status), termed))
        else:
            self.say(process, "%s %s%d%s" % (Status.EXIT, Status.CODE, os.WEXITSTATUS(status), termed))
        process.reported = True

    def tree_of(self, process):
        """Living processes that belong to ``process``: its own descendants while it lives, and
        the orphans the agent adopted that carry its mark."""
        found = []
        if process.status is None and process.pid is not None:
            found = descendants(process.pid)
        for child in children_of(self.me):
            if child in self.by_pid or child == process.pid:
                continue
            if owner_of(child) == process.id:
                found.append(child)
                found += descendants(child)
        return found

    def signal_group(self, process, signum):
        """``signum`` to ``process``'s group while it is the process's (see :class:`.trees.Leader`)."""
        if process.leader is not None:
            process.leader.signal(signum)

    def signal_tree(self, process, signum):
        self.signal_group(process, signum)
        for pid in self.tree_of(process):
            send(pid, signum)

    # -- stopping everything ----------------------------------------------------------------

    def stop_everything(self):
        """tflaunch is gone: SIGTERM to every process and its tree, ``eof_grace``, then SIGKILL."""
        self.control = []
        for process in self.processes.values():
            self.signal_group(process, signal.SIGTERM)
        for pid in descendants(self.me):
            send(pid, signal.SIGTERM)
        deadline = time.monotonic() + self.eof_grace
        while descendants(self.me) and time.monotonic() < deadline:
            self.reap()
            time.sleep(0.02)
        for _ in range(100):
            left = descendants(self.me)
            for pid in left:
                send(pid, signal.SIGKILL)
            for process in self.processes.values():
                self.signal_group(process, signal.SIGKILL)
            self.reap()
            if not left:
                break
            time.sleep(0.05)
        self.reap()
