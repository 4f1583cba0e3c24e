"""The protocol between tflaunch and a host agent: every fact of it is defined here, once, and both
ends take it from here (tflaunch imports this module, and no other module of the agent's but
:mod:`.sampling`). Whatever breaks the protocol in either direction (an unknown kind or verb, a
frame or command line over ``MAX_FRAME``, bytes that are no frame) ends the channel at once with
one line saying what was read.

**Commands** (tflaunch to agent) are lines (``Command``); every whole line, an empty one too,
counts as a heartbeat, and tflaunch sends an empty one only after ``beat`` seconds without another:

- ``CLUSTER <id> <base64>``: the JSON text of a TensorFlow cluster, sent once per host however
  many of its tasks see it (TF_CONFIG lists every task: one copy per task would make a run's
  traffic grow with the square of its size);
- ``START <id> <spec>``: start a process (a task, or a helper such as a probe); its spec gives
  ``argv``, ``env``, ``cwd``, ``grace``, ``name``, ``output`` (a log file the process writes
  to directly; empty: its output is relayed over the channel), ``stdin`` (``pipe`` or ``null``)
  ``tf_config`` (``<cluster id> <role> <index>``: the agent sets TF_CONFIG from that cluster),
  ``watch`` (seconds between looks at its threads, for tflaunch's straggler rule: :mod:`.threads`)
  and ``gpus`` (its GPUs, ``0,1``: read for that rule where NVML is present);
- ``IN <id> <base64>`` and ``CLOSE <id>``: bytes for a helper's stdin, and its EOF;
- ``PORTS <id> <n>``: pick n free TCP ports on this host and hold them (see :mod:`.ports`); a task
  whose ``release`` field names one gets it freed just before it starts;
- ``TERM <id>`` (SIGTERM to the task's process group), ``KILL <id>`` (SIGKILL to its whole tree),
  ``DUMP <id>`` (its Python stacks, by py-spy).

EOF on the channel, or no heartbeat for ``keepalive`` seconds, means tflaunch is gone: every process
is stopped (SIGTERM, ``eof_grace``, SIGKILL) and the agent exits.

**Frames** (agent to tflaunch, ``Frame``) follow the ``SYNC`` mark (what a login shell printed
comes before it), each ``HEADER``: ``kind (1 byte), id (4), length (4)``, then at most ``MAX_FRAME``
bytes of payload: ``H`` heartbeat, ``P`` the ports picked for ``PORTS <id>``
(space-separated; empty with ``error <reason>`` when they could not be had), ``O`` output of process ``id``,
``S`` a status line of process ``id`` (``Status``: ``started <pid>``, ``error <reason>``, ``leftover
<pid> <name>``, ``exit code=<n>`` or ``exit signal=<n>``, always last, with `` termed`` when
tflaunch's ``TERM`` is what ended the process), ``D`` a stack dump, ``R``
resource samples of each task's tree (see :mod:`.sampling`), ``L`` what
the host's setup line printed. ``H``, ``R`` and ``L`` carry id 0; the others an id tflaunch gave
in a command. A heartbeat goes out only after ``beat`` seconds without another frame.

The agent's own argument, the command fields and the connect-back handshake (:mod:`.channel`)
are defined here too.
"""

import binascii
import os
import struct

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
# whose default (launcher.options.GRACE) is this number.
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
LOST_RUN = 255  # a joined node's exit code when the run's owner went without saying the run's

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
    DUMP = "DUMP"
    END = "END"  # the run's exit code, for a node that joined it to exit with (id 0)
    ALL = (START, CLUSTER, IN, CLOSE, PORTS, TERM, KILL, DUMP, END)


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


# -- bytes on a non-blocking descriptor, each end's own way of moving a frame or a command ----------

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


def node_name():
    """This host's name, as the agent gives it in a hello and in its messages: Slurm's, else uname's."""
    return os.environ.get("SLURMD_NODENAME") or os.uname()[1]
