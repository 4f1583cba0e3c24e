"""A Python exception found in a task's last lines: what a failure summary shows of a task that
died of one, instead of its last lines (which a long message, rows of an array, may fill).

    Traceback (most recent call last):
      File "train.py", line 30, in <module>
        model.fit(x, y)
      File ".../keras/src/trainers/data_adapters/__init__.py", line 120, in get_data_adapter
        raise ValueError(f"Unrecognized data type: x={x} (of type {type(x)})")
    ValueError: Unrecognized data type: x=[[0.1 0.2 ...
     [0.3 0.4 ...]]

becomes the traceback's header, the program's own last frame (a file outside the installed
packages) when there is one, the last frame, and the exception's first :data:`MESSAGE_LINES`
lines, with a line saying how many frames and message lines are left out.
"""

from __future__ import annotations

import re

MESSAGE_LINES = 4  # lines of the exception's message shown; the rest is counted
_HEADER = "Traceback (most recent call last):"
_FRAME = re.compile(r'  File "([^"]*)", line \d+')
_INSTALLED = re.compile(r"/(?:site|dist)-packages/|/lib/python\d[\d.]*/|^<frozen ")


def exception_lines(lines: list[str]) -> list[str] | None:
    """The last traceback of ``lines`` as a summary shows it (see the module's docstring); None
    when the lines hold no complete one (no header, no frame, or no exception line after them)."""
    start = max((i for i, line in enumerate(lines) if line.strip() == _HEADER), default=None)
    if start is None:
        return None
    frames: list[list[str]] = []
    end = None
    for index in range(start + 1, len(lines)):
        line = lines[index]
        if _FRAME.match(line):
            frames.append([line])
        elif line.startswith("  ") and frames:
            frames[-1].append(line)  # the frame's code, and the carets under it
        else:
            end = index
            break
    if end is None or not frames or not lines[end].strip():
        return None
    own = [frame for frame in frames if not _INSTALLED.search(_FRAME.match(frame[0]).group(1))]
    shown = [frame for frame in frames if frame is (own[-1] if own else None) or frame is frames[-1]]
    out = [lines[start].strip()]
    if len(shown) < len(frames):
        left = len(frames) - len(shown)
        out.append(f"  [... {left} frame{'s' if left != 1 else ''} of it not shown here ...]")
    out += [line for frame in shown for line in frame]
    message = lines[end:]
    out += message[:MESSAGE_LINES]
    if len(message) > MESSAGE_LINES:
        more = len(message) - MESSAGE_LINES
        out.append(f"[... {more} more line{'s' if more != 1 else ''} after it ...]")
    return out
