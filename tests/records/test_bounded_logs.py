"""Logs within a size limit: each task's log and merged.log keep their start, a marker line saying
exactly how many bytes were left out, and their latest output.

Pure tests of the size option, the head/tail accounting, the reader the pump uses, the views
'tflaunch logs' and the failure summary use, and of a log whose writer was killed; then real runs:
a flood past the limit, and tflaunch SIGKILLed in the middle of one."""

from __future__ import annotations

import io
import random
import re
import time
import uuid
from pathlib import Path

import pytest

from launcher.api import launch
from launcher.options import LOG_MAX_SIZE
from launcher.units import LOG_SIZE_RANGE, parse_size
from launcher.records.boundedlog import BoundedLog
from launcher.records.logformat import MARKER, format_size, live_layout
from launcher.records.logview import Follower, left_out, read_tail, read_view, tail_lines
from launcher.run.console.writer import Console
from launcher.run.output.pump import OutputPump
from launcher.errors import OptionsError
from launcher.transports.proxies import LogWriter
from conftest import descendants_alive
from polling import wait_for

MIN_SIZE = LOG_SIZE_RANGE[0]
NOW = 1_700_000_000.25
STAMP = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(NOW)) + ".250"


def output_of(task: str, lines: int, start: int = 0) -> bytes:
    """The deterministic output the flood tasks print (the same formula as FLOOD below)."""
    return b"".join(b"%s %08d the quick brown fox jumps over the lazy dog\n" % (task.encode(), i)
                    for i in range(start, start + lines))


def marker_of(data: bytes) -> tuple[int, int, int]:
    """(where the marker line starts, where it ends, the count it says) of the one marker in ``data``."""
    found = list(MARKER.finditer(data))
    assert len(found) == 1, [m[0] for m in found]
    return found[0].start(), found[0].end(), int(found[0][1].replace(b",", b""))


def assert_head_marker_tail(data: bytes, output: bytes) -> tuple[int, int]:
    """``data`` is a prefix of ``output``, one marker line, then the rest of ``output`` after exactly
    the bytes the marker counts; returns (head length, bytes left out)."""
    start, end, count = marker_of(data)
    assert data[:start] == output[:start]
    assert data[end:] == output[start + count:]
    return start, count


def write_in_chunks(log: BoundedLog, data: bytes, rng: random.Random) -> None:
    at = 0
    while at < len(data):
        size = rng.choice([1, 7, 100, 4096, 65536, 300_000])
        log.write(data[at:at + size])
        at += size


def parts_of(path: Path) -> list[Path]:
    return sorted(path.parent.glob(path.name + ".part-*"))


# -- the size option ----------------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize("text, size", [("512M", 512 << 20), ("2G", 2 << 30), ("100k", 100 << 10), ("1.5GiB", 3 << 29),
                                        ("1048576", 1 << 20), ("64k", MIN_SIZE), ("2gb", 2 << 30), (" 1 T ", 1 << 40)])
def test_sizes_are_read_in_the_forms_people_write(text, size):
    assert parse_size(text) == size


@pytest.mark.unit
@pytest.mark.parametrize("text", ["12x", "", "-1", "1e5", "G", "1,5G", "63k", "0", "2000T", "9" * 400])
def test_a_size_that_is_none_or_out_of_range_is_refused_naming_it(text):
    with pytest.raises(ValueError) as caught:
        parse_size(text)
    assert repr(text) in str(caught.value)


@pytest.mark.unit
def test_sizes_are_shown_for_people():
    assert [format_size(n) for n in (512, 1536, 3 << 20, LOG_MAX_SIZE)] == \
        ["512 bytes", "1.5 KiB", "3.0 MiB", "1.0 GiB"]


@pytest.mark.unit
@pytest.mark.parametrize("value", ["12x", 10, True, 2.5, "1k"])
def test_launch_refuses_a_bad_log_max_size_naming_the_keyword(value, tmp_path):
    with pytest.raises(OptionsError) as caught:
        launch(local=1, command=["true"], log_dir=tmp_path, log_max_size=value)
    assert str(caught.value).startswith("log_max_size: expected a size") and repr(value) in str(caught.value)
    assert not (tmp_path / "logs").exists() and list(tmp_path.iterdir()) == []


