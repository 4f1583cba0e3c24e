"""Reading console lines in tests: a label (``worker-3``, ``worker-[0-3,5]``, ``chief-0,worker-[0,1]``)
back to the task names it stands for, parsed here on its own rather than by the code under test."""

from __future__ import annotations

import re

NAME = re.compile(r"([A-Za-z_]+)-(?:(\d+)|\[([\d,-]+)\])")


def expand(label: str) -> list[str]:
    """The task names a console label stands for."""
    names, at = [], 0
    while at < len(label):
        match = NAME.match(label, at)
        assert match, f"not a task name at {label[at:]!r} in {label!r}"
        role, single, ranges = match.groups()
        if single is not None:
            names.append(f"{role}-{single}")
        else:
            for part in ranges.split(","):
                low, _, high = part.partition("-")
                names += [f"{role}-{i}" for i in range(int(low), int(high or low) + 1)]
        at = match.end()
        if at < len(label):
            assert label[at] == ",", label
            at += 1
    return names


def console_lines(text: str) -> list[tuple[list[str], str]]:
    """``label | line`` console lines as (the tasks named, the line); other lines are left out."""
    out = []
    for line in text.splitlines():
        label, sep, rest = line.partition(" | ")
        if sep and NAME.match(label.strip()):
            out.append((expand(label.strip()), rest))
    return out


def tasks_saying(text: str, said: str) -> list[str]:
    """Every task named on a console line that says ``said``, once per line that names it."""
    return [name for tasks, line in console_lines(text) if line == said for name in tasks]
