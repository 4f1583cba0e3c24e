"""tflaunch's terminal: task lines with a coloured name prefix, and tflaunch's own messages."""

from __future__ import annotations

import sys
import threading
from typing import IO, Iterable

_COLOURS = (36, 33, 32, 35, 34, 31, 96, 93, 92, 95, 94, 91)


class Console:
    """tflaunch's terminal: task lines with a name prefix, plus its own messages."""

    def __init__(self, stream: IO[str] | None = None, *, messages: IO[str] | None = None,
                 colour: bool | None = None, tasks: Iterable[str] | None = None, quiet: bool = False):
        self.stream = stream if stream is not None else sys.stdout
        self.messages = messages if messages is not None else sys.stderr
        self.colour = self.stream.isatty() if colour is None else colour
        self.message_colour = self.messages.isatty() if colour is None else colour
        self.only = set(tasks) if tasks else None
        self.quiet = quiet
        self.width = 8
        self._colour_of: dict[str, int] = {}
        self._lock = threading.Lock()

    def register(self, names: Iterable[str]) -> None:
        for name in names:
            self._colour_of.setdefault(name, _COLOURS[len(self._colour_of) % len(_COLOURS)])
            self.width = max(self.width, len(name))

    def shows(self, name: str) -> bool:
        return not self.quiet and (self.only is None or name in self.only)

    def task_block(self, name: str, block: bytes) -> None:
        """Show a block of complete lines, each with the task's label."""
        if not block:
            return
        label = name.ljust(self.width)
        if self.colour:
            label = f"\x1b[{self._colour_of.get(name, 37)}m{label}\x1b[0m"
        prefix = f"{label} | "
        text = prefix + block.decode("utf-8", "replace")[:-1].replace("\n", "\n" + prefix) + "\n"
        with self._lock:
            self.stream.write(text)
            self.stream.flush()

    def message(self, text: str) -> None:
        """One of tflaunch's own messages; shown even with --quiet."""
        prefix = "\x1b[1mtflaunch:\x1b[0m" if self.message_colour else "tflaunch:"
        with self._lock:
            self.messages.write("".join(f"{prefix} {line}\n" for line in text.splitlines() or [""]))
            self.messages.flush()