# -- head, marker and tail ------------------------------------------------------------------------


@pytest.mark.unit
def test_a_log_under_its_limit_is_its_output_as_it_is(tmp_path):
    path = tmp_path / "worker-0.log"
    log = BoundedLog(path, MIN_SIZE)
    data = output_of("worker-0", 1000)[:MIN_SIZE]
    write_in_chunks(log, data, random.Random(1))
    log.close()
    assert path.read_bytes() == data and parts_of(path) == [] and left_out(path) == 0


@pytest.mark.unit
@pytest.mark.parametrize("limit, lines, seed", [(MIN_SIZE, 20_000, 1), (1 << 20, 200_000, 2), (300_000, 12_000, 3)])
def test_past_its_limit_a_log_keeps_its_head_a_marker_and_its_tail_exactly(tmp_path, limit, lines, seed):
    path = tmp_path / "worker-0.log"
    log = BoundedLog(path, limit)
    output = output_of("worker-0", lines)
    write_in_chunks(log, output, random.Random(seed))
    # While it is written: the file holds the head and a marker, the parts the latest output, and
    # the whole stays within the limit and a part (no reader holds parts back).
    layout = live_layout(path)
    assert layout is not None and layout.head_end <= limit // 4
    on_disk = path.stat().st_size + sum(p.stat().st_size for p in parts_of(path))
    assert on_disk <= limit + limit // 8 + 200
    assert read_view(path).startswith(output[:layout.head_end])
    log.close()
    data = path.read_bytes()
    head, count = assert_head_marker_tail(data, output)
    assert parts_of(path) == [] and not list(tmp_path.glob(".*"))
    assert limit // 4 - 64 <= head <= limit // 4 and output[head - 1:head] == b"\n"  # cut after a line end
    tail = len(data) - marker_of(data)[1]
    assert limit * 3 // 4 - 64 <= tail <= limit * 3 // 4  # the last three quarters, from a line start
    assert len(data) <= limit + 80 and head + count + tail == len(output)
    assert left_out(path) == count and data.decode("utf-8")


@pytest.mark.unit
def test_a_reader_keeps_up_with_a_log_across_its_spill_and_its_parts(tmp_path):
    log = BoundedLog(tmp_path / "worker-0.log", MIN_SIZE)
    reader, rng = log.reader(), random.Random(4)
    output, got = output_of("worker-0", 30_000), bytearray()
    for at in range(0, len(output), 5000):
        log.write(output[at:at + 5000])
        while rng.random() < 0.5:
            skipped, data = reader.read(rng.choice([100, 70_000]))
            assert skipped == 0
            got += data
    while True:
        skipped, data = reader.read(1 << 20)
        if not data:
            break
        got += data
    assert bytes(got) == output
    # The parts it read are gone now; those it had not read were kept for it.
    log.write(b"x" * MIN_SIZE)
    assert sum(p.stat().st_size for p in parts_of(log.path)) <= MIN_SIZE * 2


@pytest.mark.unit
def test_a_reader_that_falls_further_behind_than_it_is_allowed_skips_and_says_how_much(tmp_path):
    log = BoundedLog(tmp_path / "worker-0.log", MIN_SIZE)
    log.lag_allowance = MIN_SIZE  # the floor for real logs is 64 MiB
    reader = log.reader()
    output = output_of("worker-0", 40_000)
    log.write(output)
    got, skips = bytearray(), []
    while True:
        skipped, data = reader.read(1 << 20)
        if skipped:
            skips.append((len(got), skipped))
        if not data:
            break
        got += data
    assert len(skips) == 1  # the head, then a jump to the oldest part kept
    at, skipped = skips[0]
    assert at <= MIN_SIZE // 4 and bytes(got) == output[:at] + output[at + skipped:] and len(got) >= MIN_SIZE


