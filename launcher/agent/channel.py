"""The agent's channel to tflaunch and the descriptors it waits on: stdin and stdout, or a TCP
connection it opens back to tflaunch (Slurm) after both ends proved that they hold the run's
token (see ``HELLO_MARK`` in :mod:`.protocol`); the setup line's output file; and the
non-blocking reads, writes and waits the loop does on them and on its tasks' pipes.
"""

import errno
import os
import select
import stat
import time

from .protocol import (CONNECT_BACKOFF, CONNECT_WITHIN, LOST_RUN, HELLO_LIMIT, TOKEN_BYTES, WELCOME, handshake_proof,
                       hello_line, is_nonce, new_nonce, node_name, number)

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

IOV_MAX = 1024  # the most pieces one writev takes (Linux)
CHUNK_LINE = 1 << 16  # a line echoed without its end once this long


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


def open_channel(spec):
    """(read fd, write fd): stdin and stdout, or a connection back to tflaunch (Slurm).

    ``connect`` is ``HOST PORT``; a HOST of ``-`` is the address srun was started from. The token
    tflaunch handed the step on its stdin (read_token) is proven, never sent (see :func:`connect_back`).
    ``join``: a joining node's rank, its name in the hello."""
    target = spec.get("connect")
    if not target:
        return 0, 1
    host, port = target.rsplit(" ", 1)
    if host == "-":
        host = os.environ.get("SLURM_LAUNCH_NODE_IPADDR", "127.0.0.1")
    token = read_token()
    name = spec.get("join") or node_name()
    fd = connect_back(host, int(port), token.encode(), name.encode(),
                      number(spec.get("connect_within"), CONNECT_WITHIN), early=bool(spec.get("join")))
    return fd, fd


def connect_back(host, port, token, name, within, early=False):
    """A descriptor connected to a listener at ``host:port`` that proved it holds ``token``, after
    this agent proved it too; tries again, pausing longer each time, for ``within`` seconds.

    Whoever answers there is a stranger until its proof checks out: a listener that closed may have
    left its port to anyone, and an agent obeys nothing before the proof. OSError when no listener
    proved itself in time, or at once when nothing listens there unless ``early`` (a joining node
    may come first; tflaunch's listener never reopens a port it closed)."""
    import socket

    deadline = time.monotonic() + within
    pause, longest = CONNECT_BACKOFF
    while True:
        left = deadline - time.monotonic()
        try:
            connection = socket.create_connection((host, port), timeout=max(0.01, min(left, 10.0)))
        except ConnectionRefusedError as exc:
            if not early:
                raise OSError(errno.ECONNREFUSED, "nothing listens there any more")
            why = exc
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


def echo_lines(fd, name, rest, data):
    """Write the whole lines of ``rest`` + ``data`` to ``fd`` as ``name | line``; the rest is returned."""
    text = rest + data
    cut = text.rfind(b"\n") + 1
    if not cut and len(text) < CHUNK_LINE:
        return text
    whole, rest = (text[:cut], text[cut:]) if cut else (text + b"\n", b"")
    prefix = name.encode("utf-8", "replace") + b" | "
    try:
        os.write(fd, b"".join(prefix + line + b"\n" for line in whole.splitlines()))
    except OSError:
        pass  # a closed terminal: the owner has the lines anyway
    return rest


def own_stderr():
    """A descriptor of this process's stderr, non-blocking without making it so for whoever else
    writes there (a terminal, a pipe): opened anew. A regular file never blocks: fd 2 itself."""
    try:
        if stat.S_ISREG(os.fstat(2).st_mode):
            return 2
        return os.open("/proc/self/fd/2", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:  # a socket cannot be opened anew
        fd = os.dup(2)
        set_blocking(fd, False)
        return fd


def node_end_line(spec, code):
    """The line a node that joined a run (``join``) ends with, for the run's exit code ``code``."""
    rank = spec.get("join")
    if code == LOST_RUN:
        return ("tflaunch: node rank %s: the run's owner (node rank 0) went away; this node's tasks were "
                "stopped\n" % rank)
    if code == 2 and spec.get("connect"):
        return ("tflaunch: node rank %s: no owner at %s proved itself within --rdzv-timeout %g s\n"
                % (rank, ":".join(spec["connect"].rsplit(" ", 1)), number(spec.get("connect_within"), CONNECT_WITHIN)))
    return "tflaunch: node rank %s: the run ended with exit code %d\n" % (rank, code)
