"""The host agent: one per host per run. It starts every task of its host, watches them, and makes
sure that everything a task started ends with it (standard library only, Python 3.6+).

tflaunch runs it as ``python -I -S -c <source> <spec>``: on this machine as its child, on another
host through one ssh connection, on a Slurm node as the one task of a job step. Its channel to
tflaunch is one byte stream each way: stdin and stdout, or (``connect`` in the spec) a TCP
connection it opens back to tflaunch. The spec (``sys.argv[1]``) is base64 of NUL-separated
``key, value`` pairs (see :func:`decode_fields`): ``keepalive`` (seconds without a word from tflaunch
before everything is stopped; empty: never), ``eof_grace`` (TERM to KILL when tflaunch is gone),
``sample`` (seconds between resource samples), ``beat`` (seconds between heartbeats, each way:
``HEARTBEAT`` unless tflaunch spaces them out for a large run, see :func:`beat_for`),
optionally ``connect`` (``host port``), ``connect_within`` (seconds to keep trying it,
``CONNECT_WITHIN`` unless given) and
``setup_log`` (a descriptor open on the file the host's ``setup`` line writes to: the agent relays
what it and any job it left behind print, so that nothing but the agent writes to the channel).

Every fact of the protocol is defined in this module, once; tflaunch imports it from here. Whatever
breaks the protocol in either direction (an unknown kind or verb, a frame or command line over
``MAX_FRAME``, bytes that are no frame) ends the channel at once with one line saying what was read.

**Commands** (tflaunch to agent) are lines (``Command``); every whole line, an empty one too,
counts as a heartbeat, and tflaunch sends an empty one only after ``beat`` seconds without another:

- ``CLUSTER <id> <base64>``: the JSON text of a TensorFlow cluster, sent once per host however
  many of its tasks see it (TF_CONFIG lists every task: one copy per task would make a run's
  traffic grow with the square of its size);
- ``START <id> <spec>``: start a process (a task, or a helper such as a probe); its spec gives
  ``argv``, ``env``, ``cwd``, ``grace``, ``name``, ``output`` (a log file the process writes
  to directly; empty: its output is relayed over the channel), ``stdin`` (``pipe`` or ``null``)
  ``tf_config`` (``<cluster id> <role> <index>``: the agent sets TF_CONFIG from that cluster)
  ``watch`` (``1``: its threads are watched for tflaunch's straggler rule, :class:`ThreadWatch`)
  and ``gpus`` (its GPUs' indices, ``0,1``: read with NVML for that rule);
- ``IN <id> <base64>`` and ``CLOSE <id>``: bytes for a helper's stdin, and its EOF;
- ``PORTS <id> <n>``: pick n free TCP ports on this host and hold them, each bound on every
  address without SO_REUSEADDR (no other user's program can bind it, whatever options it sets,
  nor get it from the kernel) and with SO_REUSEPORT set after the bind (this user's probes, which
  set it too, can still listen there); a task whose ``release`` field names one gets it freed
  just before it starts, since TensorFlow does not set SO_REUSEPORT. Each port is also claimed for
  as long as the agent runs (see :class:`PortClaims`), so that no other tflaunch run of this
  user's on the host is given it while this run's task starts or restarts on it;
- ``TERM <id>`` (SIGTERM to the task's process group), ``KILL <id>`` (SIGKILL to its whole tree),
  ``SIG <id> <n>`` (signal n to its main process), ``DUMP <id>`` (its Python stacks, by py-spy).

EOF on the channel, or no heartbeat for ``keepalive`` seconds, means tflaunch is gone: every process
is stopped (SIGTERM, ``eof_grace``, SIGKILL) and the agent exits.

**Frames** (agent to tflaunch, ``Frame``) follow the ``SYNC`` mark (what a login shell printed
comes before it), each ``HEADER``: ``kind (1 byte), id (4), length (4)``, then at most ``MAX_FRAME``
bytes of payload: ``H`` heartbeat, ``P`` the ports picked for ``PORTS <id>``
(space-separated; empty with ``error <reason>`` when they could not be had), ``O`` output of process ``id``,
``S`` a status line of process ``id`` (``Status``: ``started <pid>``, ``error <reason>``, ``leftover
<pid> <name>``, ``exit code=<n>`` or ``exit signal=<n>``, always last, with `` termed`` when
tflaunch's ``TERM`` is what ended the process), ``D`` a stack dump, ``R``
resource samples of each task's tree (``id rss_bytes cpu_seconds processes`` per line, and for a
task started with ``watch`` set, ``looks stalled run_ns queue_ns census_at`` after them, and for one with
GPUs ``gpu_looks gpu_slowdown`` after those: see :class:`ThreadWatch`), ``L`` what
the host's setup line printed. ``H``, ``R`` and ``L`` carry id 0; the others an id tflaunch gave
in a command. A heartbeat goes out only after ``beat`` seconds without another frame. Status
frames of one process follow its output; the writer takes turns between processes, so one that
floods its output cannot delay another's status, and heartbeats go first of all. A process's
output pipe is not read
while much of its output waits to be sent, so a slow channel slows that process, never loses bytes.

The agent is a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``): whatever a task starts in a
session of its own, or by double-forking, comes back to the agent rather than to init, is known
by the ``TFLAUNCH_AGENT_TASK`` variable it inherited, and is stopped (and reported as a leftover)
when its task ends.
"""

import binascii
import errno
import os
import select
import struct
import sys
import time

try:  # the C module: the signal wrapper imports enum, which costs start-up time
    import _signal as signal
except ImportError:
    import signal

PR_SET_CHILD_SUBREAPER = 36
TICK = 0.25  # how often the setup line's output file is looked at (a regular file cannot be waited on)
CHUNK = 1 << 16  # one output frame at most, and what the writer sends of one process per turn
QUEUE_LIMIT = 1 << 20  # output bytes of one process waiting to be sent before its pipe is left unread
# A relayed process's output pipe holds this much instead of 64 KiB, so a chatty task writes on
# while the agent sends: fewer wake-ups, larger reads (a log flood's cost). Kernel memory a user's
# pipes may take is limited (pipe-user-pages-soft, 64 MiB by default; past it every new pipe of
# that user gets 4 KiB), so only WIDE_PIPES of an agent's processes at a time have one.
PIPE_SIZE = 1 << 20
WIDE_PIPES = 16
# A wide pipe is read at most every OUTPUT_TICK, then as far as it holds: a chatty task's output
# comes in a few hundred large reads a second, whatever its rate, rather than in a wake-up of the
# agent per line it writes (the pipe holds what it writes meanwhile). A narrow one is read at once.
OUTPUT_TICK = 0.005

# -- the protocol: both ends take every fact of it from here ------------------------------------