@pytest.mark.unit
def test_a_log_whose_writer_was_killed_reads_as_head_marker_and_parts_and_the_next_writer_stitches_it(tmp_path):
    path = tmp_path / "merged.log"
    output = output_of("worker-0", 40_000)
    log = BoundedLog(path, MIN_SIZE)
    write_in_chunks(log, output, random.Random(5))
    del log  # never closed: the state a SIGKILL leaves
    text = path.read_bytes()
    assert text.endswith(b"until this log is closed ...]\n") and parts_of(path)
    assert all(part.read_bytes() == output[int(part.name.rsplit("-", 1)[1]):][:part.stat().st_size]
               for part in parts_of(path))
    view = read_view(path)
    head, count = assert_head_marker_tail(view, output)
    assert left_out(path) == count
    data, cut, counted = read_tail(path, 1000)
    assert cut and counted == count and data == output[-1000:]
    # The next writer of the file (a requeued job's merged.log) makes it whole first, within its
    # limit, then appends; the bytes its first marker counts stay counted.
    again = BoundedLog(path, MIN_SIZE)
    stitched = path.read_bytes()
    assert parts_of(path) == [] and len(stitched) <= MIN_SIZE + 80 and view.endswith(stitched[-40_000:])
    first_head, first_count = assert_head_marker_tail(stitched, output)
    assert first_head == head and first_count >= count and left_out(path) == first_count
    again.write(output_of("worker-0", 2000, 40_000))
    again.close()
    final = path.read_bytes()
    assert final.startswith(stitched[:head]) and final.endswith(output_of("worker-0", 1, 41_999))
    assert [m.start() for m in MARKER.finditer(final)][0] == head and left_out(path) > first_count


@pytest.mark.unit
@pytest.mark.parametrize("every", [1, 7, 40])
def test_a_follower_gives_every_byte_once_and_a_marker_for_what_it_missed(tmp_path, every):
    path = tmp_path / "worker-0.log"
    log = BoundedLog(path, MIN_SIZE)
    follower = Follower(path)
    output, seen = output_of("worker-0", 30_000), bytearray()
    for n, at in enumerate(range(0, len(output), 3000)):
        log.write(output[at:at + 3000])
        if n % every == 0:
            seen += follower.read()
    log.close()
    seen += follower.read()
    # Pieces of the output in order, a marker line wherever it missed some (on a line of its own: a
    # line end is added before it when needed), the last byte at the end.
    at = position = 0
    for match in MARKER.finditer(bytes(seen)):
        piece = bytes(seen[position:match.start()])
        if output[at:at + len(piece)] != piece:
            assert piece.endswith(b"\n") and output[at:at + len(piece) - 1] == piece[:-1]
            piece = piece[:-1]
        at += len(piece) + int(match[1].replace(b",", b""))
        position = match.end()
    assert output[at:] == seen[position:]
    if every == 1:
        assert MARKER.search(bytes(seen)) is None  # it never fell behind


@pytest.mark.unit
def test_the_failure_summarys_tail_says_how_much_of_the_log_was_left_out(tmp_path):
    path = tmp_path / "worker-0.log"
    log = BoundedLog(path, MIN_SIZE)
    output = output_of("worker-0", 40_000) + b"Traceback: the crash\n"
    log.write(output)
    log.close()
    count = marker_of(path.read_bytes())[2]
    lines = tail_lines(path, 3)  # the note takes the place of the oldest line asked for
    assert lines == [f"[... tflaunch: {count:,} bytes ({format_size(count)}) of this log's output left out "
                     f"before these lines ...]", output_of("worker-0", 1, 39_999).decode().rstrip("\n"),
                     "Traceback: the crash"]
    plain = tmp_path / "worker-1.log"
    plain.write_bytes(b"a\nb\n")
    assert tail_lines(plain, 3) == ["a", "b"]


