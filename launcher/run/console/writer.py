"""tflaunch's terminal: task lines for people, tflaunch's own messages, and a live status line.

Everything written goes through one writer thread fed by a queue, so the console can never slow
or stop the run: the output pump and the supervisor only append to the queue. When the queue
holds more than ``max_queued`` bytes of task output (a stalled terminal, a slow pipe, a flood of
short lines; each line counts as ``LINE_COST`` bytes more, for the writer's work per line), further
task lines are left out of the console, counted and announced once it catches up; the logs
keep them all. Metric lines are kept beyond that, as far as twice ``max_queued`` (as their records,
without their text; a record counts ``FIGURE_COST`` bytes more per figure); past it they are left
out too, so what waits for a stalled terminal is bounded whatever the tasks print. When the stream
is closed (``tflaunch ... | head -1``), console output is dropped and the run goes on to its end
and its own exit code.

What a task line becomes on the console (the files are untouched by any of this):

- a metric line (see :mod:`launcher.records.metrics`: a ``TFLAUNCH_METRIC`` line, or the line that
  ends a Keras epoch of a task that prints none), which arrives already parsed by the output
  pump, is rendered for people (:mod:`.metricview`), lock-step duplicates once;
- TensorFlow's routine C++ start-up chatter is hidden (:class:`.chatter.Chatter`);
- once a task's failure stops the cluster, the other tasks' lines are counted, not shown: one
  line per task says how many (:mod:`.stopfold`);
- the same line from several tasks within half a second prints once under all their names,
  ``worker-[0-15] | ...`` (:mod:`.twins`);
- with ``verbose`` every line is shown as the task wrote it, under its own task's name.

On a terminal a status line (elapsed time, epoch, each task's state, restarts) stays under the
scrolling output; it is never written to a pipe or a file. Colour only on a terminal, and never
when ``NO_COLOR`` is set. Written to a regular file, the task lines keep their start and end
within ``file_limit`` (:class:`.terminal.FileBound`); tflaunch's messages are all written.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
from typing import IO, Iterable, Mapping

import click

from ...records.folder import MERGED
from ...records.metrics import MetricLines
from ...records.states import TaskState, plural
from .metricview import Line, MetricBoard
from .chatter import Chatter, may_hold_chatter, starts_error
from .stopfold import StopFold
from .terminal import Sink, terminal_width, wants_colour
from .twins import TwinFolder, names_text

_COLOURS = ("cyan", "yellow", "green", "magenta", "blue", "red",
            "bright_cyan", "bright_yellow", "bright_green", "bright_magenta", "bright_blue", "bright_red")
_ERASE = "\r\x1b[K"
STATUS_MIN_WIDTH = 20  # columns a terminal needs for the status line to be drawn at all
# What a line costs the writer besides its bytes (folding it with its twins, labelling it), in bytes
# of queue: so a flood of short lines is cut off at a backlog the writer clears in a second or so,
# and tflaunch's own messages behind it still print before close() gives up on the console.
LINE_COST = 64
FIGURE_COST = 100  # what one figure of a parsed record takes in memory, about, in bytes of queue
# close() gives the writer its timeout; this long before its end, task lines still waiting are
# counted, not drawn, so tflaunch's own messages behind a flood print in time on a loaded machine.
HURRY_SLACK = 1.5
WRITE_CHUNK = 1 << 20  # bytes of drawn text the writer holds before it writes them out


class Console:
    """tflaunch's terminal: task lines with a name prefix, its own messages, a status line on a TTY."""

    def __init__(self, stream: IO[str] | None = None, *, messages: IO[str] | None = None,
                 colour: bool | None = None, tasks: Iterable[str] | None = None, quiet: bool = False,
                 verbose: bool = False, status: bool | None = None, max_queued: int = 16 << 20,
                 refresh: float = 1.0, clock=time.monotonic, file_limit: int | None = None):
        self.stream = stream if stream is not None else sys.stdout
        self.messages = messages if messages is not None else sys.stderr
        self.colour = wants_colour(self.stream) if colour is None else colour
        self.message_colour = wants_colour(self.messages) if colour is None else colour
        self.only = set(tasks) if tasks else None
        self.quiet = quiet
        self.verbose = verbose
        self.width = 8
        self.max_queued = max_queued
        self.refresh = refresh
        self.clock = clock
        self.started = clock()
        self.hidden_lines = 0  # TensorFlow chatter kept off the console
        self.dropped_lines = 0  # task lines left out because the console fell behind
        self._colour_of: dict[str, str] = {}
        self._rank: dict[str, int] = {}  # the order tasks were registered in: folded names follow it
        self._twins = TwinFolder()  # only the writer thread touches it
        self._out = Sink(self.stream, file_limit)  # a file keeps its task lines' start and end (terminal.py)
        # Messages always reach a file: a sink of their own, outside the task lines' limit.
        self._err = self._out if self.messages is self.stream and not self._out.bound else Sink(self.messages)
        term = os.environ.get("TERM", "")
        self.status = (self._out.tty and term not in ("", "dumb")) if status is None else status
        self._board = MetricBoard(shown_tasks=set() if quiet else self.only)
        self._chatter = Chatter()
        self._stop = StopFold()  # only the writer thread touches it
        self._states: dict[str, str] = {}
        self._attempt = 1
        self._note: str | None = None  # see note_status
        self._status_shown = ""
        self._queue: collections.deque[tuple] = collections.deque()
        self._queued = 0
        self._hurry_at: float | None = None  # see close()
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None

    # -- called from any thread: cheap, never blocks on the terminal ------------------------------

    def register(self, names: Iterable[str]) -> None:
        for name in names:
            self._colour_of.setdefault(name, _COLOURS[len(self._colour_of) % len(_COLOURS)])
            self._rank.setdefault(name, len(self._rank))
            self.width = max(self.width, len(name))
            self._board.register([name])

    def shows(self, name: str) -> bool:
        return not self.quiet and (self.only is None or name in self.only)

    def task_block(self, name: str, block: bytes, attempt: int = 1, metrics: MetricLines = ()) -> None:
        """Queue a block of complete lines (each ending in ``\\n``) that a task wrote.

        ``metrics`` holds ``(index of the line in the block, its record)`` for each metric line
        of the block, in order (None for a malformed one: shown as the line it is); see
        :func:`launcher.records.metrics.metric_lines`.
        """
        if not block:
            return
        shown = self.shows(name)
        if not shown and not metrics:
            return
        lines = block.count(b"\n")
        if metrics and not self.verbose:  # a parsed metric line is shown from its record: its text need not wait
            split = block.split(b"\n")
            for index, record in metrics:
                if record is not None:
                    split[index] = b""
            block = b"\n".join(split)
        with self._cond:
            if self._queued > 2 * self.max_queued:  # even metric lines wait no more
                metrics = []
                if not shown:
                    return
            if shown and self._queued > self.max_queued:
                # Said where it happened: a message queued after these lines prints after the note.
                last = self._queue[-1] if self._queue else None
                if last is not None and last[0] == "dropped":
                    last[1] += lines
                else:
                    self._queue.append(["dropped", lines])
                    self._wake()
                if not metrics:
                    return
                # The lines are dropped, but the status line still learns the epoch from them.
                split = block.split(b"\n")
                block, shown = b"".join(split[index] + b"\n" for index, _ in metrics), False
                metrics, lines = [(n, record) for n, (_, record) in enumerate(metrics)], len(metrics)
            self._queue.append(("task", name, attempt, block, shown, list(metrics)))
            self._queued += len(block) + LINE_COST * lines + FIGURE_COST * sum(len(r or ()) for _, r in metrics)
            self._wake()

    def message(self, text: str) -> None:
        """One of tflaunch's own messages; shown even with --quiet."""
        self._put(("message", text))

    def stop_began(self, attempt: int, root: str, text: str) -> None:
        """``root`` failed and the cluster is being stopped, as ``text`` (one of tflaunch's messages)
        says: the other tasks' lines of ``attempt`` are counted from now on, and shown as one line
        per task before the next message (:mod:`.stopfold`)."""
        self._put(("stop", attempt, root, text))

    def note_status(self, words: str | None) -> None:
        """A few words the status line shows after the states until told otherwise (None: nothing),
        such as the stragglers still going."""
        self._put(("note", words))

    def task_states(self, states: Mapping[str, TaskState], attempt: int) -> None:
        """The tasks' states changed (``{"worker-0": TaskState.RUNNING, ...}``) in ``attempt``: redraw the status line."""
        self._put(("states", dict(states), attempt))

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued and erase the status line; give up after ``timeout`` on a stalled terminal.
        Task lines still waiting :data:`HURRY_SLACK` before then are counted as left out, not drawn,
        so tflaunch's own messages behind a backlog print in time."""
        with self._cond:
            already, self._stopping = self._stopping, True
            if self._thread is None or already:
                return
            self._queue.append(("release",))
            self._hurry_at = time.monotonic() + max(0.0, timeout - HURRY_SLACK)
            self._cond.notify()
        self._thread.join(timeout)

    def _put(self, item: tuple) -> None:
        with self._cond:
            if not self._stopping:
                self._queue.append(item)
                self._wake()
                return
        # After close(): no writer thread any more, so write it here (a last message, say). While
        # a writer stuck on a stalled terminal is still alive, writing here would block: drop it.
        if self._thread is None or not self._thread.is_alive():
            self._write(self._render(item), final=True)

    def _wake(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tflaunch-console", daemon=True)
            self._thread.start()
        self._cond.notify()

    # -- the writer thread -------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._queue and not self._stopping:
                    self._cond.wait(self._wait_time())
                items = list(self._queue)
                self._queue.clear()
                self._queued = 0
                stopping = self._stopping
            pieces = []
            held = 0  # the length of the text in pieces, kept as they come rather than summed per item
            skipped = 0
            for item in items:
                added = len(pieces)
                hurrying = self._hurry_at is not None and time.monotonic() >= self._hurry_at
                if item[0] == "task" and hurrying:
                    skipped += item[3].count(b"\n") if item[4] else 0
                    continue
                if hurrying and self._twins:  # lines still waiting for twins are left out too
                    skipped += sum(len(tasks) for tasks, _ in self._twins.flush())
                if skipped:
                    pieces += self._render(["dropped", skipped])
                    skipped = 0
                pieces += self._render(item)
                if len(self._twins) > self._twins.max_waiting:  # a flood: the oldest lines print early
                    pieces.append((self._out, self._twin_text(self._twins.due(time.monotonic()))))
                held += sum(len(text) for _, text in pieces[added:])
                if held >= WRITE_CHUNK:
                    # Out as they come: what a backlog's drawing holds is written before the next
                    # item, so that whatever follows it waits for no more than one item's text.
                    self._write(pieces, final=False)
                    pieces, held = [], 0
            if skipped:
                pieces += self._render(["dropped", skipped])
            if self._twins:
                pieces.append((self._out, self._twin_text(self._twins.due(time.monotonic()))))
            self._write(pieces, final=stopping)
            if stopping:
                self._out.finish()
                return

    def _wait_time(self) -> float | None:
        """Until the status line is due for a redraw or a waiting line must print, whichever is first."""
        due = self._twins.next_due()
        if due is None:
            return self.refresh if self.status else None
        wait = max(0.0, due - time.monotonic())
        return min(wait, self.refresh) if self.status else wait

    def _render(self, item: tuple) -> list[tuple[Sink, str | bytes]]:
        kind = item[0]
        if kind == "task":
            return [(self._out, self._task_text(*item[1:]))]
        if kind in ("message", "dropped"):
            if kind == "dropped":
                self.dropped_lines += item[1]
                text = f"the console fell behind: {item[1]:,} task lines not shown here ({MERGED} has them all)"
            else:
                text = item[1]
            # Task lines still waiting for twins came first: they print before the message.
            folded = self._lines_text(self._stop.due())
            return [(self._out, folded), (self._out, self._twin_text(self._twins.flush())),
                    (self._err, self._message_text(text))]
        if kind == "stop":
            attempt, root, text = item[1:]
            self._stop.began(attempt, root)
            # The failure's errors reach the other tasks a moment before tflaunch sees it fail: their
            # lines still waiting for twins (the last half second's) fold too, from their first error on.
            taken = self._twins.withdraw(lambda task: self._stop.folds(task, attempt), starts_error)
            for task, lines in taken.items():
                self._stop.count(task, lines)
            return [(self._out, self._twin_text(self._twins.flush())), (self._err, self._message_text(text))]
        if kind == "note":
            self._note = item[1]
            return []
        if kind == "states":
            self._states, self._attempt = item[1], item[2]
            ended = [name for name, state in self._states.items() if TaskState(state).ended]
            return [(self._out, self._lines_text(self._board.release(ended)))]
        text = self._lines_text(self._board.release_all() + self._stop.due())
        return [(self._out, self._twin_text(self._twins.flush()) + text.encode())]

    def _write(self, pieces: list[tuple[Sink, str | bytes]], final: bool) -> None:
        pieces = [(sink, text) for sink, text in pieces if text and not sink.closed]
        status = "" if final or not self.status or self._out.closed else self._status_text()
        if not pieces and status == self._status_shown:
            return
        if self._status_shown:
            self._out.write(_ERASE.encode())
        # Consecutive pieces for one stream go out in one write, as UTF-8 bytes.
        run_sink, run = None, []
        for sink, text in pieces:
            if sink is not run_sink and run:
                run_sink.write(b"".join(run))
                run = []
            run_sink = sink
            run.append(text if isinstance(text, bytes) else text.encode("utf-8", "replace"))
        if run:
            run_sink.write(b"".join(run))
        if status:
            self._out.write(status.encode("utf-8", "replace"))
        self._status_shown = status

    # -- text --------------------------------------------------------------------------------------

    def _label(self, name: str, group: bool = False) -> str:
        label = name.ljust(self.width)
        if self.colour:  # several tasks' line: bold, in no task's colour
            label = click.style(label, bold=True) if group else click.style(label, fg=self._colour_of.get(name, "white"))
        return f"{label} | "

    def _message_text(self, text: str) -> str:
        prefix = click.style("tflaunch:", bold=True) if self.message_colour else "tflaunch:"
        return "".join(f"{prefix} {line}\n" for line in text.splitlines() or [""])

    def _folding(self) -> bool:
        return not self.verbose and len(self._rank) > 1 and (self.only is None or len(self.only) > 1)

    def _lines_text(self, lines: list[Line]) -> str:
        """Lines of tasks: shown now, or handed to the twin folder (which shows them later)."""
        if self._folding():
            now = time.monotonic()
            for task, text in lines:
                self._twins.add(task, text.encode("utf-8", "replace"), now)
            return ""
        return "".join(f"{self._label(task)}{text}\n" for task, text in lines)

    def _twin_text(self, lines: list[tuple[list[str], bytes]]) -> bytes:
        """Lines out of the twin folder, each under the name of its task or the names of its tasks."""
        out = []
        labels: dict[str, bytes] = {}
        for tasks, line in lines:
            if len(tasks) == 1:
                label = labels.get(tasks[0]) or labels.setdefault(tasks[0], self._label(tasks[0]).encode())
            else:
                names = names_text(sorted(tasks, key=lambda name: self._rank.get(name, 1 << 30)))
                label = self._label(names, group=True).encode()
            out += (label, line, b"\n")
        return b"".join(out)

    def _task_text(self, name: str, attempt: int, block: bytes, shown: bool, metrics: MetricLines) -> str | bytes:
        if shown and not self.verbose and self._stop.folds(name, attempt):
            self._stop.count(name, block.count(b"\n") - sum(record is not None for _, record in metrics))
            shown = False
        if self.verbose or not (metrics or may_hold_chatter(block) or self._chatter.continues(name)):
            for _, record in metrics:  # raw lines shown: the records only move the status line on
                if record is not None:
                    self._board.add(name, attempt, record)
            if not shown:
                return ""
            if not block.isascii():  # bytes that are not UTF-8 are shown as U+FFFD
                block = block.decode("utf-8", "replace").encode()
            if self._folding():
                self._twins.add_block(name, block, time.monotonic())
                return ""
            prefix = self._label(name).encode()
            # The common case stays in bytes, one C-level replace: floods of output are cheap.
            return prefix + block[:-1].replace(b"\n", b"\n" + prefix) + b"\n"
        lines: list[Line] = []
        records = dict(metrics)
        for index, raw in enumerate(block[:-1].split(b"\n")):
            record = records.get(index)
            if record is not None:
                lines += self._board.add(name, attempt, record)
                continue
            if not shown:
                continue
            line = raw.decode("utf-8", "replace")
            if self._chatter.hides(name, line):
                self.hidden_lines += 1
            else:
                lines.append((name, line))
        return self._lines_text(lines)

    def _status_text(self) -> str:
        elapsed = int(self.clock() - self.started)
        hours, rest = divmod(elapsed, 3600)
        clock = f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"
        parts = [f"tflaunch {clock}"]
        board = self._board
        if board.epoch is not None:
            parts.append(f"epoch {board.epoch}/{board.total}" if board.total else f"epoch {board.epoch}")
        width = terminal_width(self._out)
        if width < STATUS_MIN_WIDTH:
            return ""  # a terminal of 0 columns (size unknown) or a sliver: a cut status line says nothing
        states = "  ".join(f"{name} {TaskState(state).value}" for name, state in self._states.items())
        tail = f"attempt {self._attempt}" + (f" | {self._note}" if self._note else "")
        if len(" | ".join([*parts, states, tail])) >= width:
            counts = collections.Counter(TaskState(state).value for state in self._states.values())
            states = f"{plural(len(self._states), 'task')}: " + ", ".join(f"{n} {s}" for s, n in counts.items())
        parts += [states or "starting", tail]
        text = " | ".join(parts)[:max(1, width - 1)]  # one column spare: a full line would wrap
        return click.style(text, reverse=True) if self.colour else text