# Heartbeats (each way) come BEATS_PER_TIMEOUT to a keep-alive timeout: a peer that falls silent is
# noticed within the timeout however far apart they are, so more would only cost (every one is a
# wake-up and a frame on both sides), and a small run pays no more than a large one. Never closer
# than HEARTBEAT; without a timeout, HEARTBEAT apart up to BEATS_PER_SECOND hosts, then further.
HEARTBEAT = 1.0
BEATS_PER_TIMEOUT = 4
BEATS_PER_SECOND = 128
# Resource samples likewise: every SAMPLE seconds on a run of up to SAMPLES_PER_SECOND remote hosts,
# further apart on a larger one, but at most SAMPLE_AT_MOST apart (a hang watchdog judges CPU over
# its window). tflaunch tells each agent its ``sample`` and ``beat`` in the spec.
SAMPLE = 2.0
SAMPLES_PER_SECOND = 128
SAMPLE_AT_MOST = 10.0
# Left out of a spec, a process's grace (TERM to KILL) is GRACE; tflaunch always sends its own,
# launcher.options.GRACE, which a test holds equal to this one (the agent imports nothing of tflaunch's).
GRACE = 5.0
# tflaunch is gone (EOF, or no word for ``keepalive`` seconds): nothing records what the tasks do any
# more, and the next run wants their ports and GPUs, so every process gets at most this long between
# TERM and KILL, whatever its grace: its whole tree is gone within about 2 s. tflaunch sends the
# smaller of this and the run's grace as ``eof_grace``.
EOF_GRACE = 1.0
HEADER = struct.Struct(">cII")  # a frame's kind, the id it is about, its payload's length
# Written before the first frame: whatever a login shell printed comes before it.
SYNC = b"\0TFLAUNCH-AGENT-2\0"
# The most payload one frame carries, and the longest command line: a length over it is no frame
# (four printable bytes read as a length are 512 MiB or more), so a stray line is caught at once.
MAX_FRAME = 1 << 24
OWNER_VARIABLE = "TFLAUNCH_AGENT_TASK"  # in each task's environment: the id of the task it belongs to
TOKEN_BYTES = 256  # at most this much of a Slurm agent's stdin is its token, its proof when it connects back

# The connect-back handshake (Slurm): each end proves that it holds the token without sending it.
#   agent -> listener: ``TFLAUNCH-HELLO <name> <agent nonce>\n``
#   listener -> agent: ``<listener nonce> <proof("listener")>\n``
#   agent -> listener: ``<proof("agent")>\n``
#   listener -> agent: ``WELCOME``, then commands; the agent's frames follow its proof.
# A proof is HMAC-SHA256 under the token of the side's label, the name and both nonces (hex): each
# side's nonce makes a proof good for one connection only, the label keeps one side's proof from
# being replayed as the other's. The agent obeys nothing until the listener's proof checks out.
HELLO_MARK = b"TFLAUNCH-HELLO"
WELCOME = b"TFLAUNCH-WELCOME\n"  # the listener took the agent's proof: the channel is open
HELLO_LIMIT = 512  # any one line of the handshake: a mark, a host name (255 at most), nonces and proofs
NONCE_BYTES = 16
CONNECT_WITHIN = 60.0  # seconds an agent keeps trying to reach a listener that proves itself
CONNECT_BACKOFF = (0.25, 4.0)  # the first pause between tries, and the longest


def hello_line(name, nonce):
    """A connect-back agent's first line: who is calling, and its nonce (bytes, hex)."""
    return HELLO_MARK + b" " + name + b" " + nonce + b"\n"


def read_hello(line):
    """(name, nonce) as bytes from a first line without its newline, or None; never decoded."""
    parts = line.split(b" ")
    if len(parts) != 3 or parts[0] != HELLO_MARK or not parts[1] or not is_nonce(parts[2]):
        return None
    return parts[1], parts[2]


def is_nonce(text):
    return len(text) == 2 * NONCE_BYTES and all(c in b"0123456789abcdef" for c in bytearray(text))


def new_nonce():
    return binascii.hexlify(os.urandom(NONCE_BYTES))


def handshake_proof(token, side, name, agent_nonce, listener_nonce):
    """The proof (hex bytes) that ``side`` (b"agent" or b"listener") holds ``token`` (bytes)."""
    import hashlib
    import hmac

    return hmac.new(token, b"\0".join((side, name, agent_nonce, listener_nonce)), hashlib.sha256).hexdigest().encode()


def beat_for(hosts, keepalive):
    """Seconds between heartbeats (each way) in a run of ``hosts`` agents whose keep-alive timeout
    is ``keepalive`` seconds (None: none): a ``BEATS_PER_TIMEOUT``-th of the timeout, whatever the
    run's size; without one, ``HEARTBEAT`` up to ``BEATS_PER_SECOND`` hosts, then growing with them.
    Never under ``HEARTBEAT``."""
    if keepalive:
        return max(HEARTBEAT, float(keepalive) / BEATS_PER_TIMEOUT)
    return max(HEARTBEAT, float(hosts) / BEATS_PER_SECOND)


def sample_for(hosts):
    """Seconds between each agent's resource samples in a run of ``hosts`` remote agents."""
    return min(SAMPLE_AT_MOST, max(SAMPLE, float(hosts) / SAMPLES_PER_SECOND))


class Frame(object):
    """The kinds of frame (agent to tflaunch)."""

    HEARTBEAT = b"H"
    PORTS = b"P"
    OUTPUT = b"O"
    STATUS = b"S"
    STACKS = b"D"
    READINGS = b"R"
    SETUP = b"L"
    OF_HOST = (HEARTBEAT, READINGS, SETUP)  # id 0
    OF_REQUEST = (PORTS, OUTPUT, STATUS, STACKS)  # the id of a command tflaunch sent


class Command(object):
    """The verbs of the command lines (tflaunch to agent)."""

    START = "START"
    CLUSTER = "CLUSTER"
    IN = "IN"
    CLOSE = "CLOSE"
    PORTS = "PORTS"
    TERM = "TERM"
    KILL = "KILL"
    SIG = "SIG"
    DUMP = "DUMP"
    ALL = (START, CLUSTER, IN, CLOSE, PORTS, TERM, KILL, SIG, DUMP)


class Status(object):
    """The first word of a status frame (and of a ports answer that failed)."""

    STARTED = "started"
    ERROR = "error"
    LEFTOVER = "leftover"
    EXIT = "exit"
    CODE = "code="  # after EXIT
    SIGNAL = "signal="  # after EXIT
    TERMED = "termed"  # after the code or signal: tflaunch's TERM is what ended the process