@pytest.mark.unit
def test_relayed_output_keeps_task_logs_and_merged_log_within_their_limits_exactly(tmp_path):
    """The pump and the transports' log writer together, in process, with a fixed clock."""
    out = io.StringIO()
    console = Console(out, messages=out, colour=False, status=False, quiet=True)
    pump = OutputPump(tmp_path / "merged.log", tmp_path / "metrics.jsonl", console, clock=lambda: NOW,
                      log_max_size=MIN_SIZE, interval=0.001)
    writer, names = LogWriter(), ["worker-0", "worker-1"]
    outputs = {name: output_of(name, 6000) for name in names}
    for name in names:
        pump.follow(name, tmp_path / f"{name}.log")
    pump.message("started")
    pump.start()
    for at in range(0, len(outputs["worker-0"]), 30_000):
        for name in names:
            writer.append(str((tmp_path / f"{name}.log").resolve()), outputs[name][at:at + 30_000])
    pump.close()
    writer.close()
    console.close()
    for name in names:
        assert_head_marker_tail((tmp_path / f"{name}.log").read_bytes(), outputs[name])
    merged = (tmp_path / "merged.log").read_bytes()
    start, end, count = marker_of(merged)
    assert len(merged) <= 4 * MIN_SIZE + 80
    # Every merged line is "<STAMP> [1] <task> | <line>": the lines left out are, for each task, those
    # between the last one in the head and the first one in the tail, and the marker counts them exactly.
    left = 0
    for name in names:
        prefix = f"{STAMP} [1] {name} | ".encode()
        lines = outputs[name].splitlines(keepends=True)
        head = [line for line in merged[:start].splitlines(keepends=True) if line.startswith(prefix)]
        tail = [line for line in merged[end:].splitlines(keepends=True) if line.startswith(prefix)]
        assert head == [prefix + line for line in lines[:len(head)]]
        assert tail == [prefix + line for line in lines[len(lines) - len(tail):]]
        left += sum(len(prefix) + len(line) for line in lines[len(head):len(lines) - len(tail)])
    assert merged.startswith(f"{STAMP} [1] tflaunch | started\n".encode()) and count == left


# -- real runs --------------------------------------------------------------------------------------

# Each task prints LINES numbered lines (output_of's formula) in blocks, as fast as it can.
FLOOD = ("import os, sys, time\n"
         "task, lines, pause = os.environ['TFLAUNCH_TASK'].encode(), int(sys.argv[1]), float(sys.argv[2])\n"
         "i = 0\n"
         "while lines < 0 or i < lines:\n"
         "    n = 4000 if lines < 0 else min(4000, lines - i)\n"
         "    os.write(1, b''.join(b'%s %08d the quick brown fox jumps over the lazy dog\\n' % (task, j)\n"
         "                         for j in range(i, i + n)))\n"
         "    i += n\n"
         "    time.sleep(pause)\n")
LINE_BYTES = len(output_of("worker-0", 1))


