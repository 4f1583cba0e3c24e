"""The agent's event loop and its entry point. :class:`Agent` reads tflaunch's commands, starts
and ends processes (:mod:`.starting`, :mod:`.ending`), relays their output and statuses, sends
heartbeats and resource readings (:mod:`.sampling`), and stops everything when tflaunch is gone.

tflaunch runs the agent as ``python -I -S -c <source> <spec>`` (the modules bundled into one
source, see :mod:`launcher.transports.shipping`): on this machine as its child, on another host
through one ssh connection, on a Slurm node as the one task of a job step. Its channel to tflaunch
is one byte stream each way: stdin and stdout, or (``connect`` in the spec) a TCP connection it
opens back to tflaunch (:mod:`.channel`). The spec (``sys.argv[1]``) is base64 of NUL-separated
``key, value`` pairs (see :func:`.protocol.decode_fields`): ``keepalive`` (seconds without a word
from tflaunch before everything is stopped; empty: never), ``eof_grace`` (TERM to KILL when
tflaunch is gone), ``sample`` (seconds between resource samples), ``beat`` (seconds between
heartbeats, each way: ``HEARTBEAT`` unless tflaunch spaces them out for a large run, see
:func:`.protocol.beat_for`), optionally ``connect`` (``host port``), ``connect_within`` (seconds
to keep trying it, ``CONNECT_WITHIN`` unless given) and ``setup_log`` (a descriptor open on the
file the host's ``setup`` line writes to: the agent relays what it and any job it left behind
print, so that nothing but the agent writes to the channel).

Status frames of one process follow its output; the writer takes turns between processes, so one
that floods its output cannot delay another's status, and heartbeats go first of all. A process's
output pipe is not read while much of its output waits to be sent, so a slow channel slows that
process, never loses bytes.
"""

import binascii
import os
import sys
import time

try:  # the C module: the signal wrapper imports enum, which costs start-up time
    import _signal as signal
except ImportError:
    import signal

from .channel import (OUTPUT_TICK, echo_lines, node_end_line, open_channel, open_setup_log, own_stderr, set_blocking,
                      wait_for, widen_pipe, write_pieces)
from .ending import EndingProcesses
from .ports import HeldPorts
from .protocol import (EOF_GRACE, HEARTBEAT, LOST_RUN, MAX_FRAME, SAMPLE, SYNC, Command, Frame, decode_fields, frame,
                       node_name, number, printable, read_some)
from .sampling import LOOK_EVERY, look_gap, readings, until_sample
from .starting import StartingProcesses
from .trees import become_subreaper, handles, lead_session

TICK = 0.25  # how often the setup line's output file is looked at (a regular file cannot be waited on)
CHUNK = 1 << 16  # one output frame at most, and what the writer sends of one process per turn
QUEUE_LIMIT = 1 << 20  # output bytes of one process waiting to be sent before its pipe is left unread


class Agent(StartingProcesses, EndingProcesses):
    """One host's agent: its state, the channel's both directions, and the loop that serves them."""

    def __init__(self, spec, read_fd, write_fd, own_session=False):
        self.spec = spec
        self.end_code = None  # the run's exit code, when tflaunch said it (END)
        self.echo = {} if spec.get("echo") else None  # process id -> its output's unfinished line
        # Non-blocking, on a description of its own: what the terminal cannot take now is dropped.
        self.echo_fd = own_stderr() if self.echo is not None else None
        # Whether the agent leads a session of its own (see lead_session): each task then starts in
        # a process group of its own within it, else in a session of its own.
        self.own_session = own_session
        self.read_fd, self.write_fd = read_fd, write_fd
        self.keepalive = number(spec.get("keepalive"))
        self.eof_grace = number(spec.get("eof_grace"), EOF_GRACE)
        self.sample_every = number(spec.get("sample"), SAMPLE)
        self.beat = number(spec.get("beat"), HEARTBEAT)
        self.clusters = {}  # id of a CLUSTER command -> its JSON text
        self.processes = {}  # id -> Process
        self.ports = HeldPorts()  # what PORTS commands picked: held for their tasks, claimed
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
        self.next_sample = now + (until_sample(self.sample_every, time.time()) if self.sample_every else 0.0)
        self.next_look = now + look_gap()
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
            self.control.append(frame(Frame.PORTS, ident, self.ports.pick(int(argument)).encode()))
        elif command == Command.END:
            if not argument.isdigit() or int(argument) > 255:
                return False
            self.end_code = int(argument)
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
                self.signal_group(process, signal.SIGTERM)
        elif command == Command.KILL:
            process.hurry = True
            self.signal_tree(process, signal.SIGKILL)
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
            self.next_sample = now + until_sample(self.sample_every, time.time(), sampled=True)
        if now >= self.next_look:
            self.next_look = now + look_gap(self.look())
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
            if self.echo is not None and process.fields.get("kind") != "helper":  # a joined node's own console
                rest = self.echo.pop(process.id, b"")
                if data or rest:
                    self.echo[process.id] = echo_lines(self.echo_fd, process.name, rest, data or b"\n")
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

    def sample(self):
        """Each living task's reading, in one frame ahead of any output (see :mod:`.sampling`)."""
        payload = readings(self.processes.values())
        if payload:
            self.control.append(frame(Frame.READINGS, 0, payload))

    def look(self):
        """A look at the threads of every watched task that runs (see :class:`.threads.ThreadWatch`);
        returns the seconds until the next, on average: the shortest its tasks asked for."""
        every = None
        for process in self.processes.values():
            if process.threads is not None and process.status is None and process.pid is not None:
                process.threads.look(process.tree or [process.pid])
                every = min(every or process.look_every, process.look_every)
        return every or LOOK_EVERY


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
        sys.stderr.write(node_end_line(spec, 2) if spec.get("join") else
                         "tflaunch agent: cannot reach tflaunch at %s: %s\n" % (spec.get("connect"), exc))
        os._exit(2)
    agent = Agent(spec, read_fd, write_fd, own_session=lead_session())
    agent.setup_fd = open_setup_log(spec)
    agent.outgoing = [SYNC]
    agent.serve()
    # A node that joined a run exits with the run's code; the owner gone without one is a lost run.
    code = agent.end_code if agent.end_code is not None else LOST_RUN if spec.get("join") else 0
    if spec.get("join"):
        os.write(2, node_end_line(spec, code).encode())
    os._exit(code)


if __name__ == "__main__":
    main()