def printable(data, limit=32):
    """``data`` as a quoted, escaped, truncated string, to name bytes that broke the protocol."""
    shown = []
    for byte in bytearray(data[:limit]):
        char = chr(byte)
        if char in "\\'":
            shown.append("\\" + char)
        elif 32 <= byte < 127:
            shown.append(char)
        else:
            shown.append({"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(char, "\\x%02x" % byte))
    return "'%s%s'" % ("".join(shown), "\u2026" if len(data) > limit else "")


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


def encode_fields(pairs):
    """``key, value`` pairs as :func:`decode_fields` reads them: base64, so that no shell reads them.

    Raises ValueError for a NUL character (it cannot reach a program) and for more than one
    command line can carry."""
    tokens = []
    for key, value in pairs.items():
        if value is None:
            continue
        if key == "argv":
            tokens += [key, str(len(value))] + list(value)
        elif key == "env":
            items = [x for item in value.items() for x in item]
            tokens += [key, str(len(items))] + items
        else:
            tokens += [key, str(value)]
    joined = "\0".join(tokens)
    if joined.count("\0") > max(len(tokens) - 1, 0):  # more than the NULs between tokens: one inside
        raise ValueError("an argument or environment value contains a NUL character")
    encoded = binascii.b2a_base64(joined.encode("utf-8"), newline=False).decode("ascii")
    if len(encoded) > MAX_FRAME - 64:  # the verb and the id share the line
        raise ValueError("its arguments and environment take %d bytes encoded, more than the %d one command "
                         "to a host's agent may carry" % (len(encoded), MAX_FRAME - 64))
    return encoded
# posix_spawn with setpgroup or setsid needs Python 3.8; signals the agent ignores or handles go back
# to their defaults in the task (Python ignores SIGPIPE; the agent catches SIGINT, SIGHUP and SIGTERM).
SPAWN = hasattr(os, "posix_spawnp") and hasattr(os, "POSIX_SPAWN_DUP2")
RESET_SIGNALS = (signal.SIGPIPE, signal.SIGINT, signal.SIGHUP, signal.SIGTERM)
SETTLE = 0.1  # after a TERM to a task's group: its members get this long to end before counting leftovers


def decode_fields(encoded):
    """NUL-separated ``key, value`` pairs from base64; ``argv`` and ``env`` are ``key, count,
    item...`` (env items alternate name and value). NUL cannot occur in an argument or a variable."""
    tokens = binascii.a2b_base64(encoded).decode("utf-8").split("\0")
    fields, i = {"env": {}, "argv": []}, 0
    while i + 1 < len(tokens):
        key = tokens[i]
        if key in ("argv", "env"):
            count = int(tokens[i + 1])
            items = tokens[i + 2:i + 2 + count]
            fields[key] = items if key == "argv" else dict(zip(items[::2], items[1::2]))
            i += 2 + count
        else:
            fields[key] = tokens[i + 1]
            i += 2
    return fields


def number(value, default=None):
    return float(value) if value else default


def frame(kind, ident, payload=b""):
    """One frame as its two pieces, header and payload (the writer hands both to writev: a large
    payload is never copied to join them); a payload over ``MAX_FRAME`` (a huge stack dump) is cut there."""
    payload = payload[:MAX_FRAME]
    return HEADER.pack(kind, ident, len(payload)), payload


def read_some(fd, size):
    """What a non-blocking descriptor holds now: None when nothing yet, b"" at its end (an error
    ends it too)."""
    try:
        return os.read(fd, size)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError:
        return b""


def write_some(fd, data):
    """How much of ``data`` a non-blocking descriptor takes now: 0 when it is full, None when it is gone."""
    try:
        return os.write(fd, data)
    except (BlockingIOError, InterruptedError):
        return 0
    except OSError:
        return None


IOV_MAX = 1024  # the most pieces one writev takes (Linux)


def write_pieces(fd, pieces):
    """Write what a non-blocking descriptor takes now of ``pieces`` (bytes, in order), in one
    system call: the pieces left, the first of them cut where the write stopped; None when the
    descriptor is gone."""
    try:
        sent = os.writev(fd, pieces[:IOV_MAX])
    except (BlockingIOError, InterruptedError):
        return pieces
    except OSError:
        return None
    if not sent:
        return pieces
    for i, piece in enumerate(pieces):
        if sent < len(piece):
            return ([memoryview(piece)[sent:]] if sent else [piece]) + pieces[i + 1:]
        sent -= len(piece)
    return []


# Claims on this host's ports against this user's other runs: from the moment a task's port is let
# go until the task has bound it (TensorFlow's start-up, seconds) the kernel would hand the port to
# the next run that asks; a claim makes this user's next run pass it by. A claim is an
# open-file-description lock on one byte of a lock file in a folder of this user's alone, so no
# other user can take, block or see it; the byte is a keyed hash of the port (the key is the file's
# first KEY_BYTES), so /proc/locks, which everyone reads, names no port. The kernel drops the locks
# when the agent exits. tflaunch's own machine keeps its picks in a lock of its own
# (launcher.cluster.ports); this agent carries only itself, so it holds its own copy of the rules.
CLAIM_FILE = "port-claims-%s.lock"
CLAIM_TRIES = 256  # ports picked and passed by, at most, before PORTS gives up
KEY_BYTES = 32
F_OFD_SETLK, F_OFD_SETLKW = 37, 38  # Linux's numbers; the fcntl module names them from Python 3.9


def claim_folders(environ):
    """Where this user's claims may live, in the order tried: ``$XDG_RUNTIME_DIR`` (made for this
    user alone), ``$TMPDIR`` (or /tmp) ``/tflaunch-<uid>``, then ``~/.cache/tflaunch``."""
    folders = []
    runtime = environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(runtime):
        folders.append(os.path.join(runtime, "tflaunch"))
    temp = environ.get("TMPDIR", "")
    folders.append(os.path.join(temp if os.path.isabs(temp) else "/tmp", "tflaunch-%d" % os.geteuid()))
    cache = environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(cache):
        cache = os.path.join(os.path.expanduser("~"), ".cache")
    if os.path.isabs(cache):
        folders.append(os.path.join(cache, "tflaunch"))
    return folders


def lock_struct(kind, start, length=1):
    """A ``struct flock`` (l_type, l_whence, l_start, l_len, and l_pid 0, as OFD locks want)."""
    return struct.pack("hhqqi4x", kind, os.SEEK_SET, start, length, 0)


class PortClaims(object):
    """This user's claims on this host's ports, kept in the first of ``folders`` that is the
    user's alone and can lock; with none, no claim can be had and every one succeeds."""

    def __init__(self, folders):
        self.fd, self.key = None, b""
        for folder in folders:
            fd = None
            try:
                fd = own_file(folder, CLAIM_FILE % node_name())
                self.key = claim_key(fd)
            except OSError:
                if fd is not None:
                    os.close(fd)
                continue  # not the user's alone, or no locks there: the next folder
            self.fd = fd
            return

    def claim(self, port):
        """True once ``port`` is claimed, False when another run of this user's holds it."""
        import fcntl

        if self.fd is None:
            return True
        try:
            fcntl.fcntl(self.fd, F_OFD_SETLK, lock_struct(fcntl.F_WRLCK, self.byte(port)))
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EAGAIN):
                return False
            raise
        return True

    def release(self, port):
        import fcntl

        if self.fd is not None:
            fcntl.fcntl(self.fd, F_OFD_SETLK, lock_struct(fcntl.F_UNLCK, self.byte(port)))

    def byte(self, port):
        import hashlib
        import hmac

        return KEY_BYTES + int(hmac.new(self.key, b"%d" % port, hashlib.sha256).hexdigest()[:12], 16)


def own_file(folder, name):
    """A read-write descriptor of ``name`` in ``folder`` (both made if missing), when the folder is
    this user's and only theirs to write and neither is a link; a name that is not the user's own
    plain file is replaced (what it points to is never touched). OSError saying why not."""
    import stat

    try:
        os.makedirs(folder, 0o700)
    except FileExistsError:
        pass
    folder_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        info = os.fstat(folder_fd)
        if info.st_uid != os.geteuid():
            raise OSError(errno.EPERM, "the folder belongs to user %d" % info.st_uid)
        if info.st_mode & 0o077:
            os.fchmod(folder_fd, 0o700)  # the user's own: from now on no one else can add a name
        for _ in range(2):
            try:
                fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600,
                             dir_fd=folder_fd)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENXIO):
                    raise
            else:
                info = os.fstat(fd)
                if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid() and info.st_nlink == 1:
                    if info.st_mode & 0o077:
                        os.fchmod(fd, 0o600)
                    return fd
                os.close(fd)
            os.unlink(name, dir_fd=folder_fd)
        raise OSError(errno.EPERM, "%s there is not this user's plain file" % name)
    finally:
        os.close(folder_fd)