@pytest.mark.slow
def test_a_flood_past_the_limit_leaves_every_log_within_it_with_its_exact_head_tail_and_marker(tflaunch):
    lines = 50 * 1000 * 1000 // LINE_BYTES  # 50 MB from each task, 1 MB allowed per task log
    done = tflaunch.run("--local", "2", "--quiet", "--log-max-size", "1M", "--", "python", "-c", FLOOD,
                        str(lines), "0", timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    logs = sorted(p.name for p in done.run_dir.iterdir() if ".log" in p.name)
    assert logs == ["merged.log", "worker-0.log", "worker-1.log"]  # no parts left
    names = ["worker-0", "worker-1"]
    for name in names:
        data = (done.run_dir / f"{name}.log").read_bytes()
        assert len(data) <= (1 << 20) + 80
        assert_head_marker_tail(data, output_of(name, lines))
    merged = done.merged
    start, end, count = marker_of(merged)
    assert len(merged) <= (4 << 20) + 80
    left = 0
    for name in names:
        prefix = re.compile(rb"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} \[1\] " + name.encode() + rb" \| (.*\n)")
        expected = output_of(name, lines).splitlines(keepends=True)
        head = [m[1] for m in map(prefix.fullmatch, merged[:start].splitlines(keepends=True)) if m]
        tail = [m[1] for m in map(prefix.fullmatch, merged[end:].splitlines(keepends=True)) if m]
        assert head == expected[:len(head)] and tail == expected[len(expected) - len(tail):]
        width = len(b"2026-11-25 15:01:18.123 [1] ") + len(name) + len(b" | ")
        left += sum(width + len(line) for line in expected[len(head):len(expected) - len(tail)])
    assert count == left  # the marker counts exactly the merged lines left out
    # tflaunch logs shows each marker; report names the logs over their limit.
    shown = tflaunch.run("logs", done.run_dir.name, "--task", "worker-1")
    assert shown.returncode == 0 and shown.stdout.encode() == (done.run_dir / "worker-1.log").read_bytes()
    merged_shown = tflaunch.run("logs", done.run_dir.name, "--grep", "nothing matches this")
    assert merged_shown.stdout == f"[... tflaunch: {count:,} bytes ({format_size(count)}) left out here ...]\n"
    report = tflaunch.run("report", done.run_dir.name)
    assert "logs over their size limit: worker-0.log (" in report.stderr and "merged.log (" in report.stderr


@pytest.mark.slow
def test_tflaunch_sigkilled_mid_flood_leaves_readable_logs_with_head_marker_and_latest_output(tflaunch):
    marker = uuid.uuid4().hex  # on the task's command line: tells when it is gone
    proc = tflaunch.start("--local", "1", "--quiet", "--log-max-size", "64k", "--", "python", "-c", FLOOD, "-1",
                          "0.01", marker)
    run_dir = wait_for(tflaunch.latest_run, timeout=60, message="the run folder")
    log, merged = run_dir / "worker-0.log", run_dir / "merged.log"

    def past_limits() -> bool:  # both logs have parts, and both have deleted some already
        starts = [[int(p.name.rsplit("-", 1)[1]) for p in parts_of(path)] for path in (log, merged)]
        return all(starts) and min(starts[0]) > 0 and min(starts[1]) > 0

    wait_for(past_limits, timeout=120, message="both logs to be past their limits")
    proc.kill()
    proc.communicate(timeout=30)
    wait_for(lambda: not descendants_alive(marker), timeout=30, message="the task to end with its agent")
    for path in [log, *parts_of(log), merged, *parts_of(merged)]:
        data = path.read_bytes()
        assert b"\0" not in data
        data.decode("utf-8")  # readable text, every file (raises otherwise)
    assert log.read_bytes().endswith(b"until this log is closed ...]\n")
    shown = tflaunch.run("logs", run_dir.name, "--task", "worker-0")
    assert shown.returncode == 0
    view = shown.stdout.encode()
    start, end, count = marker_of(view)
    complete = int(view.rsplit(b"\n", 3)[-3].split()[1])  # the line before the last, which may be cut short
    output = output_of("worker-0", complete + 2)
    # The head, the bytes left out, then the output up to the last bytes relayed (the last line may
    # be cut short by the kill; 'logs' ends it).
    tail = view[end:]
    assert view[:start] == output[:start] and count > 0 and tail.endswith(b"\n")
    assert tail[:-1] == output[start + count:start + count + len(tail) - 1]
    assert MARKER.search(tflaunch.run("logs", run_dir.name).stdout.encode()) is not None
    report = tflaunch.run("report", run_dir.name)
    assert "worker-0.log (" in report.stderr and "merged.log (" in report.stderr


@pytest.mark.slow
@pytest.mark.parametrize("value", ["12x", "1k", "5 MB of logs", "9" * 30])
def test_a_bad_log_max_size_is_one_line_and_exit_2(tflaunch, value):
    done = tflaunch.run("--local", "1", "--log-max-size", value, "--", "true")
    assert done.returncode == 2 and "Traceback" not in done.stderr and done.run_dir is None
    errors = [line for line in done.stderr.splitlines() if line.startswith("tflaunch: error:")]
    assert len(errors) == 1 and "--log-max-size" in errors[0] and repr(value) in errors[0]
