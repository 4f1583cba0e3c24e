"""Reading a bounded log (:mod:`.boundedlog`) from anywhere: whole, its tail (raw, or its last lines
for display), or followed as it grows.

A log is in one of three shapes: one plain file (under its limit, or stitched when it was closed,
its marker lines part of the text), or a live one: the file ends with the running marker after its
head and the latest output is in ``<name>.part-<offset>`` files (a run that is still writing, or
one whose tflaunch was killed). Readers here show a live log as it will be stitched: head, a marker
saying how many bytes are missing, then every part kept. :func:`stitch` makes that the file.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import Callable

from .logformat import ALIGN, MARKER, MARKER_START, LiveLayout, final_marker, format_size, live_layout, stream
from .lines import LineSplitter

TAIL_LINES = 20  # the last lines of a task's log that go with its failure, a hang or a summary


def is_marker(line: str) -> bool:
    """Whether a decoded line is a marker line (of a file or one a reader made)."""
    return line.startswith("[... tflaunch: ") and MARKER.fullmatch(line.encode() + b"\n") is not None


def read_view(path: Path) -> bytes:
    """The log as a reader should see it: the file, or a live log's head, marker and parts."""
    layout = live_layout(path)
    if layout is None:
        try:
            return Path(path).read_bytes()
        except FileNotFoundError:
            return b""
    with open(path, "rb") as handle:
        head = os.pread(handle.fileno(), layout.head_end, 0)
    first = layout.first
    return head + (final_marker(first - layout.head_end) if first > layout.head_end else b"") + \
        stream(layout, first, layout.end)


def read_tail(path: Path, max_bytes: int) -> tuple[bytes, bool, int]:
    """(data, cut, left_out): the last ``max_bytes`` of the log's view, whether that is less than all
    of it, and how many bytes of output its markers say were left out."""
    layout = live_layout(path)
    if layout is not None:
        start = max(layout.first, layout.end - max_bytes)
        return stream(layout, start, layout.end), True, left_out(path)
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            data = os.pread(handle.fileno(), max_bytes, max(0, size - max_bytes))
    except OSError:
        return b"", False, 0
    return data, size > max_bytes, markers_total(path)


def tail_lines(path: Path, count: int = TAIL_LINES, max_bytes: int = 1 << 16,
               keep: Callable[[str], bool] | None = None) -> list[str]:
    """The last ``count`` lines of a task's log, decoded for display; with ``keep``, the last
    ``count`` of the lines it keeps (it sees every line of the tail, in order). When the log left
    output out (it outgrew its limit), a first line says how much, unless its marker is among the lines."""
    try:
        data, cut, left_out = read_tail(Path(path), max_bytes)
    except OSError:
        return []
    splitter = LineSplitter()
    lines = splitter.feed(data) + splitter.flush()
    if cut and lines:
        lines = lines[1:]  # the first one is probably cut
    if keep is None:
        shown = [line.decode("utf-8", "replace") for line in lines[-count:]] if count > 0 else []
    else:
        shown = [text for line in lines if keep(text := line.decode("utf-8", "replace"))]
        shown = shown[-count:] if count > 0 else []
    if left_out and shown and not any(line.startswith("[... tflaunch: ") for line in shown):
        # In place of the oldest line: callers ask for a number of lines to show.
        shown[:1 if len(shown) == count else 0] = [
            f"[... tflaunch: {left_out:,} bytes ({format_size(left_out)}) of this log's output left out "
            f"before these lines ...]"]
    return shown


def left_out(path: Path) -> int:
    """How many bytes of output the log left out (0 for a log that never outgrew its limit)."""
    layout = live_layout(path)
    if layout is not None:
        return layout.first - layout.head_end + markers_total(path, layout.head_end)
    return markers_total(path)


def markers_total(path: Path, within: int | None = None) -> int:
    """The bytes the marker lines of a plain file say were left out. A marker follows a head, which
    is at most a third of a stitched file, so only the first half is searched (in C, through mmap)."""
    total = 0
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size == 0:
                return 0
            with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as view:
                end = min(size, within if within is not None else size // 2 + ALIGN)
                at = view.find(MARKER_START, 0, end)
                while at >= 0:
                    match = MARKER.match(view, at) if at == 0 or view[at - 1:at] == b"\n" else None
                    if match is not None and match[2] is None:
                        total += int(match[1].replace(b",", b""))
                    at = view.find(MARKER_START, at + 1, end)
    except (OSError, ValueError):
        return total
    return total


class Follower:
    """New bytes of a log as it grows, across its changes of shape: its spill into parts (the file
    is replaced by its head and a marker), parts deleted before they were read (a marker line says
    how much), and the final stitch (the file is replaced by head, marker and tail)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.offset = 0  # in the output (a live log) or in the file (a plain one); equal until a stitch
        self._inode: int | None = None
        self._live_head: int | None = None  # the head's end, once the log was seen live
        self._line_open = False  # the last byte given out did not end a line

    def read(self) -> bytes:
        try:
            inode = os.stat(self.path).st_ino
        except FileNotFoundError:
            return b""
        layout = live_layout(self.path)
        if layout is not None:
            self._inode, self._live_head = inode, layout.head_end
            return self._give(self._read_live(layout))
        out = []
        if self._inode is not None and inode != self._inode and self.offset > 0:
            head_end = self._live_head if self._live_head is not None else self._last_marker()
            if head_end is not None:
                out.append(self._after_stitch(head_end))
        self._inode = inode
        data = b""
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except FileNotFoundError:
            pass
        self.offset += len(data)
        return self._give(b"".join(out) + data)

    def _give(self, data: bytes) -> bytes:
        if data:
            self._line_open = not data.endswith(b"\n")
        return data

    def _marker(self, count: int) -> bytes:
        """A marker line for ``count`` bytes we could not read, on a line of its own."""
        return (b"\n" if self._line_open else b"") + final_marker(count)

    def _read_live(self, layout: LiveLayout) -> bytes:
        out = []
        if self.offset < layout.head_end:
            with open(self.path, "rb") as handle:
                out.append(os.pread(handle.fileno(), layout.head_end - self.offset, self.offset))
            self.offset = layout.head_end
        if self.offset < layout.first:
            self._give(b"".join(out))
            out.append(self._marker(layout.first - self.offset))
            self.offset = layout.first
        data = stream(layout, self.offset, layout.end)
        self.offset += len(data)
        return b"".join(out) + data

    def _last_marker(self) -> int | None:
        """Where the stitch's marker is when the log spilled and was stitched between two reads:
        the last marker line before our place (earlier ones are inside the head)."""
        try:
            with open(self.path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as view:
                at = view.rfind(b"\n" + MARKER_START, 0, self.offset + len(MARKER_START) + 1)
        except (OSError, ValueError):
            return None
        return at + 1 if at >= 0 else None

    def _after_stitch(self, head_end: int) -> bytes:
        """The file was stitched while we read the live log: move our place to the stitched file."""
        if self.offset <= head_end:
            return b""
        with open(self.path, "rb") as handle:
            handle.seek(head_end)
            line = handle.readline()
        match = MARKER.fullmatch(line)
        if match is None:  # nothing was left out: the file holds the output as it is
            return b""
        skipped_to = head_end + int(match[1].replace(b",", b""))
        out = self._marker(skipped_to - self.offset) if self.offset < skipped_to else b""
        self.offset = head_end + len(line) + max(0, self.offset - skipped_to)
        return out