def claim_key(fd):
    """The lock file's key, written by whichever agent comes first, under a lock on it: where the
    file system has no locks (NFS without its lock daemon) that lock fails, and with it the folder."""
    import fcntl

    fcntl.fcntl(fd, F_OFD_SETLKW, lock_struct(fcntl.F_WRLCK, 0, KEY_BYTES))
    try:
        key = os.pread(fd, KEY_BYTES, 0)
        if len(key) < KEY_BYTES:
            key = os.urandom(KEY_BYTES)
            os.pwrite(fd, key, 0)
        return key
    finally:
        fcntl.fcntl(fd, F_OFD_SETLK, lock_struct(fcntl.F_UNLCK, 0, KEY_BYTES))


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


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def handles(pid, signum):
    """Whether process ``pid`` catches or ignores ``signum`` (True when that cannot be read)."""
    try:
        with open("/proc/%d/status" % pid, "rb") as status:
            masks = [line.split()[1] for line in status if line.startswith((b"SigCgt:", b"SigIgn:"))]
        return len(masks) != 2 or any(int(mask, 16) >> (signum - 1) & 1 for mask in masks)
    except (OSError, ValueError, IndexError):
        return True


def send(pid, signum, group=False):
    try:
        (os.killpg if group else os.kill)(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


def usage(pids, page=os.sysconf("SC_PAGE_SIZE"), ticks=os.sysconf("SC_CLK_TCK")):
    """(resident bytes, CPU seconds) of ``pids``; the first one's reaped children's CPU counts too."""
    rss = cpu = 0
    for n, pid in enumerate(pids):
        try:
            with open("/proc/%d/stat" % pid, "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
            with open("/proc/%d/statm" % pid, "rb") as statm:
                rss += int(statm.read().split()[1]) * page
        except (OSError, IndexError, ValueError):
            continue
        cpu += int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if n == 0 else 0)
    return rss, cpu / float(ticks)


# -- a task's threads, for tflaunch's straggler rule (launcher/run/stragglers.py) --------------

LOOK_EVERY = 1.0  # seconds between looks at a watched task's threads
CENSUS_LOOKS = 10  # looks between readings of its threads' CPU and run-queue times
FULL_CENSUSES = 6  # censuses between readings of all its threads (else: those that ran, and new ones)
DISCOVER = 2  # threads looked at per look besides the suspects, in turn, to find new suspects
MOST_SUSPECTS = 16
SUSPECT_LOOKS = 30  # looks after which a suspect not seen stalled again is one no more
# A thread holds its task up by itself when it sleeps on purpose or waits for a disk: its kernel
# wait channel (/proc/<pid>/task/<tid>/wchan) names one of these. A thread waiting on a lock, a
# condition, a socket or a pipe (futex, epoll, poll) waits for something else; a running or
# runnable thread shows "0", and the run-queue time tells what it waited for a CPU.
STALL_WAITS = ("nanosleep", "io_schedule", "folio_wait", "page_bit", "bit_wait", "filemap", "blk", "jbd2",
               "nfs", "fuse", "rpc_wait", "ext4", "xfs")


def read_small(path):
    """The first bytes of a small /proc file, or None when it is gone (the thread ended)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 256)
    except OSError:
        return None
    finally:
        os.close(fd)


def stalls(key):
    """Whether thread ``key`` ((pid, tid)) sleeps on purpose or waits for a disk; None: gone."""
    channel = read_small("/proc/%d/task/%d/wchan" % key)
    if channel is None:
        return None
    channel = channel.decode("ascii", "replace")
    return any(word in channel for word in STALL_WAITS)


# NVML's clock throttle reasons that hold a busy GPU below its peak (nvml.h): clocks set lower
# (application or locked clocks), a software power cap, a hardware slowdown, software and hardware
# thermal slowdown, a power brake. Idle and sync boost are left out. Peers held alike cancel out in
# tflaunch's comparison; the one held lower than its peers stands out.
GPU_SLOWDOWNS = 0x2 | 0x4 | 0x8 | 0x20 | 0x40 | 0x80
NVML_CLOCK_SM = 1


class Nvml(object):
    """This host's GPUs through NVML (``libnvidia-ml.so.1``), opened once, where there is one:
    :meth:`reading` gives a GPU's SM clock, its highest SM clock, its throttle reasons and its
    utilisation. GPU indices are NVML's, which are CUDA's under ``CUDA_DEVICE_ORDER=PCI_BUS_ID``
    (tflaunch sets it with ``CUDA_VISIBLE_DEVICES``)."""

    opened = None  # the one instance, once tried; False where NVML cannot be had

    @classmethod
    def here(cls):
        if cls.opened is None:
            try:
                cls.opened = cls()
            except (OSError, AttributeError):
                cls.opened = False
        return cls.opened or None

    def __init__(self):
        import ctypes

        self.ctypes = ctypes
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        if self.lib.nvmlInit_v2() != 0:
            raise OSError("nvmlInit failed")
        self.handles = {}

    def reading(self, index):
        """(SM MHz, highest SM MHz, throttle reasons, utilisation %) of GPU ``index``, or None."""
        ctypes = self.ctypes
        handle = self.handles.get(index)
        if handle is None:
            handle = ctypes.c_void_p()
            if self.lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle)) != 0:
                return None
            self.handles[index] = handle
        clock, most = ctypes.c_uint(), ctypes.c_uint()
        reasons = ctypes.c_ulonglong()
        use = (ctypes.c_uint * 2)()  # nvmlUtilization_t: gpu, memory
        if (self.lib.nvmlDeviceGetClockInfo(handle, NVML_CLOCK_SM, ctypes.byref(clock)) != 0
                or self.lib.nvmlDeviceGetMaxClockInfo(handle, NVML_CLOCK_SM, ctypes.byref(most)) != 0
                or self.lib.nvmlDeviceGetCurrentClocksThrottleReasons(handle, ctypes.byref(reasons)) != 0
                or self.lib.nvmlDeviceGetUtilizationRates(handle, use) != 0):
            return None
        return clock.value, most.value, reasons.value, use[0]


def gpu_slowdown(reading):
    """How much slower than its peak a GPU runs because it is throttled (0: not slowed down)."""
    clock, most, reasons, _ = reading
    if not reasons & GPU_SLOWDOWNS or not most:
        return 0.0
    return max(0.0, 1.0 - float(clock) / most)


class ThreadWatch(object):
    """What one watched task's threads do, as running totals that tflaunch compares across the
    cluster's tasks: in synchronous training every task waits for the slowest one, and what sets
    the slowest apart is not its step time (the same for all) but what it does meanwhile.

    - ``looks`` and ``stalled``: every ``LOOK_EVERY`` seconds the agent looks at the wait channel
      of some of the task's threads; ``stalled`` sums, over the looks, how many of them sleep on
      purpose or wait for a disk (an input pipeline that sleeps or reads slowly). A census's look
      takes every thread that runs; the others take the threads seen stalled lately
      (``suspects``: an input pipeline's work hops between a pool's threads) and ``DISCOVER``
      others in turn, so a look costs a few reads however many threads TensorFlow made.
    - ``gpu_looks`` and ``gpu_slowdown`` (sent only for a task with GPUs on a host with NVML):
      at each census, how much slower than its highest clock the task's slowest GPU runs because
      it is throttled (power cap, thermal or hardware slowdown, power brake), summed.
    - ``run_ns`` and ``queue_ns`` as of ``census_at`` (the agent's monotonic clock): the task's
      threads' CPU time and time spent runnable but waiting for a CPU (``/proc/<pid>/task/<tid>/schedstat``) since it was first watched: a task
      sharing its cores with another program waits in the run queue while its peers wait for it.
      Read every ``CENSUS_LOOKS`` looks for the threads new since the last census and those that
      ran since the last full census, which reads every thread, every ``FULL_CENSUSES`` censuses.
    """

    def __init__(self, gpus=()):
        self.gpus = gpus  # the task's GPUs: NVML is read at each census where there are any
        self.gpu_looks = 0
        self.gpu_slowdown = 0.0
        self.looks = 0
        self.stalled = 0.0
        self.run_ns = 0
        self.queue_ns = 0
        self.census_at = 0.0  # the agent's monotonic clock at the last census, which the times are as of
        self.times = {}  # (pid, tid) -> (run_ns, queue_ns, timeslices) at its last reading
        self.live = []  # threads that ran since the last full census, and new ones
        self.suspects = {}  # threads seen stalled -> the look that last saw them so
        self.turn = 0
        self.censuses = 0

    def look(self, pids):
        census = self.looks % CENSUS_LOOKS == 0
        if census:
            self.census(pids, full=self.censuses % FULL_CENSUSES == 0)
            self.censuses += 1
            self.look_at_gpus()
        self.looks += 1
        if census:
            keys = list(self.live)  # every thread that runs: the suspects' roll is made afresh
        else:
            others = [key for key in self.live if key not in self.suspects]
            count = min(DISCOVER, len(others))
            keys = list(self.suspects) + [others[(self.turn + n) % len(others)] for n in range(count)]
            self.turn = (self.turn + count) % max(1, len(others))
        stalled = 0
        for key in keys:
            state = stalls(key)
            if state is None:
                self.suspects.pop(key, None)
            elif state:
                stalled += 1
                if key in self.suspects or len(self.suspects) < MOST_SUSPECTS:
                    self.suspects[key] = self.looks
            elif self.looks - self.suspects.get(key, self.looks) > SUSPECT_LOOKS:
                del self.suspects[key]  # not seen stalled for a while: a thread of a pool that moved on
        self.stalled += stalled

    def census(self, pids, full):
        """Add the CPU and run-queue time its threads used since the last census: of every thread
        when ``full``, else of those that ran since the last full one and those new since."""
        keys = []
        for pid in pids:
            try:
                keys += [(pid, int(tid)) for tid in os.listdir("/proc/%d/task" % pid)]
            except (OSError, ValueError):
                continue
        first = not self.times
        if full and not first:
            present = set(keys)
            for key in [key for key in self.times if key not in present]:
                del self.times[key]
        was_live = set(self.live)
        self.census_at = time.monotonic()
        live = []
        for key in keys:
            before = self.times.get(key)
            if not (full or before is None or key in was_live):
                continue
            text = read_small("/proc/%d/task/%d/schedstat" % key)
            try:
                times = tuple(int(x) for x in text.split()[:3])
            except (AttributeError, ValueError):
                continue
            if before is None:
                before = times if first else (0, 0, -1)  # born since the first census: all of it counts
            self.run_ns += max(0, times[0] - before[0])
            self.queue_ns += max(0, times[1] - before[1])
            if first or times[2] != before[2] or (not full and key in was_live):
                live.append(key)
            self.times[key] = times
        self.live = live

    def look_at_gpus(self):
        nvml = Nvml.here() if self.gpus else None
        readings = [nvml.reading(index) for index in self.gpus] if nvml else []
        readings = [reading for reading in readings if reading is not None]
        if readings:
            self.gpu_looks += 1
            self.gpu_slowdown += max(gpu_slowdown(reading) for reading in readings)

    def totals(self):
        text = "%d %.2f %d %d %.3f" % (self.looks, self.stalled, self.run_ns, self.queue_ns, self.census_at)
        if self.gpu_looks:
            text += " %d %.3f" % (self.gpu_looks, self.gpu_slowdown)
        return text


class Process(object):
    """One process the agent started: a task or a helper, and what is left to do for it."""

    def __init__(self, ident, fields):
        self.id = ident
        self.fields = fields
        self.name = fields.get("name") or str(ident)
        self.grace = number(fields.get("grace"), GRACE)
        self.pid = None
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
        self.threads = ThreadWatch(gpus) if fields.get("watch") == "1" else None
        self.tree = []  # its process tree at the last sample


class Agent(object):
    def __init__(self, spec, read_fd, write_fd, own_session=False):
        self.spec = spec
        # Whether the agent leads a session of its own (see lead_session): each task then starts in
        # a process group of its own within it, else in a session of its own.
        self.own_session = own_session
        self.read_fd, self.write_fd = read_fd, write_fd
        self.keepalive = number(spec.get("keepalive"))
        self.eof_grace = number(spec.get("eof_grace"), EOF_GRACE)
        self.sample_every = number(spec.get("sample"), 2.0)
        self.beat = number(spec.get("beat"), HEARTBEAT)
        self.clusters = {}  # id of a CLUSTER command -> its JSON text
        self.processes = {}  # id -> Process
        self.held_ports = {}  # port -> the socket that holds it until its task starts
        self.claims = None  # this user's claims on the host's ports, once ports are asked for (see PortClaims)
        self.netns = None  # the namespaces the agent joined for its tasks (a sealed run's network)
        self.by_pid = {}  # main pid -> Process
        self.control = []  # frames that go before any output
        self.outgoing = []  # the pieces being written to the channel
        self.turn = 0
        self.channel_open = True
        self.gone_reason = None  # "eof" or "no heartbeat": tflaunch is gone
        self.pending = bytearray()  # the start of a command line
        now = time.monotonic()
        self.last_heard = now
        self.next_heartbeat = now
        self.next_sample = now + self.sample_every
        self.next_look = now + LOOK_EVERY
        self.setup_fd = None  # the host's setup line's output, relayed as it grows (see open_setup_log)
        self.next_setup_read = now
        self.me = os.getpid()
        self.drain_until = {}  # id -> when a process's output pipe is given up on (held by a stranger)
        self.wide_pipes = 0  # processes whose output pipe holds PIPE_SIZE
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.wake_r, self.wake_w, self.write_fd):
            set_blocking(fd, False)
        widen_pipe(self.write_fd)  # the channel too, where it is a pipe (tflaunch's own host)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the wait at once
        # SIGTERM (Slurm cancelling the step, an admin) stops every task as if tflaunch were gone.
        signal.signal(signal.SIGTERM, lambda *_: self.lost("terminated"))

    # -- the channel ------------------------------------------------------------------------

    def say(self, process, text):
        """A status line of ``process``: after its output, so its exit closes its log."""
        self.enqueue(process, frame(Frame.STATUS, process.id, text.encode("utf-8", "replace")))

    def enqueue(self, process, header_and_payload):
        process.queue.append(header_and_payload)
        process.queued += len(header_and_payload[0]) + len(header_and_payload[1])

    def next_outgoing(self):
        """The pieces to write next: every control frame, else one turn of one process's frames."""
        if self.control:
            taken, self.control = self.control, []
        else:
            waiting = [p for p in self.processes.values() if p.queue]
            if not waiting:
                return []
            process = waiting[self.turn % len(waiting)]
            self.turn += 1
            taken, size = [], 0
            while process.queue and size < CHUNK:
                header, payload = process.queue.pop(0)
                taken.append((header, payload))
                size += len(header) + len(payload)
            process.queued -= size
        return [piece for header, payload in taken for piece in (header, payload) if piece]

    def flush(self):
        """Write what the channel takes now, without blocking."""
        while self.channel_open:
            if not self.outgoing:
                self.outgoing = self.next_outgoing()
                if not self.outgoing:
                    return
            left = write_pieces(self.write_fd, self.outgoing)
            if left is None:
                self.lost("eof")
                return
            if left is self.outgoing:
                return  # the channel is full
            self.outgoing = left
            self.next_heartbeat = time.monotonic() + self.beat  # any frame tells tflaunch the agent lives

    def lost(self, reason):
        self.channel_open = False
        if self.gone_reason is None:
            self.gone_reason = reason

    def read_commands(self):
        chunk = read_some(self.read_fd, 1 << 16)
        if chunk is None:
            return
        if not chunk:
            self.lost("eof")
            return
        self.pending += chunk
        if b"\n" not in chunk:  # whole lines only: a trickle of bytes that never ends one is no sign of life
            if len(self.pending) > MAX_FRAME:
                self.protocol_error(bytes(self.pending[:64]), "a command line of at most %d bytes" % MAX_FRAME)
            return
        self.last_heard = time.monotonic()
        lines = bytes(self.pending).split(b"\n")
        self.pending = bytearray(lines.pop())
        for line in lines:
            if not self.handle(line) and self.channel_open:
                self.protocol_error(line, "a command")
            if not self.channel_open:
                return

    def handle(self, line):
        """Carry out one command line; False when it is none."""
        words = line.strip().split(b" ")
        if words == [b""]:
            return True  # a heartbeat
        if len(words) < 2 or not words[1].isdigit():
            return False
        command, ident = words[0].decode("ascii", "replace"), int(words[1])
        argument = words[2] if len(words) > 2 else b""
        process = self.processes.get(ident)
        if command not in Command.ALL or len(words) > 3:
            return False
        if command == Command.PORTS:
            if not argument.isdigit():
                return False
            self.pick_ports(ident, int(argument))
        elif command == Command.CLUSTER:
            try:
                self.clusters[ident] = binascii.a2b_base64(argument).decode("utf-8")
            except (ValueError, UnicodeDecodeError):  # binascii.Error is a ValueError
                return False
        elif command == Command.START:
            if process is not None:
                return False
            try:
                fields = decode_fields(argument)
            except (ValueError, UnicodeDecodeError):
                return False
            self.start(ident, fields)
        elif command == Command.SIG and not argument.isdigit():
            return False
        elif command == Command.IN:
            try:
                data = binascii.a2b_base64(argument)
            except ValueError:  # binascii.Error
                return False
            if process is not None and process.in_fd is not None:
                process.in_pending += data
                self.write_stdin(process)
        elif process is None:
            return True  # a command for a process that has ended and gone
        elif command == Command.TERM:
            self.reap()  # a task that ended before the TERM came keeps its exit as its own
            if process.status is None:
                process.termed = True
                process.catches_term = handles(process.pid, signal.SIGTERM)
                send(process.pid, signal.SIGTERM, group=True)
        elif command == Command.KILL:
            process.hurry = True
            self.signal_tree(process, signal.SIGKILL)
        elif command == Command.SIG and process.status is None:
            send(process.pid, int(argument))
        elif command == Command.CLOSE:
            process.in_closing = True
            self.write_stdin(process)
        elif command == Command.DUMP:
            self.dump_stacks(process)
        return True

    def protocol_error(self, data, expected):
        """What came from tflaunch is not the protocol: stop everything, as if tflaunch were gone,
        and say what was read where (tflaunch shows the agent's last line when the channel ends)."""
        message = "tflaunch agent on %s: protocol error: read %s where %s was expected\n" % (
            node_name(), printable(data), expected)
        try:
            os.write(2, message.encode("utf-8", "replace"))
        except OSError:
            pass
        self.lost("protocol error")

    def pick_ports(self, ident, count):
        import socket  # here, not at the top: importing it is a third of the agent's start-up

        picked, passed = [], []  # passed: held until the end, so the kernel hands out others
        if self.claims is None:
            self.claims = PortClaims(claim_folders(os.environ))
        try:
            while len(picked) < count:
                if len(passed) > CLAIM_TRIES:
                    raise OSError(errno.EADDRINUSE, "%d free ports in a row were claimed by this user's other "
                                  "runs" % len(passed))
                sock = self.bind_free_port(socket)
                port = sock.getsockname()[1]
                if not self.claims.claim(port):  # another run's task was given it: it may not have bound it yet
                    passed.append(sock)
                    continue
                self.held_ports[port] = sock
                picked.append(port)
            answer = " ".join(str(port) for port in picked)
        except OSError as exc:
            for port in picked:
                self.held_ports.pop(port).close()
                self.claims.release(port)
            answer = "%s %s" % (Status.ERROR, exc.strerror or exc)
        for sock in passed:
            sock.close()
        self.control.append(frame(Frame.PORTS, ident, answer.encode()))

    @staticmethod
    def bind_free_port(socket):
        """A socket bound to a port the kernel picked, which no other socket can bind beside it."""
        # Without SO_REUSEADDR: the kernel hands out a port nobody holds, and a socket that set
        # SO_REUSEADDR could otherwise bind it beside this one. Dual-stack where the host has
        # IPv6, so that no IPv6-only socket can take the port either.
        try:
            sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        except OSError:
            sock = None
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                sock.bind(("::", 0))
            except OSError:
                sock.close()  # IPv6 switched off here
                sock = None
        if sock is None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("0.0.0.0", 0))
        if hasattr(socket, "SO_REUSEPORT"):  # only this user's sockets may join it
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        return sock

    # -- starting -------------------------------------------------------------------------

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
        for port in (fields.get("release") or "").split(","):
            if port.isdigit() and int(port) in self.held_ports:
                self.held_ports.pop(int(port)).close()  # the task is about to bind it
        try:
            if output:
                out_w = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
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
        the agent starts for them (stack samples). A sealed run's network (launcher/run/isolation.py)."""
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

    # -- the event loop ---------------------------------------------------------------------

    def serve(self):
        """Run until tflaunch is gone; then stop everything."""
        while self.gone_reason is None:
            self.step()
            for ident in [i for i, p in self.processes.items() if p.reported and not p.queue]:
                del self.processes[ident]
        self.stop_everything()

    def step(self, timeout=None):
        """One turn of the loop: it sleeps until something happens or a deadline comes (the next
        heartbeat or sample, tflaunch's silence running out, a task's settling), at most ``timeout``."""
        self.reap()
        self.advance()
        now = time.monotonic()
        if now >= self.next_heartbeat:
            self.control.append(frame(Frame.HEARTBEAT, 0))
            self.next_heartbeat = now + self.beat
        if self.sample_every and now >= self.next_sample:
            self.sample()
            self.next_sample = now + self.sample_every
        if now >= self.next_look:
            self.look()
            self.next_look = now + LOOK_EVERY
        if self.setup_fd is not None and now >= self.next_setup_read:
            self.relay_setup()
            self.next_setup_read = now + TICK
        self.flush()
        readers = [self.wake_r]
        if self.channel_open:
            readers.append(self.read_fd)
        readers += [p.out_fd for p in self.processes.values()
                    if p.out_fd is not None and p.queued < QUEUE_LIMIT and p.read_after <= now]
        readers += [p.exec_fd for p in self.processes.values() if p.exec_fd is not None]
        writers = [p.in_fd for p in self.processes.values() if p.in_fd is not None and p.in_pending]
        if self.channel_open and (self.outgoing or self.control or any(p.queue for p in self.processes.values())):
            writers.append(self.write_fd)
        wait = self.soonest_deadline(now)
        if timeout is not None:
            wait = min(wait, timeout)
        try:
            readable, writable = wait_for(readers, writers, wait)
        except InterruptedError:
            return
        if self.wake_r in readable:
            try:
                os.read(self.wake_r, 4096)
            except OSError:
                pass
        if self.channel_open and self.read_fd in readable:
            self.read_commands()
        for process in list(self.processes.values()):
            if process.exec_fd is not None and process.exec_fd in readable:
                self.exec_result(process)
            if process.out_fd is not None and process.out_fd in readable:
                self.relay(process)
            if process.in_fd is not None and process.in_fd in writable:
                self.write_stdin(process)
        if (self.keepalive and self.gone_reason is None and self.channel_open
                and time.monotonic() - self.last_heard > self.keepalive):
            self.gone_reason = "no heartbeat"

    def soonest_deadline(self, now):
        """Seconds until the loop has something to do that no descriptor or signal wakes it for."""
        deadlines = [self.next_heartbeat]
        if self.sample_every:
            deadlines.append(self.next_sample)
        if any(p.threads is not None for p in self.processes.values()):
            deadlines.append(self.next_look)
        if self.setup_fd is not None:
            deadlines.append(self.next_setup_read)
        if self.keepalive and self.channel_open:
            deadlines.append(self.last_heard + self.keepalive)
        deadlines += [p.stopping_at for p in self.processes.values() if p.stopping_at is not None]
        deadlines += [p.settle_until for p in self.processes.values() if p.settle_until is not None]
        deadlines += list(self.drain_until.values())
        deadlines += [p.read_after for p in self.processes.values()
                      if p.read_after > now and p.out_fd is not None and p.queued < QUEUE_LIMIT]
        # A hair past the deadline: the wait may end a little early, and then nothing would be due yet.
        return max(0.0, min(deadlines) - now) + 0.001

    def relay(self, process):
        """Read what the process's output pipe holds, a frame per CHUNK, while less than
        QUEUE_LIMIT of it waits to be sent."""
        while process.queued < QUEUE_LIMIT:
            data = read_some(process.out_fd, CHUNK)
            if data is None:
                break
            if not data:
                os.close(process.out_fd)
                process.out_fd = None
                self.narrowed(process)
                return
            self.enqueue(process, frame(Frame.OUTPUT, process.id, data))
            if len(data) < CHUNK:
                break  # all it held
        if process.wide:
            process.read_after = time.monotonic() + OUTPUT_TICK

    def narrowed(self, process):
        """Its output pipe is gone (or about to be): another process may have a wide one."""
        if process.wide:
            process.wide = False
            self.wide_pipes -= 1

    def relay_setup(self):
        """What the setup line (or a job it left running) wrote since the last look: a regular
        file, so it is read on a timer rather than waited on."""
        try:
            data = os.read(self.setup_fd, CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            os.close(self.setup_fd)
            self.setup_fd = None
            return
        if data:
            self.control.append(frame(Frame.SETUP, 0, data))

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

    def signal_tree(self, process, signum):
        if process.pid is not None and process.status is None:
            send(process.pid, signum, group=True)
        for pid in self.tree_of(process):
            send(pid, signum)

    def sample(self):
        lines = []
        for process in self.processes.values():
            if process.status is None and process.pid is not None and process.fields.get("kind") != "helper":
                tree = process.tree = [process.pid] + descendants(process.pid)
                rss, cpu = usage(tree)
                line = "%d %d %.3f %d" % (process.id, rss, cpu, len(tree))
                if process.threads is not None and process.threads.looks:
                    line += " " + process.threads.totals()
                lines.append(line)
        if lines:
            self.control.append(frame(Frame.READINGS, 0, "\n".join(lines).encode()))

    def look(self):
        """A look at the threads of every watched task that runs (see :class:`ThreadWatch`)."""
        for process in self.processes.values():
            if process.threads is not None and process.status is None and process.pid is not None:
                process.threads.look(process.tree or [process.pid])

    # -- stopping everything ----------------------------------------------------------------

    def stop_everything(self):
        """tflaunch is gone: SIGTERM to every process and its tree, ``eof_grace``, then SIGKILL."""
        self.control = []
        for process in self.processes.values():
            if process.pid is not None and process.status is None:
                send(process.pid, signal.SIGTERM, group=True)
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
                if process.pid is not None and process.status is None:
                    send(process.pid, signal.SIGKILL, group=True)
            self.reap()
            if not left:
                break
            time.sleep(0.05)
        self.reap()


# What poll reports of a descriptor that makes it worth reading (or writing): data or room, and also
# its end or an error, which the read (or write) then finds.
READ_EVENTS = select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR | select.POLLNVAL
WRITE_EVENTS = select.POLLOUT | select.POLLHUP | select.POLLERR | select.POLLNVAL


def wait_for(readers, writers, timeout):
    """The descriptors of ``readers`` ready to read and of ``writers`` ready to write, once any is or
    ``timeout`` seconds have passed: poll, not select, whose descriptors must be under 1024 (a host
    of a thousand tasks under a raised ``ulimit -n`` has more)."""
    poller = select.poll()
    wanted = {}
    for fd in readers:
        wanted[fd] = wanted.get(fd, 0) | select.POLLIN
    for fd in writers:
        wanted[fd] = wanted.get(fd, 0) | select.POLLOUT
    for fd, mask in wanted.items():
        poller.register(fd, mask)
    readable, writable = set(), set()
    for fd, events in poller.poll(timeout * 1000):
        if events & READ_EVENTS and wanted[fd] & select.POLLIN:
            readable.add(fd)
        if events & WRITE_EVENTS and wanted[fd] & select.POLLOUT:
            writable.add(fd)
    return readable, writable


def widen_pipe(fd):
    """Whether the pipe now holds PIPE_SIZE (Linux; a user over the pipe memory limit gets no more)."""
    import fcntl

    try:
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_SIZE)
    except OSError:
        return False
    return True


def set_blocking(fd, blocking):
    import fcntl

    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK if blocking else flags | os.O_NONBLOCK)


