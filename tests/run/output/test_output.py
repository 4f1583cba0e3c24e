"""Task output: line splitting and folding, the pump into merged.log and metrics.jsonl, the console
it feeds, log tails, and the exit statuses reported with it."""

from __future__ import annotations

import io
import json
import random
import re
import time
from pathlib import Path

import pytest

from launcher.run.console.writer import Console
from launcher.records.metrics import PREFIX as METRIC_PREFIX
from launcher.records.logview import tail_lines
from launcher.run.output.pump import LineSplitter, OutputPump
from launcher.records.exits import signal_name
from launcher.transports.base import CANNOT_START, UNREACHABLE, ExitStatus
from launcher.options import LOG_MAX_SIZE
from polling import wait_for

pytestmark = pytest.mark.unit

NOW = 1_700_000_000.25
STAMP = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(NOW)) + ".250"


def split_all(data: bytes, sizes: list[int] | None = None) -> list[bytes]:
    """Feed ``data`` in chunks of the given sizes (all at once without sizes), then flush."""
    splitter = LineSplitter()
    lines: list[bytes] = []
    if sizes is None:
        lines += splitter.feed(data)
    else:
        at = 0
        for size in sizes:
            lines += splitter.feed(data[at:at + size])
            at += size
        assert at >= len(data)
    return lines + splitter.flush()


def chunked(data: bytes, *pieces: int) -> list[bytes]:
    """``data`` cut before each of the given offsets."""
    cuts = [0, *pieces, len(data)]
    return [data[a:b] for a, b in zip(cuts, cuts[1:])]


def feed_chunks(chunks: list[bytes]) -> list[bytes]:
    splitter = LineSplitter()
    lines = []
    for chunk in chunks:
        lines += splitter.feed(chunk)
    return lines + splitter.flush()


# ---------------------------------------------------------------------------------------------
# LineSplitter


@pytest.mark.parametrize("data, lines", [
    (b"a\nb\n", [b"a", b"b"]),
    (b"a\r\nb\r\n", [b"a", b"b"]),
    (b"a\r\nb\nc\r\n", [b"a", b"b", b"c"]),
    (b"10%\r20%\r30%\n", [b"30%"]),
    (b"\rEpoch 1\rEpoch 2\n", [b"Epoch 2"]),
    (b"a\n\n\nb\n", [b"a", b"", b"", b"b"]),
    (b"\n", [b""]),
    (b"\r\n\r\n", [b"", b""]),
    (b"a\r\rb\n", [b"b"]),
    (b"a\n\r\nb\n", [b"a", b"", b"b"]),
    (b"", []),
    (b"abc\rd\n", [b"dbc"]),
    (b"ab\x08c\n", [b"ac"]),
    (b"abc\x08\x08\x08\n", [b"abc"]),
    (b"\x08\x08x\n", [b"x"]),
    (b"\r   \r\n", []),  # a bar cleared with spaces leaves no line
    (b"\r\r\n", []),
    (b"50%\x1b[K\rdone\x1b[K\n", [b"done"]),
    (b"12345\r\x1b[2Kab\n", [b"ab"]),
    (b"\x1b[31mred\x1b[0m\n", [b"\x1b[31mred\x1b[0m"]),  # colour is no control: kept
    (b"caf\xc3\xa9\x08e\n", [b"cafe"]),  # a backspace moves back one character, not one byte
    (b"\xff\xfe\rX\n", [b"X\xfe"]),
])
def test_split(data, lines):
    splitter = LineSplitter()
    assert splitter.feed(data) == lines
    assert splitter.flush() == []


def test_crlf_split_across_chunks_is_one_line_end():
    splitter = LineSplitter()
    assert splitter.feed(b"first\r") == []
    assert splitter.feed(b"\nsecond\r") == [b"first"]
    assert splitter.feed(b"\n") == [b"second"]
    assert splitter.flush() == []


def test_a_progress_bar_is_one_line_when_its_line_ends():
    splitter = LineSplitter()
    assert splitter.feed(b"10%\r") == []
    assert splitter.feed(b"20%\r") == []
    assert splitter.feed(b"30%\n") == [b"30%"]


