"""How task output becomes lines: the one rule the output pump (writing ``merged.log``) and
``tflaunch logs`` (reading a task's own file) share.

Lines end at ``\\n`` (or ``\\r\\n``). Within a line, ``\\r``, ``\\b`` and erase-line (``ESC[K``)
are applied the way a terminal draws them (:func:`fold_lines`), so a Keras ``verbose=1`` progress
bar (about 80 backspaces and a ``\\r`` per update) becomes the one line a person saw, and the
empty lines such bars leave behind are dropped. Everything else is kept byte for byte.
:class:`LineSplitter` cuts a stream of bytes into such lines, holding at most
:data:`LineSplitter.MAX_PENDING` bytes of an unfinished one.

A Keras progress bar that another writer's line was drawn after (a warning on stderr, which shares
the task's pipe, or the program's own print, written between two updates of the bar) becomes two lines, the bar's state and
that line (:func:`unglued`), where a terminal shows them glued.

Cells are code points: wide characters and colour codes inside an overwritten line are not
measured the way a terminal would, which progress bars (ASCII) never need.
"""

from __future__ import annotations

import bisect
import re

# A line (ending in \n) with a carriage return, a backspace or an erase-line sequence in it.
_CONTROL_LINE = re.compile(rb"^[^\n\r\x08]*(?:[\r\x08]|\x1b\[[012]?K)[^\n]*\n", re.MULTILINE)
_ERASE_LINE = re.compile(rb"\x1b\[[012]?K")
_TOKENS = re.compile("(\r|\x08|\x1b\\[[012]?K)")
# Colour and style codes (SGR) take no cell on a terminal; Keras 3's bar is full of them.
_SGR = re.compile("(\x1b\\[[0-9;]*m)")


def has_controls(data: bytes) -> bool:
    """Whether folding could change ``data``; single-byte searches first, as they cost next to nothing."""
    return b"\r" in data or b"\x08" in data or (b"\x1b" in data and _ERASE_LINE.search(data) is not None)


def fold_lines(block: bytes) -> bytes:
    """A block of complete lines (each ending in ``\\n``) with every line folded as a terminal shows it.

    A line whose folded text is blank is dropped when folding made it so (a bar cleared or
    redrawn); a line that was empty to begin with, or only ``\\r\\n``, stays.
    """
    if b"\r" in block and b"\r\n" in block:
        block = block.replace(b"\r\n", b"\n")  # a \r right before \n changes nothing a terminal shows
    if not has_controls(block):
        return block
    return _CONTROL_LINE.sub(_fold_match, block)


def _fold_match(match: re.Match[bytes]) -> bytes:
    line = match.group(0)[:-1]
    text = fold_text(line.decode("utf-8", "surrogateescape"))
    if not text.strip():
        return b""
    return unglued(text).encode("utf-8", "surrogateescape") + b"\n"


# A Keras progress bar as a terminal leaves it (`` 3/16 [==>...`` or Keras 3's coloured `` 3/16 ━━``),
# and where another writer's line starts: a TensorFlow log stamp (glog, or the older dated form), a
# Python traceback or warning, absl's Python logging.
_BAR_TEXT = re.compile(r"(?:\x1b\[[0-9;]*m)*\s*\d+/\d+(?:\x1b\[[0-9;]*m)* ")
_LINE_START = re.compile(r"[IWEF]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ |\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] "
                         r"|Traceback \(most recent call last\):|[\w./-]+\.py:\d+: \w*Warning: |(?:WARNING|ERROR|INFO):")


