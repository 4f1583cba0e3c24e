"""What the console and its metric board hold stays bounded whatever the tasks print: metric lines
waiting for a stalled terminal, records waiting for a silent speaker, a console file's tail."""

from __future__ import annotations

import io
import json
import os

import pytest

from launcher.records.metrics import metric_lines
from launcher.run.console.writer import Console
from launcher.run.console.metricview import KEPT, MetricBoard
from launcher.run.console.terminal import FileBound

pytestmark = pytest.mark.unit


def _metric_block(first: int, count: int, pad: int = 2000) -> bytes:
    return b"".join(b"TFLAUNCH_METRIC " + json.dumps({"kind": "epoch", "epoch": n, "loss": 0.5,
                                                       "pad": [0.5] * pad}).encode() + b"\n"
                    for n in range(first, first + count))


def test_metric_lines_for_a_stalled_terminal_are_bounded_too():
    read_end, write_end = os.pipe()  # nobody reads, and it is full: every write blocks
    os.set_blocking(write_end, False)
    try:
        while True:
            os.write(write_end, b"x" * 4096)
    except BlockingIOError:
        os.set_blocking(write_end, True)
    stream = os.fdopen(write_end, "w")
    err = io.StringIO()
    limit = 256 << 10
    console = Console(stream, messages=err, colour=False, status=False, max_queued=limit)
    console.register(["worker-0"])
    for start in range(1, 1001, 20):  # 1,000 records of 10 KB: 10 MB of metric lines
        block = _metric_block(start, 20)
        _, found = metric_lines(block)
        console.task_block("worker-0", block, 1, found)
    with console._cond:
        queued, items = console._queued, list(console._queue)
    assert queued <= 2 * limit + (64 << 10)
    # What waits is the records' figures (as the pump hands them over), not their 10 KB lines of text.
    held = sum(len(item[3]) for item in items if item[0] == "task")
    assert held < 64 << 10
    console.close(timeout=0.5)
    os.close(read_end)
    console._thread.join(10)
    assert console.dropped_lines > 0 and "fell behind" in err.getvalue()
    stream.close()


def _record(epoch: int) -> dict:
    return {"kind": "epoch", "epoch": epoch, "loss": 0.25}


def test_records_waiting_for_a_silent_speaker_are_bounded_and_shown_oldest_first():
    board = MetricBoard()
    board.register(["chief-0", "worker-0"])  # chief-0 speaks for the run, and never reports
    shown = []
    for epoch in range(1, 1001):
        shown += board.add("worker-0", 1, _record(epoch))
    assert len(board._held) == KEPT
    assert [text.split()[1] for _, text in shown] == [str(n) for n in range(1, 1001 - KEPT)]
    assert [text.split()[1] for _, text in board.release(["chief-0"])] == [str(n) for n in range(1001 - KEPT, 1001)]
    assert len(board._shown) <= KEPT


def test_a_board_that_shows_every_epoch_keeps_only_the_latest_for_comparison():
    board = MetricBoard()
    board.register(["worker-0", "worker-1"])
    for epoch in range(1, 1001):
        board.add("worker-0", 1, {**_record(epoch), "pad_figure": 1.0})
    assert len(board._shown) == KEPT
    # A late worker's record of a recent epoch is still compared; the figures kept are the compared ones.
    assert board.add("worker-1", 1, {**_record(1000), "loss": 0.5}) == [
        ("worker-1", "epoch 1000 differs from worker-0's: loss 0.5000 (0.2500)")]
    assert all(set(figures) == {"loss", "accuracy", "val_loss", "val_accuracy"} for _, figures in board._shown.values())


def test_a_console_file_keeps_a_quarter_of_its_limit_then_a_marker_and_the_last_lines():
    bound = FileBound(4096, already=0)
    lines = [f"worker-0 | line {n}\n".encode() for n in range(2000)]
    written = b"".join(bound.take(b"".join(lines[n:n + 10])) for n in range(0, 2000, 10)) + bound.ending()
    head, note, rest = written.partition(b"tflaunch: this file reached its size limit")
    assert head == b"".join(lines[:len(head.splitlines())]) and 0 < len(head) <= 1024
    marker, _, tail = rest.split(b"\n", 1)[1].partition(b" left out here ...]\n")
    assert tail.endswith(lines[-1]) and len(tail) <= 3072
    assert tail.startswith(b"worker-0 | line ")  # from a line start
    left = int(marker.split(b" ")[2].replace(b",", b""))
    assert len(head) + left + len(tail) == sum(map(len, lines))


def test_a_console_file_already_past_its_head_keeps_only_its_tail():
    bound = FileBound(4096, already=5000)  # a requeued job appending to its earlier output
    assert bound.take(b"first\n").startswith(b"tflaunch: this file reached its size limit")
    assert bound.ending().endswith(b"left out here ...]\nfirst\n")
