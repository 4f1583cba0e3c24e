"""Starting the agent's processes (tasks and helpers): their environment, their pipes and their
network namespace; posix_spawn or fork and exec; then their stdin and their stack dumps.
:class:`StartingProcesses` is the part of :class:`.loop.Agent` that does it.
"""

import errno
import os
import sys

try:  # the C module: the signal wrapper imports enum, which costs start-up time
    import _signal as signal
except ImportError:
    import signal

from .channel import WIDE_PIPES, set_blocking, widen_pipe
from .protocol import GRACE, OWNER_VARIABLE, Frame, Status, frame, number, write_some
from .threads import ThreadWatch
from .trees import Leader

# posix_spawn with setpgroup or setsid needs Python 3.8; signals the agent ignores or handles go back
# to their defaults in the task (Python ignores SIGPIPE; the agent catches SIGINT, SIGHUP and SIGTERM).
SPAWN = hasattr(os, "posix_spawnp") and hasattr(os, "POSIX_SPAWN_DUP2")
RESET_SIGNALS = (signal.SIGPIPE, signal.SIGINT, signal.SIGHUP, signal.SIGTERM)


def namespace_joiner():
    """setns(fd, kind): Python's own (3.12), else the C library's; OSError where there is none."""
    if hasattr(os, "setns"):
        return os.setns
    import ctypes

    libc_setns = getattr(ctypes.CDLL(None, use_errno=True), "setns", None)
    if libc_setns is None:
        raise OSError(errno.ENOSYS, "this system has no setns")

    def setns(fd, kind):
        if libc_setns(fd, kind) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))

    return setns


def which(program):
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        path = os.path.join(folder, program)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


class Process(object):
    """One process the agent started: a task or a helper, and what is left to do for it."""

    def __init__(self, ident, fields):
        self.id = ident
        self.fields = fields
        self.name = fields.get("name") or str(ident)
        self.grace = number(fields.get("grace"), GRACE)
        self.pid = None
        self.leader = None  # a Leader (launcher.agent.trees): how its group is signalled
        self.status = None  # wait status once reaped
        self.termed = False
        self.catches_term = True  # whether it caught or ignored SIGTERM when tflaunch sent it one
        self.hurry = False
        self.exec_fd = None  # until the exec is known to have worked: the child's error pipe
        self.out_fd = None  # relayed output: the read end of its stdout pipe
        self.wide = False  # whether that pipe holds PIPE_SIZE
        self.read_after = 0.0  # when that pipe is read next, at the soonest (see OUTPUT_TICK)
        self.in_fd = None  # a helper's stdin pipe
        self.in_pending = b""
        self.in_closing = False
        self.queue = []  # frames (header and payload) of its output and status, in order
        self.queued = 0
        self.leftovers = {}  # pid -> name
        self.stopping_at = None  # when leftovers get SIGKILL
        self.settle_until = None
        self.reported = False
        gpus = tuple(int(n) for n in (fields.get("gpus") or "").split(",") if n.isdigit())
        # Seconds between looks at its threads, for tflaunch's straggler rule; None: not watched.
        self.look_every = number(fields.get("watch"))
        self.threads = ThreadWatch(gpus) if self.look_every else None
        self.tree = []  # its process tree at the last sample
        self.waiting = None  # its seconds waited for a CPU so far (launcher.agent.sampling.Waiting), from its first sample