# A whole Keras progress bar state: count, bar (tf_keras's ``[==>...]``, Keras 3's coloured ``━``),
# time (``- ETA: 3s``, ``- 1s 76ms/step``, Keras 3's ``1s 87ms/step``) and ``- name: value`` metrics.
_SGR_RUN = r"(?:\x1b\[[0-9;]*m)*"
_NUMBER = r"(?:-?\d+(?:\.\d+)?(?:e[+-]?\d+)?|nan|-?inf)"
_BAR_STATE = re.compile(
    rf"{_SGR_RUN}\s*\d+/\d+{_SGR_RUN} (?:\[[=>.]*\]|(?:\x1b\[[0-9;]*m|━)+)"
    rf"(?: - ETA: [\d:]+s?| - \d+m?s(?: \d+[mu]?s/(?:step|sample))?"
    rf"| {_SGR_RUN}[\d:]+m?s?{_SGR_RUN}(?: \d+[mu]?s/(?:step|sample))?)?"
    rf"(?: - [\w.]+: {_NUMBER})*")


def unglued(text: str) -> str:
    """A Keras progress bar with another writer's text drawn after it (a warning on stderr, which
    shares the task's pipe, or the program's own print, written between two of the bar's updates)
    as two lines: the bar's state, then the text, which a terminal would show glued to the bar.

    Another writer's text is a log line's start anywhere after the bar's count, or whatever follows
    a whole bar state with no space between them (the bar's own parts are always spaced)."""
    bar = _BAR_TEXT.match(text)
    if bar is None:
        return text
    start = _LINE_START.search(text, bar.end())
    if start is not None:
        return text[:start.start()].rstrip() + "\n" + text[start.start():]
    state = _BAR_STATE.match(text)
    if state is None or state.end() == len(text) or text[state.end()].isspace():
        return text
    return text[:state.end()] + "\n" + text[state.end():]


def fold_text(line: str) -> str:
    """One line (no ``\\n``) as a terminal leaves it."""
    if "\x1b" in line and _TOKENS.search(line.replace("\r", "").replace("\x08", "")) is not None:
        return "".join(_emulate(line)[0])  # erase-line sequences: draw it cell by cell
    # Backspaces at the end of a segment only move a cursor that the next \r moves again.
    segments = [segment.rstrip("\x08") for segment in line.split("\r")]
    lengths = list(map(len, segments))
    idle = len(line) - (len(segments) - 1) - sum(lengths)
    if line.count("\x08") > idle:
        return "".join(_emulate(line)[0])  # a backspace with text after it: draw it cell by cell
    # Only carriage returns: each segment overwrites the start of what the earlier ones left.
    shown = segments[-1]
    if "\x1b" in line:
        cells = [_cells(segment) for segment in segments]
        shown_cells = cells[-1]
        for earlier, width in zip(reversed(segments[:-1]), reversed(cells[:-1])):
            if width > shown_cells:
                shown += _after_cells(earlier, shown_cells)
                shown_cells = width
    elif lengths[-1] < max(lengths):
        for earlier in reversed(segments[:-1]):
            if len(earlier) > len(shown):
                shown += earlier[len(shown):]
    return shown


def _cells(segment: str) -> int:
    """How many cells ``segment`` takes on a terminal: colour codes take none."""
    return len(segment) - sum(map(len, _SGR.findall(segment)))


def _after_cells(segment: str, skip: int) -> str:
    """``segment`` from its cell ``skip`` on, with the colour codes that apply there."""
    out, seen = [], 0
    for part in _SGR.split(segment):
        if part.startswith("\x1b"):
            out.append(part)  # a colour code before the cut still sets the colour of what follows
        elif seen + len(part) <= skip:
            seen += len(part)
        else:
            out.append(part[max(0, skip - seen):])
            seen += len(part)
    return "".join(out)


def fold_partial(data: bytes) -> bytes:
    """An unfinished line shortened to what a terminal shows, with the cursor kept where it was.

    The cursor position matters because the rest of the line is still to come: ``abc\\r`` then
    ``d`` shows ``dbc``. It is kept by re-typing the text up to the cursor after a ``\\r``.
    """
    # Backspaces right before a \r move a cursor the \r moves anyway (split, not a regex: a run
    # of backspaces with no \r after it would cost a regex time in the square of its length).
    segments = data.decode("utf-8", "surrogateescape").split("\r")
    text = "\r".join([segment.rstrip("\x08") for segment in segments[:-1]] + segments[-1:])
    cells, col = _emulate(text)
    shown = "".join(cells)
    if col < len(cells):
        shown += "\r" + shown[:col]
    return shown.encode("utf-8", "surrogateescape")


