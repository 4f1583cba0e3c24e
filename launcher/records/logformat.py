"""A bounded log's format on disk (:mod:`.boundedlog` writes it, :mod:`.logview` reads it): the marker
lines that say how much output was left out, the names of its part files, a live log's layout, and
the stitch that makes a live log one file again.

A live log is the file's head ending in the running marker, with its latest output in
``<name>.part-<offset>`` files beside it; a closed one is one file, head + final marker + tail.
:func:`stitch` closes a log its writer closes; :func:`stitch_leftovers` one whose writer was killed.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from .files import create_beside
from .folder import PART_INFIX, part_of

ALIGN = 64 << 10  # how far a cut looks for a line end before it cuts inside a line
HEAD_LABEL = "head"  # .<name>.head-<random>: a spilling log's new head, renamed over it (records/files.py)
STITCH_LABEL = "stitch"  # .<name>.stitch-<random>: a log's stitched copy, renamed over it (records/files.py)
_RUNNING = "[... tflaunch: {count:>19,} bytes left out here so far; the latest output is in {name}" + PART_INFIX + \
           "* until this log is closed ...]\n"
_FINAL = "[... tflaunch: {count:,} bytes ({size}) left out here ...]\n"
MARKER = re.compile(rb"\[\.\.\. tflaunch: +([0-9,]+) bytes (?:\([^)\n]*\) )?left out here( so far)?[^\n]*\n")
MARKER_START = b"[... tflaunch: "


def format_size(size: int) -> str:
    """``1.2 GiB``, ``768.0 KiB``, ``512 bytes``: for people."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} bytes"


def final_marker(count: int) -> bytes:
    return _FINAL.format(count=count, size=format_size(count)).encode()


def running_marker(count: int, name: str) -> bytes:
    return _RUNNING.format(count=count, name=name).encode()


def part_path(path: Path, start: int) -> Path:
    return path.with_name(f"{path.name}{PART_INFIX}{start}")


@dataclass(frozen=True)
class LiveLayout:
    """A live log: the file's head (``head_end`` bytes) and its parts, (start, path, size), oldest first."""

    head_end: int
    parts: list[tuple[int, Path, int]]

    @property
    def first(self) -> int:
        """Where the output shown after the head starts: the first part kept, from a line start."""
        first = max(self.head_end, self.parts[0][0]) if self.parts else self.head_end
        return _line_start(self, first, self.end)

    @property
    def end(self) -> int:
        return max((start + size for start, _, size in self.parts), default=self.head_end)


def live_layout(path: Path) -> LiveLayout | None:
    """The layout of ``path`` when it is a live log (its last line is the running marker); else None."""
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            tail = os.pread(handle.fileno(), min(size, 512), max(0, size - 512))
    except OSError:
        return None
    line_start = tail.rfind(b"\n", 0, len(tail) - 1) + 1
    match = MARKER.fullmatch(tail, line_start)
    if match is None or match[2] is None:
        return None
    parts = []
    real = Path(os.path.realpath(path))  # the parts are beside the file, not beside a link to it
    try:
        names = os.listdir(real.parent)
    except OSError:
        names = []
    for name in names:
        part = part_of(name)
        if part is not None and part[0] == real.name:
            try:
                parts.append((part[1], real.parent / name, os.stat(real.parent / name).st_size))
            except FileNotFoundError:
                continue  # deleted by the writer just now
    return LiveLayout(size - len(tail) + line_start, sorted(parts))


def stitch(path: Path, head_end: int, parts: list[tuple[int, Path]], end: int, tail_size: int | None,
           mode: int | None = None) -> None:
    """Make ``path`` head + marker + tail (the last ``tail_size`` bytes up to ``end``, from a line
    start; all the parts hold when None) through a file (made with ``mode``) renamed over it, then
    delete the parts."""
    sized = [(start, part, os.stat(part).st_size) for start, part in sorted(parts) if part.exists()]
    layout = LiveLayout(head_end, sized)
    end = min(end, layout.end)
    first = layout.first if tail_size is None else max(layout.first, _line_start(layout, end - tail_size, end))
    fd, spare = create_beside(path, STITCH_LABEL, mode)
    with open(fd, "wb") as new, open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as old:
        copy_range(old.fileno(), 0, head_end, new.fileno())
        if first > head_end:
            new.write(final_marker(first - head_end))
        new.flush()
        for start, part, size in sized:
            low, high = max(start, first), min(start + size, end)
            if low < high:
                with open(part, "rb") as handle:
                    copy_range(handle.fileno(), low - start, high - low, new.fileno())
    os.replace(spare, path)
    for _, part, _ in sized:
        try:
            os.unlink(part)
        except FileNotFoundError:
            pass


def stitch_leftovers(path: Path, tail_size: int | None = None) -> None:
    """Stitch a live log nobody writes any more (its tflaunch was killed), keeping the last
    ``tail_size`` bytes of its parts (all of them when None), and remove the new head or stitched
    copy the killed writer had begun (its temporary files, ``.<name>.<label>-<random>``)."""
    layout = live_layout(path)
    if layout is None:
        return
    real = Path(os.path.realpath(path))
    begun = tuple(f".{real.name}.{label}-" for label in (HEAD_LABEL, STITCH_LABEL))
    try:
        names = [name for name in os.listdir(real.parent) if name.startswith(begun)]
    except OSError:
        names = []
    for name in names:
        try:
            os.unlink(real.parent / name)
        except FileNotFoundError:
            pass
    stitch(path, layout.head_end, [(start, part) for start, part, _ in layout.parts], layout.end, tail_size)


def copy_range(src: int, offset: int, count: int, dst: int) -> None:
    """Copy ``count`` bytes of ``src`` from ``offset`` to the end of ``dst``, in the kernel when it can."""
    done = 0
    while done < count:
        try:
            moved = os.copy_file_range(src, dst, count - done, offset + done)
        except OSError:  # another filesystem, or one that cannot: through memory
            moved = 0
        if moved <= 0:
            data = os.pread(src, min(count - done, 1 << 20), offset + done)
            if not data:
                return
            moved = os.write(dst, data)
        done += moved


def _line_start(layout: LiveLayout, at: int, end: int) -> int:
    """``at``, or just after the first line end within ALIGN bytes from it: a tail shows whole lines."""
    if at <= layout.head_end:
        return layout.head_end
    window = stream(layout, at, min(end, at + ALIGN))
    cut = window.find(b"\n")
    return at + cut + 1 if 0 <= cut < len(window) - 1 else at


def stream(layout: LiveLayout, start: int, end: int) -> bytes:
    """Output bytes [start, end) from the parts that hold them (gaps between parts are skipped)."""
    out = []
    for part_start, part, size in layout.parts:
        low, high = max(start, part_start), min(end, part_start + size)
        if low < high:
            try:
                with open(part, "rb") as handle:
                    out.append(os.pread(handle.fileno(), high - low, low - part_start))
            except FileNotFoundError:
                continue
    return b"".join(out)
