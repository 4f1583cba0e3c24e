"""The console under a flood of one repeated line while other tasks are shown: tflaunch's own
messages behind the flood still print before close() gives up, and every task line is either shown
or counted as left out."""

from __future__ import annotations

import io
import os
import tempfile
import time

from launcher.run.console.writer import HURRY_SLACK, Console
from launcher.run.console.twins import TwinFolder


def test_a_flood_of_one_line_leaves_the_messages_behind_it_printed_and_every_line_accounted_for():
    line = b"06b7512b97da408d890e1cfbfb8495b6\n"
    block, blocks = line * 30_000, 64  # about 63 MB: what a flooding task sends in a few seconds
    with tempfile.TemporaryFile("w+b") as shown:
        err = io.StringIO()
        out = os.fdopen(os.dup(shown.fileno()), "w")
        # The default queue, as a run has it: what it takes on before dropping (its bytes and a cost per
        # line) is drawn in a second or two of a quiet core. close() is given more than its default 5 s:
        # with a dozen busy processes per core (the fast tier beside three others), the writer thread
        # waited seconds for the interpreter's lock while this thread queued the flood, and the
        # message came out after 5 s. Printing in time behind a backlog is the next test's.
        console = Console(out, messages=err, colour=False, status=False)
        console.register(["worker-0", "worker-1"])  # two tasks: lines wait for twins
        for _ in range(blocks):
            console.task_block("worker-0", block)
        console.message("worker-1 on node1 failed (exit code 7)")
        console.close(timeout=60)  # returns once the writer is done
        out.close()
        shown.seek(0)
        printed = shown.read().count(b"| 06b7512b97da408d890e1cfbfb8495b6\n")
    assert "worker-1 on node1 failed (exit code 7)" in err.getvalue()
    assert printed + console.dropped_lines == blocks * 30_000
    assert console.dropped_lines > 0 and "the console fell behind" in err.getvalue()


def test_a_console_closed_behind_a_backlog_it_cannot_draw_in_time_counts_the_lines_and_prints_the_message():
    # A queue that holds the whole flood (about 2 million lines): drawing it takes longer than
    # close() gives, as a loaded machine makes of the default queue. The lines still waiting once
    # close() nears its end are counted, not drawn, so the message behind them gets out in time.
    line = b"06b7512b97da408d890e1cfbfb8495b6\n"
    block, blocks = line * 30_000, 64
    with tempfile.TemporaryFile("w+b") as shown:
        err = io.StringIO()
        out = os.fdopen(os.dup(shown.fileno()), "w")
        console = Console(out, messages=err, colour=False, status=False, max_queued=1 << 40)
        console.register(["worker-0", "worker-1"])
        for _ in range(blocks):
            console.task_block("worker-0", block)
        console.message("worker-1 on node1 failed (exit code 7)")
        started = time.monotonic()
        console.close(timeout=HURRY_SLACK + 0.5)
        took = time.monotonic() - started
        out.close()
        shown.seek(0)
        printed = shown.read().count(b"| 06b7512b97da408d890e1cfbfb8495b6\n")
    messages = err.getvalue()
    assert "worker-1 on node1 failed (exit code 7)" in messages, (took, messages)
    assert printed + console.dropped_lines == blocks * 30_000
    assert console.dropped_lines > 0 and "the console fell behind" in messages
    # The note comes before the message: the lines it counts were written before it.
    assert messages.index("the console fell behind") < messages.index("worker-1 on node1 failed")


def test_a_task_repeating_one_line_keeps_its_order_and_leaves_each_copy_on_its_own():
    folder = TwinFolder(hold=0.5, max_waiting=1_000)
    folder.add_block("worker-0", b"same\n" * 5_000, now=0.0)
    early = folder.due(0.1)  # past max_waiting: the oldest print early
    folder.add("worker-0", b"same", now=0.1)
    folder.add("worker-1", b"same", now=0.1)
    folder.add("worker-1", b"other", now=0.1)
    folder.add("worker-1", b"same", now=0.1)
    out = early + folder.flush()
    assert len(early) == 4_000 and len(out) == 5_003
    assert [tasks for tasks, _ in out[:4_000]] == [["worker-0"]] * 4_000
    # worker-1's first copy joins the oldest copy still waiting, its next lines follow it in order.
    assert out[4_000] == (["worker-0", "worker-1"], b"same")
    assert out[4_001:5_000] == [(["worker-0"], b"same")] * 999
    assert out[5_000:] == [(["worker-0"], b"same"), (["worker-1"], b"other"), (["worker-1"], b"same")]


def test_lines_waiting_for_twins_when_close_hurries_are_counted_not_drawn_and_the_message_follows():
    # Lines the writer took into the twin folder before close() (they wait there for the other
    # task's copies): once close() hurries they are left out like the lines still queued, counted
    # in the note, so that the message behind them needs no drawing of theirs.
    with tempfile.TemporaryFile("w+b") as shown:
        err = io.StringIO()
        out = os.fdopen(os.dup(shown.fileno()), "w")
        console = Console(out, messages=err, colour=False, status=False)
        console.register(["worker-0", "worker-1"])
        console._twins.hold = 3600.0  # they wait for their twins for the whole test, however slow it runs
        console.task_block("worker-0", b"a line that waits for its twin\n" * 100)
        deadline = time.monotonic() + 30
        while len(console._twins) < 100 and time.monotonic() < deadline:  # the writer took the block
            time.sleep(0.01)
        assert len(console._twins) == 100
        console.message("worker-1 on node1 failed (exit code 7)")
        console.close(timeout=HURRY_SLACK)  # hurries at once
        out.close()
        shown.seek(0)
        printed = shown.read().count(b"| a line that waits for its twin\n")
    messages = err.getvalue()
    assert printed == 0 and console.dropped_lines == 100, (printed, console.dropped_lines)
    assert messages.index("the console fell behind: 100 task lines") < messages.index("worker-1 on node1 failed")