def test_lone_carriage_return_chunks():
    assert feed_chunks([b"a", b"\r", b"\r", b"\n", b"b", b"\r"]) == [b"a", b"b"]


KERAS_EPOCH = (b"Epoch 1/2\n\r 1/16 [>.............................] - ETA: 8s - loss: 0.6216" + b"\x08" * 82
               + b"\r16/16 [==============================] - 1s 2ms/step - loss: 0.6638\n")


def test_keras_progress_bar_becomes_what_a_terminal_shows():
    # Bytes as tf_keras's Progbar (verbose=1) writes them into a file, captured here.
    assert split_all(KERAS_EPOCH) == [b"Epoch 1/2", b"16/16 [==============================] - 1s 2ms/step - loss: 0.6638"]
    assert split_all(KERAS_EPOCH, [1] * len(KERAS_EPOCH)) == split_all(KERAS_EPOCH)


PROGBARS = Path(__file__).resolve().parents[2] / "fixtures" / "console"
SGR = re.compile(rb"\x1b\[[0-9;]*m")


@pytest.mark.parametrize("name, bar", [
    ("tf_keras_progbar.log", rb"16/16 \[=+\] - \d+s \d+(?:ms|us|s)/step - loss: [\d.]+ - accuracy: [\d.]+"),
    ("keras3_progbar.log", rb"16/16 (?:\xe2\x94\x81){20} \d+s \d+(?:ms|us|s)/step - accuracy: [\d.]+ - loss: [\d.]+ *"),
])
def test_captured_keras_progress_bars_fold_to_one_line_per_epoch(name, bar):
    # model.fit(verbose=1) of tf_keras and of Keras 3 with stdout to a file, captured here.
    data = (PROGBARS / name).read_bytes()
    for lines in (split_all(data), split_all(data, [7] * (len(data) // 7 + 1))):
        assert [SGR.sub(b"", line) for line in lines[:2]][0] == b"Epoch 1/2"
        plain = [SGR.sub(b"", line) for line in lines]
        assert len(plain) == 5 and plain[2] == b"Epoch 2/2" and plain[4] == b"done"
        assert re.fullmatch(bar, plain[1]) and re.fullmatch(bar, plain[3]), plain


def test_a_bar_redrawn_without_newline_stays_bounded_and_keeps_its_cursor():
    splitter = LineSplitter()
    for i in range(20_000):  # about 1 MB of redraws without a newline
        assert splitter.feed(b"\r%5d/20000 [" % i + b"=" * 20 + b"]" + b"\x08" * 3) == []
        assert len(splitter.pending) <= 2 * LineSplitter.MAX_PENDING
    assert splitter.feed(b"\rXY") == []  # overwrites the start; the rest of the bar stays
    assert splitter.flush() == [b"XY999/20000 [" + b"=" * 20 + b"]"]


def test_partial_last_line_only_from_flush():
    splitter = LineSplitter()
    assert splitter.feed(b"whole\npart") == [b"whole"]
    assert splitter.feed(b"ial") == []
    assert splitter.flush() == [b"partial"]
    assert splitter.flush() == []
    assert splitter.feed(b"again") == []
    assert splitter.flush() == [b"again"]


def test_flush_drops_a_held_carriage_return_only():
    splitter = LineSplitter()
    assert splitter.feed(b"99%\r") == []
    assert splitter.flush() == [b"99%"]


def test_non_utf8_bytes_kept_byte_for_byte():
    data = b"\xff\xfe caf\xc3\xa9 \x80\x81 \xe2\x82\n\x00\x01\x1b[31mred\x1b[0m\n"
    assert split_all(data) == [b"\xff\xfe caf\xc3\xa9 \x80\x81 \xe2\x82", b"\x00\x01\x1b[31mred\x1b[0m"]
    assert split_all(data, [1] * len(data)) == split_all(data)


def test_very_long_line_comes_out_in_pieces_without_losing_a_byte():
    rng = random.Random(7)
    long = bytes(rng.choice(b"abcdefghij \t\xff\x00") for _ in range(300_000))
    splitter = LineSplitter()
    out: list[bytes] = []
    for chunk in chunked(long, *range(7000, len(long), 7000)):
        out += splitter.feed(chunk)
        assert len(splitter.pending) <= LineSplitter.MAX_PENDING  # memory stays bounded
    assert len(out) >= 3
    out += splitter.flush()
    assert b"".join(out) == long


def test_very_long_line_in_one_chunk_then_normal_lines():
    long = b"x" * (3 * LineSplitter.MAX_PENDING + 5)
    out = split_all(long + b"\r\nnext\n")
    assert out[-1] == b"next"
    assert b"".join(out[:-1]) == long


def test_long_line_followed_by_a_split_crlf():
    long = b"y" * (LineSplitter.MAX_PENDING + 10)
    out = feed_chunks([long + b"\r", b"\nafter\n"])
    assert out[-1] == b"after" and b"".join(out[:-1]) == long


def reference_lines(data: bytes) -> list[bytes]:
    """Lines ending at \\n, each drawn one character at a time as a terminal does; a line that
    drawing left blank is dropped unless it was blank (or a lone \\r of a \\r\\n) to begin with."""
    parts = data.split(b"\n")
    lines = parts[:-1] + ([parts[-1]] if parts[-1] else [])
    out = []
    for raw in lines:
        body = raw[:-1] if raw.endswith(b"\r") else raw
        if b"\r" not in body and b"\x08" not in body:
            out.append(body)
            continue
        cells: list[str] = []
        col = 0
        for char in body.decode("utf-8", "surrogateescape"):
            if char == "\r":
                col = 0
            elif char == "\x08":
                col = max(0, col - 1)
            else:
                cells[col:col + 1] = [char]
                col += 1
        text = "".join(cells)
        if text.strip():
            out.append(text.encode("utf-8", "surrogateescape"))
    return out


@pytest.mark.parametrize("seed", range(25))
def test_random_text_in_random_chunks_gives_the_same_lines(seed):
    rng = random.Random(seed)
    tokens = [b"a", b"bc", b"defgh", b" ", b"\xc3\xa9", b"\xff", b"\n", b"\r", b"\r\n", b"\n\r", b"\r\r", b"\x00",
              b"\x08", b"\x08\x08\x08", b"\x08\r"]
    data = b"".join(rng.choice(tokens) for _ in range(rng.randrange(0, 3000)))
    whole = split_all(data)
    assert whole == reference_lines(data)
    for _ in range(5):
        sizes = []
        while sum(sizes) < len(data):
            sizes.append(rng.choice([0, 1, 1, 2, 3, rng.randrange(1, 200)]))
        assert split_all(data, sizes) == whole


# ---------------------------------------------------------------------------------------------
# Console


def make_console(**kwargs) -> tuple[Console, io.StringIO, io.StringIO]:
    out, err = io.StringIO(), io.StringIO()
    return Console(out, messages=err, **kwargs), out, err


def test_console_prefixes_task_lines_without_colour_when_not_a_tty():
    console, out, err = make_console()
    console.register(["worker-0", "ps-0"])
    console.task_block("worker-0", b"hello\ncaf\xc3\xa9 \xff\n")
    console.task_block("ps-0", b"\n")
    console.message("two\nlines")
    console.close()  # the console writes on its own thread; close() waits for it
    assert out.getvalue() == "worker-0 | hello\nworker-0 | caf\u00e9 \ufffd\nps-0     | \n"
    assert err.getvalue() == "tflaunch: two\ntflaunch: lines\n"
    assert "\x1b" not in out.getvalue() + err.getvalue()


def test_console_width_follows_the_longest_name():
    console, out, _ = make_console()
    console.register(["evaluator-0", "ps-0"])
    console.task_block("ps-0", b"x\n")
    console.close()
    assert out.getvalue() == "ps-0        | x\n"


def test_console_colour_when_asked():
    console, out, err = make_console(colour=True)
    console.register(["worker-0", "worker-1"])
    console.task_block("worker-0", b"a\n")
    console.task_block("worker-1", b"b\n")
    console.message("m")
    console.close()
    first, second = out.getvalue().splitlines()
    assert first.startswith("\x1b[") and first.endswith("\x1b[0m | a")
    assert first[:5] != second[:5]  # each task its own colour
    assert err.getvalue().startswith("\x1b[")


def test_console_filters_by_task_and_quiet():
    console, _, _ = make_console(tasks=["worker-1"])
    assert console.shows("worker-1") and not console.shows("worker-0")
    quiet, _, err = make_console(quiet=True)
    assert not quiet.shows("worker-0")
    quiet.message("still shown")
    quiet.close()
    assert err.getvalue() == "tflaunch: still shown\n"
    everyone, _, _ = make_console()
    assert everyone.shows("anything")


# ---------------------------------------------------------------------------------------------
# OutputPump


class Run:
    """A pump over task files in a temporary folder, with a fixed clock."""

    def __init__(self, folder: Path, **console_options):
        self.folder = folder
        self.console, self.out, self.err = make_console(**console_options)
        self.pump = OutputPump(folder / "merged.log", folder / "metrics.jsonl", self.console, log_max_size=LOG_MAX_SIZE, clock=lambda: NOW)

    def task_file(self, name: str, attempt: int = 1) -> Path:
        path = self.folder / f"{name}.log"
        self.pump.follow(name, path, attempt)
        return path

    def close(self) -> None:
        self.pump.close()
        self.console.close()

    @property
    def merged(self) -> list[bytes]:
        return (self.folder / "merged.log").read_bytes().split(b"\n")[:-1]

    @property
    def metrics(self) -> list[dict]:
        return [json.loads(line) for line in (self.folder / "metrics.jsonl").read_text().splitlines()]


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as handle:
        handle.write(data)


def test_pump_writes_task_lines_to_merged_log_with_prefix(tmp_path):
    run = Run(tmp_path)
    w0, w1 = run.task_file("worker-0"), run.task_file("worker-1")
    append(w0, b"hello\r\nworld\n")
    append(w1, b"from one\n")
    append(w0, b"partial, no newline")
    run.close()
    assert run.merged == [
        f"{STAMP} [1] worker-0 | hello".encode(),
        f"{STAMP} [1] worker-0 | world".encode(),
        f"{STAMP} [1] worker-0 | partial, no newline".encode(),
        f"{STAMP} [1] worker-1 | from one".encode(),
    ]
    assert run.out.getvalue() == (
        "worker-0 | hello\nworker-0 | world\nworker-0 | partial, no newline\nworker-1 | from one\n")


def test_pump_keeps_raw_bytes_in_merged_log(tmp_path):
    run = Run(tmp_path)
    append(run.task_file("chief-0"), b"bad \xff\xfe bytes\n")
    run.close()
    assert run.merged == [f"{STAMP} [1] chief-0 | ".encode() + b"bad \xff\xfe bytes"]
    assert run.out.getvalue() == "chief-0  | bad \ufffd\ufffd bytes\n"


def test_pump_folds_progress_bars_in_merged_log_and_on_the_console(tmp_path):
    run = Run(tmp_path)
    path = run.task_file("worker-0")
    append(path, KERAS_EPOCH[:40])  # the bar arrives in pieces, as it is drawn
    append(path, KERAS_EPOCH[40:] + b"done\n")
    run.close()
    bar = b"16/16 [==============================] - 1s 2ms/step - loss: 0.6638"
    assert run.merged == [f"{STAMP} [1] worker-0 | ".encode() + line for line in (b"Epoch 1/2", bar, b"done")]
    assert b"\x08" not in (tmp_path / "merged.log").read_bytes()
    # The line that ends the epoch is the task's epoch record (it prints no metric lines of its own).
    assert run.out.getvalue() == ("worker-0 | Epoch 1/2\nworker-0 | epoch 1/2  loss 0.664  1.00 s  2 ms/step\n"
                                  "worker-0 | done\n")
    assert [(r["task"], r["epoch"], r["loss"], r["source"]) for r in run.metrics] == [("worker-0", 1, 0.6638, "keras")]
    assert not run.pump.progress.silent(1, ["worker-0"])  # progress, for the watchdogs
    assert path.read_bytes() == KERAS_EPOCH + b"done\n"  # the task's own file is never touched


def test_pump_records_its_own_messages(tmp_path):
    run = Run(tmp_path)
    run.pump.message("worker-0 exited with code 1")
    run.close()
    assert run.merged == [f"{STAMP} [1] tflaunch | worker-0 exited with code 1".encode()]
    assert run.out.getvalue() == ""


def test_pump_thread_follows_files_as_they_grow(tmp_path):
    console, out, _ = make_console()
    pump = OutputPump(tmp_path / "merged.log", tmp_path / "metrics.jsonl", console, log_max_size=LOG_MAX_SIZE, interval=0.005).start()
    try:
        path = tmp_path / "worker-0.log"
        pump.follow("worker-0", path)
        for line in (b"first", b"second"):
            append(path, line + b"\n")
            wait_for(lambda: line in (tmp_path / "merged.log").read_bytes(), timeout=5, interval=0.005,
                     message=f"the pump to copy {line!r} into merged.log")
    finally:
        pump.close()
        console.close()
    merged = (tmp_path / "merged.log").read_bytes().decode().splitlines()
    prefix = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} \[1\] worker-0 \| "
    assert [re.fullmatch(prefix + "(.*)", line).group(1) for line in merged] == ["first", "second"]
    assert out.getvalue() == "worker-0 | first\nworker-0 | second\n"


def test_metric_lines_land_in_metrics_jsonl(tmp_path):
    run = Run(tmp_path)
    w0 = run.task_file("worker-0", attempt=2)
    chief = run.task_file("chief-0")
    append(w0, METRIC_PREFIX + b'{"step": 1, "loss": 0.5}\n')
    append(w0, b"plain line\n")
    append(chief, b'TFLAUNCH_METRIC {"step": 2, "task": "evaluator-0", "time": 12.5}\n')
    run.close()
    assert run.metrics == [
        {"step": 1, "loss": 0.5, "task": "worker-0", "attempt": 2, "time": NOW},
        {"step": 2, "task": "evaluator-0", "time": 12.5, "attempt": 1},
    ]
    assert not run.pump.progress.silent(2, ["worker-0"]) and not run.pump.progress.silent(1, ["chief-0"])
    assert run.pump.progress.silent(1, ["worker-0"]) == ["worker-0"]
    # Metric lines are task output too.
    assert f"{STAMP} [2] worker-0 | ".encode() + METRIC_PREFIX + b'{"step": 1, "loss": 0.5}' in run.merged
    assert "worker-0 | plain line\n" in run.out.getvalue()


@pytest.mark.parametrize("line", [
    b"TFLAUNCH_METRIC {not json",
    b"TFLAUNCH_METRIC ",
    b"TFLAUNCH_METRIC [1, 2]",
    b"TFLAUNCH_METRIC 3",
    b'TFLAUNCH_METRIC {"a": 1} trailing',
    b'TFLAUNCH_METRIC {"a": "\xff"}',
])
def test_malformed_metric_lines_stay_out_of_metrics(tmp_path, line):
    run = Run(tmp_path)
    append(run.task_file("worker-0"), line + b"\n" + METRIC_PREFIX + b'{"ok": true}\n')
    run.close()
    assert run.metrics == [{"ok": True, "task": "worker-0", "attempt": 1, "time": NOW}]
    assert run.merged[0] == f"{STAMP} [1] worker-0 | ".encode() + line
    assert len(run.merged) == 2


def test_console_task_filter_leaves_the_logs_whole(tmp_path):
    run = Run(tmp_path, tasks=["worker-1"])
    w0, w1 = run.task_file("worker-0"), run.task_file("worker-1")
    append(w0, b"zero\n" + METRIC_PREFIX + b'{"s": 0}\n')
    append(w1, b"one\n")
    run.close()
    assert run.out.getvalue() == "worker-1 | one\n"
    assert len(run.merged) == 3
    assert run.metrics[0]["task"] == "worker-0"


def test_quiet_console_shows_no_task_lines(tmp_path):
    run = Run(tmp_path, quiet=True)
    append(run.task_file("worker-0"), b"zero\n")
    run.close()
    assert run.out.getvalue() == ""
    assert run.merged == [f"{STAMP} [1] worker-0 | zero".encode()]


def test_no_colour_codes_when_streams_are_not_ttys(tmp_path):
    run = Run(tmp_path)
    append(run.task_file("worker-0"), b"zero\n")
    run.console.message("done")
    run.close()
    assert "\x1b" not in run.out.getvalue() and "\x1b" not in run.err.getvalue()


def test_follow_creates_a_missing_task_file(tmp_path):
    run = Run(tmp_path)
    path = run.task_file("worker-0")
    assert path.exists()
    run.close()
    assert run.merged == []


# ---------------------------------------------------------------------------------------------
# tail_lines


def write_lines(path: Path, count: int, end: bytes = b"\n") -> None:
    path.write_bytes(b"".join(f"line {i:04d}".encode() + end for i in range(count)))


def test_tail_lines_last_n(tmp_path):
    path = tmp_path / "t.log"
    write_lines(path, 30)
    assert tail_lines(path) == [f"line {i:04d}" for i in range(10, 30)]
    assert tail_lines(path, 5) == [f"line {i:04d}" for i in range(25, 30)]
    assert tail_lines(path, 1) == ["line 0029"]
    assert tail_lines(path, 100) == [f"line {i:04d}" for i in range(30)]


def test_tail_lines_of_a_big_file_reads_only_the_end_and_drops_the_cut_line(tmp_path):
    path = tmp_path / "t.log"
    write_lines(path, 5000)
    lines = tail_lines(path, 50, max_bytes=333)
    assert lines == [f"line {i:04d}" for i in range(5000 - len(lines), 5000)]
    assert 25 <= len(lines) <= 33


def test_tail_lines_includes_a_partial_last_line_and_shows_progress_as_drawn(tmp_path):
    path = tmp_path / "t.log"
    path.write_bytes(b"a\nb\r\n10%\r20%\r\xffend")
    assert tail_lines(path, 3) == ["a", "b", "\ufffdend"]


def test_tail_lines_of_missing_or_empty_file(tmp_path):
    assert tail_lines(tmp_path / "missing.log") == []
    (tmp_path / "empty.log").write_bytes(b"")
    assert tail_lines(tmp_path / "empty.log") == []


def test_tail_lines_zero(tmp_path):
    path = tmp_path / "t.log"
    write_lines(path, 3)
    assert tail_lines(path, 0) == []


# ---------------------------------------------------------------------------------------------
# ExitStatus: how a task's end is reported next to its output


@pytest.mark.parametrize("status, ok, shell_code, text", [
    (ExitStatus(code=0), True, 0, "exit code 0"),
    (ExitStatus(code=3), False, 3, "exit code 3"),
    (ExitStatus(code=255), False, 255, "exit code 255"),
    (ExitStatus(signal=9), False, 137, "killed by SIGKILL"),
    (ExitStatus(signal=15), False, 143, "killed by SIGTERM"),
    (ExitStatus(signal=2), False, 130, "killed by SIGINT"),
    (ExitStatus(signal=11), False, 139, "killed by SIGSEGV"),
])
def test_exit_status_of_a_code_or_a_signal(status, ok, shell_code, text):
    assert status.ok is ok
    assert status.shell_code == shell_code
    assert status.describe() == text


def test_exit_status_unknown_signal_number():
    status = ExitStatus(signal=99)
    assert status.describe() == "killed by signal 99"
    # a task tflaunch stopped was not killed: the signal was tflaunch's
    assert ExitStatus(signal=15).describe(stopped=True) == "SIGTERM from tflaunch"
    assert status.shell_code == 227
    assert signal_name(9) == "SIGKILL" and signal_name(99) == "signal 99"


def test_exit_status_errors():
    lost = ExitStatus(error="host node2 lost (no reply for 6s)")
    assert not lost.ok
    assert lost.shell_code == UNREACHABLE == 255
    assert lost.describe() == "host node2 lost (no reply for 6s)"
    missing = ExitStatus(error="cannot start 'pythn': no such file", error_code=CANNOT_START)
    assert not missing.ok
    assert missing.shell_code == 127
    assert missing.describe() == "cannot start 'pythn': no such file"
