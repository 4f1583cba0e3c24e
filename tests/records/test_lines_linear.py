"""Folding a line costs time in proportion to the line, whatever a task writes into it.

Each input is folded at two sizes, the second ten times the first; the CPU time of the larger must
stay far below the hundredfold that time in the square of the size would take.
"""

from __future__ import annotations

import time

import pytest

from launcher.records.lines import LineSplitter, fold_lines, fold_partial

pytestmark = pytest.mark.unit

SMALL = 5_000
GROWTH = 10  # the large input is this many times the small one
LINEAR_AT_MOST = 35  # times the small input's CPU time the large one may take (quadratic: 100)


def cpu_seconds(fold, data) -> float:
    """The least CPU time of three folds of ``data`` (the least is the one others' load touched least)."""
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        fold(data)
        best = min(best, time.process_time() - started)
    return max(best, 1e-4)


INPUTS = {
    "erase to the start": lambda n: b"a" * n + b"\x1b[1K" * n + b"x\n",
    "erase the line": lambda n: b"a" * n + b"\x1b[2K" * n + b"x\n",
    "erase to the end after a return": lambda n: b"a" * n + b"\r\x1b[K" * n + b"x\n",
    "backspaces": lambda n: b"a" * n + b"\x08" * n + b"x\n",
}


@pytest.mark.parametrize("make", INPUTS.values(), ids=INPUTS.keys())
def test_folding_a_line_is_linear_in_its_length(make):
    small, large = cpu_seconds(fold_lines, make(SMALL)), cpu_seconds(fold_lines, make(SMALL * GROWTH))
    assert large < LINEAR_AT_MOST * small, f"{SMALL:,} bytes: {small:.4f} s; {SMALL * GROWTH:,}: {large:.4f} s"


@pytest.mark.parametrize("make", [lambda n: b"\x08" * n, lambda n: b"a" * n + b"\x1b[2K" * n],
                         ids=["backspaces", "erase the line"])
def test_folding_an_unfinished_line_is_linear_in_its_length(make):
    small, large = cpu_seconds(fold_partial, make(SMALL)), cpu_seconds(fold_partial, make(SMALL * GROWTH))
    assert large < LINEAR_AT_MOST * small, f"{SMALL:,} bytes: {small:.4f} s; {SMALL * GROWTH:,}: {large:.4f} s"


def test_a_splitter_fed_a_long_unfinished_line_of_erasures_keeps_what_a_terminal_shows():
    splitter = LineSplitter()
    out = b"".join(splitter.feed_block(b"progress " + b"\x1b[2K\r" * 20_000) for _ in range(4))
    out += splitter.feed_block(b"done\n")
    assert out == b"done\n"


@pytest.mark.parametrize("line, shown", [
    (b"abcdef\x1b[1K\n", b""),  # blanked by folding: dropped
    (b"abcdef\x08\x08\x1b[1K\n", b"    ef\n"),
    (b"abcdef\x08\x08\x1b[2Kxy\n", b"    xy\n"),
    (b"abc\x1b[2Kdef\rX\n", b"X  def\n"),
])
def test_erasures_fold_as_a_terminal_draws_them(line, shown):
    assert fold_lines(line) == shown