def _emulate(line: str) -> tuple[list[str], int]:
    """The cells and the cursor column after drawing ``line`` from column 0.

    In time linear in the line: an erase from the line's start (``ESC[1K``, ``ESC[2K``) is noted
    as (when, up to which column), not done cell by cell; each cell remembers when it was last
    written, and at the end a cell is blank when an erase came after that and reached past it."""
    cells: list[str] = []
    written: list[int] = []  # per cell: the number of the token that last wrote it
    erases: list[tuple[int, int]] = []  # (token number, columns erased from the start), in order
    col = 0
    for when, token in enumerate(_TOKENS.split(line)):
        if not token:
            continue
        if token == "\r":
            col = 0
        elif token == "\x08":
            col = max(0, col - 1)
        elif token.startswith("\x1b[") and token.endswith("K") and len(token) <= 4:
            mode = token[2:-1]
            if mode in ("", "0", "2"):
                del cells[col:], written[col:]  # each cell is deleted at most once per time it is written
            if mode in ("1", "2"):
                erases.append((when, min(col, len(cells))))
        else:
            if col > len(cells):
                written.extend([when] * (col - len(cells)))
                cells.extend(" " * (col - len(cells)))
            cells[col:col + len(token)] = token
            written[col:col + len(token)] = [when] * len(token)
            col += len(token)
    if erases:
        # reach[k]: the widest erase among erases[k:]; a cell written at token w is blank when an
        # erase after w reaches past it.
        reach = [0] * (len(erases) + 1)
        for k in range(len(erases) - 1, -1, -1):
            reach[k] = max(reach[k + 1], erases[k][1])
        times = [when for when, _ in erases]
        for index, when in enumerate(written):
            if reach[bisect.bisect_right(times, when)] > index:
                cells[index] = " "
    return cells, col


class LineSplitter:
    """Bytes in, complete folded lines out; what is left at the end comes out of ``flush``.

    The ``*_block`` forms return complete lines as one bytes object, each line ending in ``\n``:
    the pump works on whole blocks with C-level bytes operations instead of a Python object per
    line, which is what keeps it cheap under a flood of output. Only lines that hold a ``\r``, a
    backspace or an escape sequence are looked at one by one.
    """

    MAX_PENDING = 1 << 16  # a "line" longer than this is emitted in pieces rather than held

    def __init__(self) -> None:
        self.pending = b""

    def feed_block(self, chunk: bytes) -> bytes:
        cut = chunk.rfind(b"\n") + 1
        if cut:
            # The chunk's bytes are copied once (a flood's chunks are megabytes): joined to the
            # line the last one left unfinished, or sliced (a whole chunk is not copied at all).
            block = b"".join((self.pending, memoryview(chunk)[:cut])) if self.pending else chunk[:cut]
            rest = chunk[cut:]
        else:
            block, rest = b"", self.pending + chunk
        if len(rest) > self.MAX_PENDING:
            if has_controls(rest):
                # A bar redrawn with \r for a long time without a newline: keep only what it shows.
                rest = fold_partial(rest)
            if len(rest) > self.MAX_PENDING:
                block, rest = block + rest + b"\n", b""
        self.pending = rest
        return fold_lines(block) if block else block

    def flush_block(self) -> bytes:
        rest, self.pending = self.pending, b""
        return fold_lines(rest + b"\n") if rest else b""

    def feed(self, chunk: bytes) -> list[bytes]:
        return lines_of(self.feed_block(chunk))

    def flush(self) -> list[bytes]:
        return lines_of(self.flush_block())


def lines_of(block: bytes) -> list[bytes]:
    """The lines of a block of complete lines (each ending in ``\n``)."""
    return block[:-1].split(b"\n") if block else []
