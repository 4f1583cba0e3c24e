"""The agent in front of every task, local or remote: it starts the task and makes sure that
everything the task started ends with it (standard library only).

tflaunch imports it in ``python -I -S`` on this machine and runs it as ``python -c <source>
<spec>`` over ssh; either way ``sys.argv[1]`` is the spec. The spec is base64 of NUL-separated fields (see :func:`read_spec`): ``argv``,
``env``, optional ``cwd``, ``grace`` (TERM to KILL for leftovers), ``eof_grace`` (the same when
tflaunch is gone) and ``timeout`` (seconds without a heartbeat before the task is stopped; empty:
never). No value of it passes through a shell.

The agent makes itself a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``, no root needed), so a
process the task starts in a session of its own, or by double-forking, is re-parented to the agent
rather than to init and can still be found. The agent:

- starts the task in its own session with the given env, its stdout and stderr both on the agent's
  stdout, and reports ``TFLAUNCH_AGENT started <pid>`` on its own stderr (or ``error <reason>``);
- reads commands on stdin: an empty line is a heartbeat, ``TERM`` signals the task's process group,
  ``KILL`` kills every process of the task's tree, ``SIG <n>`` signals the task's main process,
  ``DUMP`` writes the task's Python stacks (``py-spy dump``, when installed) to stderr between
  ``stacks-begin`` and ``stacks-end`` marks;
- stops the whole tree (SIGTERM, ``eof_grace`` seconds, SIGKILL) when stdin reaches EOF (tflaunch or
  its ssh client died, even by SIGKILL) or when no heartbeat came for ``timeout`` seconds;
- once the task's main process has ended, stops every process still left in its tree (SIGTERM,
  ``grace``, SIGKILL), reports each as ``leftover <pid> <name>``, then ends with ``exit code=<n>``
  or ``exit signal=<n>`` and exits with the task's exit code (128+n for a signal).

Python 3.6+ compatible on purpose: it runs on whatever interpreter a remote host has.
"""

import binascii
import errno
import os
import select
import sys
import time

try:  # the C module: the signal wrapper imports enum, which costs a local task's start-up more than all else
    import _signal as signal
except ImportError:
    import signal

MARK = "TFLAUNCH_AGENT"
PR_SET_CHILD_SUBREAPER = 36
TICK = 0.25  # longest sleep of the event loop; SIGCHLD and stdin wake it earlier


def read_spec(encoded):
    """The spec from its base64 form: ``key \\0 value`` pairs, except ``argv`` and ``env``, which
    are ``key \\0 count \\0 item...`` (env items alternate name and value). NUL cannot occur in
    an argument or an environment value, and json would cost more start-up time than it saves."""
    tokens = binascii.a2b_base64(encoded).decode("utf-8").split("\0")
    spec, i = {"env": {}, "timeout": None}, 0
    while i < len(tokens):
        key = tokens[i]
        if key in ("argv", "env"):
            count = int(tokens[i + 1])
            items = tokens[i + 2:i + 2 + count]
            spec[key] = items if key == "argv" else dict(zip(items[::2], items[1::2]))
            i += 2 + count
        else:
            value = tokens[i + 1]
            spec[key] = value if key == "cwd" else (float(value) if value else None)
            i += 2
    return spec


def report(text):
    try:
        os.write(2, ("%s %s\n" % (MARK, text)).encode("utf-8", "replace"))
    except OSError:
        pass  # nobody is listening any more (the connection closed): the stopping goes on regardless


def become_subreaper():
    """Orphaned descendants come to this process instead of init (Linux 3.4+); False elsewhere."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def process_tree(root):
    """Pids of every living descendant of ``root``, found by walking /proc (never by name)."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry, "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited meanwhile
        if fields[0] == b"Z":
            continue  # a zombie holds nothing; reaping it is enough
        children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for pid in children.get(todo.pop(), ()):
            found.append(pid)
            todo.append(pid)
    return found


def process_name(pid):
    try:
        with open("/proc/%d/comm" % pid, "rb") as comm:
            return comm.read().decode("utf-8", "replace").strip() or "?"
    except OSError:
        return "?"