def which(program):
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        path = os.path.join(folder, program)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def node_name():
    return os.environ.get("SLURMD_NODENAME") or os.uname()[1]


def open_channel(spec):
    """(read fd, write fd): stdin and stdout, or a connection back to tflaunch (Slurm).

    ``connect`` is ``HOST PORT``; a HOST of ``-`` is the address srun was started from. The token
    tflaunch handed the step on its stdin (read_token) is proven, never sent (see :func:`connect_back`)."""
    target = spec.get("connect")
    if not target:
        return 0, 1
    host, port = target.split(" ")
    if host == "-":
        host = os.environ.get("SLURM_LAUNCH_NODE_IPADDR", "127.0.0.1")
    token = read_token()
    fd = connect_back(host, int(port), token.encode(), node_name().encode(),
                      number(spec.get("connect_within"), CONNECT_WITHIN))
    return fd, fd


def connect_back(host, port, token, name, within):
    """A descriptor connected to a listener at ``host:port`` that proved it holds ``token``, after
    this agent proved it too; tries again, pausing longer each time, for ``within`` seconds.

    Whoever answers there is a stranger until its proof checks out: a listener that closed may have
    left its port to anyone, and an agent obeys nothing before the proof. OSError when no listener
    proved itself in time, or at once when nothing listens there (tflaunch's listener never reopens
    a port it closed)."""
    import socket

    deadline = time.monotonic() + within
    pause, longest = CONNECT_BACKOFF
    while True:
        left = deadline - time.monotonic()
        try:
            connection = socket.create_connection((host, port), timeout=max(0.01, min(left, 10.0)))
        except ConnectionRefusedError:
            raise OSError(errno.ECONNREFUSED, "nothing listens there any more")
        except OSError as exc:
            why = exc
        else:
            try:
                if prove_both_ends(connection, token, name, deadline):
                    fd = os.dup(connection.fileno())
                    connection.close()
                    return fd
                why = "the peer did not prove that it holds the run's token"
            except OSError as exc:
                why = exc
            connection.close()
        left = deadline - time.monotonic()
        if left <= 0:
            raise OSError(errno.ETIMEDOUT, "no listener proved itself within %g s (last: %s)" % (within, why))
        time.sleep(min(pause, left))
        pause = min(pause * 2, longest)


