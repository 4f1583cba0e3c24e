"""Task text as a terminal shows it: carriage returns and backspaces applied, TensorFlow's chatter recognised.

Two pure pieces of the output path:

- :func:`fold_lines` applies ``\\r``, ``\\b`` and erase-line (``ESC[K``) within each line the way a
  terminal draws them, so a Keras ``verbose=1`` progress bar (about 80 backspaces and a ``\\r``
  per update) becomes the one line a person saw, and the empty lines such bars leave behind are
  dropped. ``merged.log`` and the console get folded lines; each task's own file keeps its bytes.
- :class:`Chatter` recognises what TensorFlow's C++ runtime prints at start-up on every task
  (INFO lines, the oneDNN notice, the absl pre-init warning, "no cuda drivers" and the cuInit
  error that follows it on a CPU-only machine). The console hides these unless ``--verbose``.
  :func:`twin_key` says which lines of different tasks are the same line for the console's
  folding (:mod:`.twins`): the same bytes, but for the stamp of a TensorFlow log line.

Cells are code points: wide characters and colour codes inside an overwritten line are not
measured the way a terminal would, which progress bars (ASCII) never need.
"""

from __future__ import annotations

import re

# -- folding -------------------------------------------------------------------------------------

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
    return text.encode("utf-8", "surrogateescape") + b"\n"


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
    text = re.sub("\x08+(?=\r)", "", data.decode("utf-8", "surrogateescape"))
    cells, col = _emulate(text)
    shown = "".join(cells)
    if col < len(cells):
        shown += "\r" + shown[:col]
    return shown.encode("utf-8", "surrogateescape")


def _emulate(line: str) -> tuple[list[str], int]:
    """The cells and the cursor column after drawing ``line`` from column 0."""
    cells: list[str] = []
    col = 0
    for token in _TOKENS.split(line):
        if not token:
            continue
        if token == "\r":
            col = 0
        elif token == "\x08":
            col = max(0, col - 1)
        elif token.startswith("\x1b[") and token.endswith("K") and len(token) <= 4:
            mode = token[2:-1]
            if mode in ("", "0"):
                del cells[col:]
            elif mode == "1":
                cells[:col] = " " * min(col, len(cells))
            else:
                cells = [" "] * min(col, len(cells))
        else:
            if col > len(cells):
                cells.extend(" " * (col - len(cells)))
            cells[col:col + len(token)] = token
            col += len(token)
    return cells, col


# -- TensorFlow's chatter ------------------------------------------------------------------------

# glog-style lines from TensorFlow's C++ runtime (absl logging):
#   I0000 00:00:1795426522.929680    8464 port.cc:153] oneDNN custom operations are on...
# and the older format:
#   2024-01-01 12:00:00.123456: I tensorflow/core/platform/cpu_feature_guard.cc:182] This TensorFlow...
# The stamp is what differs between tasks that log the same message: the time and the thread id
# (glog), or the date and time (the older format). The level letter and the source stay.
_GLOG_STAMP = r"\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ "
_OLD_STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: "
_SOURCE = r"([\w./-]+):\d+\] "
_NATIVE = re.compile(rf"^(?:([IWEF]){_GLOG_STAMP}{_SOURCE}|{_OLD_STAMP}([IWEF]) {_SOURCE})")
_STAMPED = re.compile(rf"^(?:([IWEF]){_GLOG_STAMP}(?={_SOURCE})|{_OLD_STAMP}(?=[IWEF] {_SOURCE}))".encode())
_MAYBE_STAMPED = re.compile(rb"^(?:[IWEF]\d{4} |\d{4}-\d\d-\d\d )", re.MULTILINE)
_SOURCE_LINE = re.compile(rb"\.(?:cc|h):\d+\] ")
_ABSL_PREINIT = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
_NO_DRIVER = "Could not find cuda drivers on your machine, GPU will not be used."
_CUINIT = "failed call to cuInit"
# Warnings TensorFlow prints for every run of an ordinary program, whatever the program does.
_ROUTINE_WARNINGS = (
    "will not be optimized because the dataset does not implement the AsGraphDefInternal()",
    "TF-TRT Warning: Could not find TensorRT",
    "Unable to register cuDNN factory",
    "Unable to register cuFFT factory",
    "Unable to register cuBLAS factory",
    "computation placer already registered",
)


def may_hold_chatter(block: bytes) -> bool:
    """A cheap test over a whole block before any of its lines is looked at one by one."""
    return _SOURCE_LINE.search(block) is not None or _ABSL_PREINIT.encode() in block


def may_be_stamped(block: bytes) -> bool:
    """Whether any line of ``block`` may start with a log stamp (see :func:`twin_key`); cheap."""
    return _MAYBE_STAMPED.search(block) is not None


def twin_key(line: bytes) -> bytes | tuple[bytes, bytes]:
    """What two tasks' lines must share to be printed once for both.

    The line itself, except for a TensorFlow C++ or absl log line: its time and thread id (or
    date and time) are left out, since they differ on every task that logs the same message;
    the level and the source file and line stay. The two kinds of key never compare equal.
    """
    match = _STAMPED.match(line)
    if match is None:
        return line
    return (match.group(1) or b""), line[match.end():]


class Chatter:
    """Which lines of a task are TensorFlow's routine start-up output rather than the program's.

    Hidden: every INFO line of the C++ runtime, the absl pre-init warning, the routine warnings
    above, and the cuInit error, but only after the same task said it found no cuda driver (then
    the error only repeats that there is no GPU). Every other warning or error stays.
    """

    def __init__(self) -> None:
        self._no_driver: set[str] = set()

    def hides(self, task: str, line: str) -> bool:
        if line.startswith(_ABSL_PREINIT):
            return True
        match = _NATIVE.match(line)
        if match is None:
            return False
        level = match.group(1) or match.group(3)
        text = line[match.end():]
        if level == "I":
            if text.startswith(_NO_DRIVER):
                self._no_driver.add(task)
            return True
        if level == "E" and text.startswith(_CUINIT):
            return task in self._no_driver
        if level in ("W", "E"):
            return any(routine in text for routine in _ROUTINE_WARNINGS)
        return False