class StartingProcesses(object):
    """The part of :class:`.loop.Agent` that starts processes: it uses the agent's ``processes``,
    ``by_pid``, ``clusters``, ``ports``, ``netns``, ``wide_pipes``, ``control``, ``own_session``,
    ``wake_w`` and its ``say`` and ``narrowed``."""

    def start(self, ident, fields):
        process = Process(ident, fields)
        self.processes[ident] = process
        argv, cwd, output = fields["argv"], fields.get("cwd"), fields.get("output")
        env = dict(os.environ)
        env.update(fields["env"])
        env[OWNER_VARIABLE] = "%d" % ident
        if fields.get("tf_config"):
            cluster, role, index = (fields["tf_config"].split(" ") + ["", "", ""])[:3]
            if not (cluster.isdigit() and int(cluster) in self.clusters and role.isalpha() and index.isdigit()):
                self.refuse(process, "cannot start: tflaunch named no cluster it had sent (%r)" % fields["tf_config"])
                return
            env["TF_CONFIG"] = '{"cluster":%s,"task":{"type":"%s","index":%s}}' % (self.clusters[int(cluster)], role,
                                                                                    index)
        if fields.get("netns") and not self.join_namespaces(process, fields["netns"]):
            return
        self.ports.let_go(fields.get("release"))  # the task is about to bind them
        try:
            if output:
                out_w = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
            else:
                process.out_fd, out_w = os.pipe()
                if self.wide_pipes < WIDE_PIPES and widen_pipe(out_w):
                    process.wide = True
                    self.wide_pipes += 1
            if fields.get("stdin") == "pipe":
                in_r, process.in_fd = os.pipe()
                set_blocking(process.in_fd, False)
            else:
                in_r = os.open(os.devnull, os.O_RDONLY)
        except OSError as exc:
            self.close_pipes(process)
            self.refuse(process, "cannot start: %s" % (exc.strerror or exc))
            return
        if SPAWN and (not cwd or os.path.realpath(cwd) == os.getcwd()):
            self.spawn(process, argv, env, in_r, out_w)
        else:
            self.fork_exec(process, argv, env, cwd, in_r, out_w)

    def join_namespaces(self, process, paths):
        """Join the namespaces whose files are ``paths`` (space-separated, a user namespace first),
        once, before the first task that asks: every task started after is in them, and so is all
        the agent starts for them (stack samples). A sealed run's network (launcher/run/checks/isolation.py)."""
        if self.netns is not None:
            if self.netns != paths:
                self.refuse(process, "cannot start: the agent is in another run's network namespace")
            return self.netns == paths
        try:
            setns = namespace_joiner()
            # Every file is opened first: once in a user namespace of its own, the agent may no
            # longer read tflaunch's /proc/<pid>/fd.
            fds = [os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)) for path in paths.split()]
            try:
                for fd in fds:
                    setns(fd, 0)
            finally:
                for fd in fds:
                    os.close(fd)
        except OSError as exc:
            self.refuse(process, "cannot start: the run's network namespace: %s" % (exc.strerror or exc))
            return False
        self.netns = paths
        return True

    def spawn(self, process, argv, env, in_r, out_w):
        """posix_spawn (vfork underneath): a task starts in a fraction of fork's time."""
        try:
            session = {"setpgroup": 0} if self.own_session else {"setsid": True}
            pid = os.posix_spawnp(argv[0], argv, env, setsigdef=RESET_SIGNALS, **session,
                                  file_actions=[(os.POSIX_SPAWN_DUP2, in_r, 0), (os.POSIX_SPAWN_DUP2, out_w, 1),
                                                (os.POSIX_SPAWN_DUP2, out_w, 2)])
        except OSError as exc:
            self.close_pipes(process)
            reason = "not found" if exc.errno == errno.ENOENT else os.strerror(exc.errno or 0)
            self.refuse(process, "cannot start: program %r %s" % (argv[0], reason))
            return
        finally:
            os.close(in_r)
            os.close(out_w)
        if process.out_fd is not None:
            set_blocking(process.out_fd, False)
        process.pid = pid
        process.leader = Leader(pid)
        self.by_pid[pid] = process
        self.say(process, "%s %d" % (Status.STARTED, pid))

    def fork_exec(self, process, argv, env, cwd, in_r, out_w):
        """fork, then chdir and exec in the child (Python before 3.8, or a working directory of its own)."""
        try:
            errors_r, errors_w = os.pipe()  # close-on-exec: EOF means the exec worked
        except OSError as exc:
            os.close(in_r)
            os.close(out_w)
            self.close_pipes(process)
            self.refuse(process, "cannot start: %s" % (exc.strerror or exc))
            return
        pid = os.fork()
        if pid == 0:  # the process, until exec
            stage = "setup"
            try:
                if self.own_session:
                    os.setpgid(0, 0)
                else:
                    os.setsid()
                # The default SIGPIPE for the process; the agent keeps Python's SIG_IGN, so that a
                # closed channel is an error it can carry on from, not its death mid-cleanup.
                signal.signal(signal.SIGPIPE, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                signal.signal(signal.SIGHUP, signal.SIG_DFL)
                os.dup2(in_r, 0)
                os.dup2(out_w, 1)
                os.dup2(out_w, 2)
                stage = "cwd"
                if cwd:
                    os.chdir(cwd)
                stage = "exec"
                os.execvpe(argv[0], argv, env)
            except OSError as exc:
                os.write(errors_w, ("%s:%d" % (stage, exc.errno or 0)).encode())
            finally:
                os._exit(127)
        for fd in (out_w, in_r, errors_w):
            os.close(fd)
        # Whether the exec worked is read when its pipe is ready, not waited for here: the next
        # task is forked meanwhile, and a thousand tasks start in parallel rather than in a row.
        set_blocking(errors_r, False)
        process.exec_fd = errors_r
        process.pid = pid
        process.leader = Leader(pid)
        self.by_pid[pid] = process

    def exec_result(self, process):
        """The child wrote why its exec failed, or closed the pipe by exec'ing: report which."""
        try:
            failure = os.read(process.exec_fd, 256).decode()
        except (BlockingIOError, InterruptedError):
            return
        os.close(process.exec_fd)
        process.exec_fd = None
        if failure:
            self.close_pipes(process)
            stage, _, code = failure.partition(":")
            code = int(code or 0)
            argv, cwd = process.fields["argv"], process.fields.get("cwd")
            what = ("working directory %r" % cwd) if stage == "cwd" else ("program %r" % argv[0])
            reason = "not found" if code == errno.ENOENT else os.strerror(code)
            self.refuse(process, "cannot start: %s %s" % (what, reason))
            return
        if process.out_fd is not None:
            set_blocking(process.out_fd, False)
        self.say(process, "%s %d" % (Status.STARTED, process.pid))

    def refuse(self, process, reason):
        self.say(process, "%s %s" % (Status.ERROR, reason))
        process.reported = True

    def close_pipes(self, process):
        self.narrowed(process)
        for name in ("out_fd", "in_fd"):
            fd = getattr(process, name)
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
                setattr(process, name, None)

    def write_stdin(self, process):
        while process.in_pending and process.in_fd is not None:
            sent = write_some(process.in_fd, process.in_pending)
            if sent is None:
                process.in_pending = b""
                break
            if not sent:
                return
            process.in_pending = process.in_pending[sent:]
        if process.in_closing and not process.in_pending and process.in_fd is not None:
            os.close(process.in_fd)
            process.in_fd = None

    def dump_stacks(self, process):
        """py-spy's dump of the task, as a helper whose output becomes one ``D`` frame."""
        tool = os.path.join(os.path.dirname(sys.executable), "py-spy")
        if not os.path.exists(tool):
            tool = which("py-spy")
        if tool is None:
            self.control.append(frame(Frame.STACKS, process.id,
                                      b"no stack dump: py-spy is not installed on this host (pip install py-spy)\n"))
        elif process.status is not None or process.pid is None:
            self.control.append(frame(Frame.STACKS, process.id, b"no stack dump: the task has ended\n"))
        else:
            import threading

            # On a thread: a dump takes a while, and the loop must go on serving every other task.
            threading.Thread(target=self.run_dump, args=(tool, process.id, process.pid), daemon=True).start()

    def run_dump(self, tool, ident, pid):
        import subprocess

        try:
            text = subprocess.run([tool, "dump", "--pid", str(pid), "--subprocesses"],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=20).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            text = ("no stack dump: %s\n" % exc).encode()
        self.control.append(frame(Frame.STACKS, ident, text))
        try:
            os.write(self.wake_w, b"x")
        except OSError:
            pass  # the loop is awake already