def prove_both_ends(connection, token, name, deadline):
    """The handshake on ``connection`` (see ``HELLO_MARK``): True once the listener proved that it
    holds ``token`` and welcomed this agent's proof; False when its answer is no proof."""
    import hmac

    mine = new_nonce()
    connection.settimeout(max(0.01, deadline - time.monotonic()))
    connection.sendall(hello_line(name, mine))
    answer = b""
    while not answer.endswith(b"\n"):
        connection.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = connection.recv(HELLO_LIMIT - len(answer))
        if not chunk or len(answer) + len(chunk) >= HELLO_LIMIT:
            return False
        answer += chunk
        if b"\n" in answer[:-1]:
            return False  # a real listener says one line, then waits for the agent's proof
    parts = answer[:-1].split(b" ")
    if len(parts) != 2 or not is_nonce(parts[0]):
        return False
    theirs, proof = parts
    if not hmac.compare_digest(proof, handshake_proof(token, b"listener", name, mine, theirs)):
        return False
    connection.sendall(handshake_proof(token, b"agent", name, mine, theirs) + b"\n")
    welcome = b""
    while len(welcome) < len(WELCOME):  # exactly that much: the commands that follow are the agent's to read
        connection.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = connection.recv(len(WELCOME) - len(welcome))
        if not chunk:
            raise OSError(errno.ECONNRESET, "the listener let the connection go before it was in")
        welcome += chunk
    if welcome != WELCOME:
        return False
    connection.settimeout(None)
    return True