def send(pid, signum, group=False):
    try:
        (os.killpg if group else os.kill)(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


class Agent(object):
    def __init__(self, spec):
        self.spec = spec
        self.pid = None  # the task's main process
        self.status = None  # its wait status, once reaped
        self.stop_reason = None  # "eof" or "no heartbeat": tflaunch is gone
        self.hurry = False  # KILL arrived: no more grace
        self.termed = False  # TERM went to the task's group
        self.helpers = set()  # py-spy processes of stack dumps: not the task's
        self.leftovers = {}  # pid -> name of processes that outlived the task's main process
        self.stdin_open = True
        self.pending = b""
        self.last_heartbeat = time.monotonic()
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(wake_w, False)
        # SIGCHLD wakes the loop at once: a task's end is seen without polling delay.
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)

    # -- starting ----------------------------------------------------------------------

    def start(self):
        argv, cwd = self.spec["argv"], self.spec.get("cwd")
        env = dict(os.environ)
        env.update(self.spec["env"])
        errors_r, errors_w = os.pipe()  # close-on-exec: EOF means the exec worked
        devnull = os.open(os.devnull, os.O_RDONLY)
        pid = os.fork()
        if pid == 0:  # the task, until exec
            try:
                os.setsid()
                # The task gets the default SIGPIPE; the agent keeps Python's SIG_IGN, so that a
                # closed channel is an error it can carry on from, not its death mid-cleanup.
                signal.signal(signal.SIGPIPE, signal.SIG_DFL)
                os.dup2(devnull, 0)
                os.dup2(1, 2)
                stage = "cwd"
                if cwd:
                    os.chdir(cwd)
                stage = "exec"
                os.execvpe(argv[0], argv, env)
            except OSError as exc:
                os.write(errors_w, ("%s:%d" % (stage, exc.errno or 0)).encode())
            finally:
                os._exit(127)
        os.close(errors_w)
        os.close(devnull)
        failure = os.read(errors_r, 256).decode()
        os.close(errors_r)
        if failure:
            os.waitpid(pid, 0)
            stage, _, number = failure.partition(":")
            code = int(number)
            what = ("working directory %r" % cwd) if stage == "cwd" else ("program %r" % argv[0])
            reason = "not found" if code == errno.ENOENT else os.strerror(code)
            report("error cannot start: %s %s" % (what, reason))
            return False
        self.pid = pid
        report("started %d" % pid)
        return True

    # -- the event loop ----------------------------------------------------------------

    def wait_until(self, done, seconds=None):
        """Serve commands, reap children and watch the heartbeat until ``done()`` or ``seconds`` pass."""
        deadline = None if seconds is None else time.monotonic() + seconds
        while True:
            self.reap()
            if done():
                return True
            now = time.monotonic()
            if deadline is not None and (now >= deadline or self.hurry):
                return False
            timeout = TICK if deadline is None else max(0.0, min(TICK, deadline - now))
            readable = select.select([self.wake_r] + ([0] if self.stdin_open else []), [], [], timeout)[0]
            if self.wake_r in readable:
                try:
                    os.read(self.wake_r, 4096)
                except BlockingIOError:
                    pass
            if 0 in readable:
                self.read_commands()
            limit = self.spec.get("timeout")
            if (limit and self.stop_reason is None and self.stdin_open
                    and time.monotonic() - self.last_heartbeat > limit):
                self.stop_reason = "no heartbeat"

    def reap(self):
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.pid:
                self.status = status

    def has_children(self):
        try:
            os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            return True
        except ChildProcessError:
            return False

    def read_commands(self):
        try:
            chunk = os.read(0, 4096)
        except OSError:
            chunk = b""
        if not chunk:
            self.stdin_open = False
            if self.stop_reason is None:
                self.stop_reason = "eof"
            return
        self.last_heartbeat = time.monotonic()
        lines = (self.pending + chunk).split(b"\n")
        self.pending = lines.pop()
        for line in lines:
            self.handle(line.strip().decode("ascii", "replace"))

    def handle(self, command):
        running = self.status is None
        if command == "TERM" and running:
            self.termed = True
            send(self.pid, signal.SIGTERM, group=True)
        elif command == "KILL":
            self.hurry = True
            self.signal_tree(signal.SIGKILL)
        elif command == "DUMP":
            import threading

            threading.Thread(target=self.dump_stacks).start()
        elif command.startswith("SIG ") and running:
            try:
                send(self.pid, int(command[4:]))
            except ValueError:
                pass

    def dump_stacks(self):
        import shutil
        import subprocess

        tool = os.path.join(os.path.dirname(sys.executable), "py-spy")
        if not os.path.exists(tool):
            tool = shutil.which("py-spy")
        if tool is None:
            text = "no stack dump: py-spy is not installed on this host (pip install py-spy)\n"
        elif self.status is not None:
            text = "no stack dump: the task has ended\n"
        else:
            dump = subprocess.Popen([tool, "dump", "--pid", str(self.pid), "--subprocesses"],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            self.helpers.add(dump.pid)
            text = dump.communicate()[0].decode("utf-8", "replace")
        try:
            os.write(2, ("%s stacks-begin\n%s%s stacks-end\n" % (MARK, text, MARK)).encode("utf-8", "replace"))
        except OSError:
            pass

    # -- stopping ----------------------------------------------------------------------

    def signal_tree(self, signum):
        """``signum`` to the task's process group and to every descendant, wherever its session."""
        if self.pid is not None:
            send(self.pid, signum, group=True)
        for pid in process_tree(os.getpid()):
            send(pid, signum)

    def stop_tree(self, grace):
        """SIGTERM to the whole tree, up to ``grace`` seconds for it to end, then SIGKILL until it has."""
        self.signal_tree(signal.SIGTERM)
        if self.wait_until(self.tree_gone, grace):
            return
        for _ in range(100):  # each round: kill what is there, including anything forked meanwhile
            self.signal_tree(signal.SIGKILL)
            if self.wait_until(self.tree_gone, 0.1):
                return

    def tree_gone(self):
        return self.status is not None and not self.has_children()

    def note_leftovers(self):
        for pid in process_tree(os.getpid()):
            if pid not in self.helpers and pid not in self.leftovers:
                self.leftovers[pid] = process_name(pid)

    def run(self):
        if not self.start():
            return 127
        self.wait_until(lambda: self.status is not None or self.stop_reason is not None)
        if self.status is None:  # tflaunch is gone: stop everything, quickly
            self.note_leftovers()
            self.leftovers.pop(self.pid, None)
            self.stop_tree(self.spec.get("eof_grace", 3.0))
        elif self.has_children():  # the task ended and left processes behind
            if self.termed or self.hurry:  # its group was signalled too: let those exits land first
                self.wait_until(self.tree_gone, 0.1)
            self.note_leftovers()
            grace = self.spec["grace"] if self.stop_reason is None else self.spec.get("eof_grace", 3.0)
            self.stop_tree(0.0 if self.hurry else grace)
        for pid in sorted(self.leftovers):
            report("leftover %d %s" % (pid, self.leftovers[pid]))
        if os.WIFSIGNALED(self.status):
            report("exit signal=%d" % os.WTERMSIG(self.status))
            return 128 + os.WTERMSIG(self.status)
        code = os.WEXITSTATUS(self.status)
        report("exit code=%d" % code)
        return code


def main():
    spec = read_spec(sys.argv[1])
    # The agent must outlive a SIGINT/SIGHUP aimed at its session so it can clean up. A no-op
    # handler, not SIG_IGN: ignored signals would stay ignored in the task after exec.
    signal.signal(signal.SIGINT, lambda *_: None)
    signal.signal(signal.SIGHUP, lambda *_: None)
    become_subreaper()
    code = Agent(spec).run()
    os._exit(code)  # no interpreter shutdown while a stack-dump thread may still sit in read()


if __name__ == "__main__":
    main()
