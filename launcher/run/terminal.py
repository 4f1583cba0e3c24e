"""The console's end of a stream: written straight to its file descriptor, never blocking the run's exit.

:class:`Sink` is one stream the console's writer thread writes to; a closed pipe or a hung-up
terminal silences it (and points the descriptor at /dev/null, so the interpreter's exit flush stays
quiet). :func:`wants_colour` says whether a stream gets colour.
"""

from __future__ import annotations

import os
import select
from typing import IO, Any, Mapping


def wants_colour(stream: IO[Any], environ: Mapping[str, str] = os.environ) -> bool:
    """Colour on a terminal, unless ``NO_COLOR`` is set to anything (https://no-color.org)."""
    return _isatty(stream) and not environ.get("NO_COLOR")


def _isatty(stream: IO[Any]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


class Sink:
    """One stream the writer thread writes to: straight to its file descriptor when it has one.

    Raw descriptor writes hold no lock of the stream object, so a write stuck on a stalled
    terminal cannot block the interpreter's own flush of ``sys.stdout`` at exit.
    """

    def __init__(self, stream: IO[str]):
        self.stream = stream
        self.tty = _isatty(stream)
        self.closed = False
        self.encoding = getattr(stream, "encoding", None) or "utf-8"
        self.utf8 = self.encoding.lower().replace("-", "").replace("_", "") == "utf8"
        self.fd: int | None = None
        try:
            stream.flush()
            self.fd = stream.fileno()
        except (AttributeError, OSError, ValueError):
            pass

    def write(self, data: bytes) -> None:
        """Write UTF-8 ``data`` (re-encoded when the stream wants another encoding)."""
        if self.closed or not data:
            return
        try:
            if self.fd is None:
                self.stream.write(data.decode("utf-8", "replace"))
                self.stream.flush()
                return
            if not self.utf8:
                data = data.decode("utf-8", "replace").encode(self.encoding, "replace")
            view = memoryview(data)
            while view:
                try:
                    view = view[os.write(self.fd, view):]
                except BlockingIOError:  # a descriptor someone set non-blocking: wait until it drains
                    select.select([], [self.fd], [], 1.0)
        except (OSError, ValueError):
            # Closed pipe (EPIPE), hung-up terminal (EIO), closed stream: nobody reads any more.
            self.closed = True
            self._silence()

    def _silence(self) -> None:
        """Point a closed stdout or stderr at /dev/null, so the interpreter's exit flush stays quiet."""
        if self.fd not in (1, 2):
            return
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.fd)
            os.close(devnull)
        except OSError:
            pass


def terminal_width(sink: Sink) -> int:
    try:
        return os.get_terminal_size(sink.fd).columns if sink.fd is not None else 80
    except OSError:
        return 80