def read_token():
    """The line srun copied to this agent's stdin (``--input=all``), which then reads as /dev/null
    again: the token is in no environment, where ``/proc/<pid>/environ`` would keep it for the
    agent's whole life, and on no command line."""
    data = b""
    while not data.endswith(b"\n") and len(data) < TOKEN_BYTES:
        try:
            chunk = os.read(0, TOKEN_BYTES - len(data))
        except OSError:
            break
        if not chunk:
            break
        data += chunk
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return data.strip().decode("ascii", "replace")


def open_setup_log(spec):
    """The descriptor the remote shell opened on the setup line's output (``setup_log``), if any:
    kept from the tasks, and read as it grows."""
    value = spec.get("setup_log") or ""
    if not value.isdigit():
        return None
    try:
        os.set_inheritable(int(value), False)
    except OSError:
        return None  # the shell could not open it
    return int(value)


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


def main():
    spec = decode_fields(sys.argv[1])
    # The agent must outlive a SIGINT/SIGHUP aimed at its session so it can clean up. A no-op
    # handler, not SIG_IGN: ignored signals would stay ignored in the tasks after exec.
    signal.signal(signal.SIGINT, lambda *_: None)
    signal.signal(signal.SIGHUP, lambda *_: None)
    become_subreaper()
    try:
        read_fd, write_fd = open_channel(spec)
    except OSError as exc:
        sys.stderr.write("tflaunch agent: cannot reach tflaunch at %s: %s\n" % (spec.get("connect"), exc))
        os._exit(2)
    agent = Agent(spec, read_fd, write_fd, own_session=lead_session())
    agent.setup_fd = open_setup_log(spec)
    agent.outgoing = [SYNC]
    agent.serve()
    os._exit(0)


if __name__ == "__main__":
    main()
