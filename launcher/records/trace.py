"""tflaunch's own trace: its decisions, written to the run folder's ``debug.log`` when asked for.

Every module that decides something (the session, the supervisor, the straggler rule, each host
link) has a logger of the ``tflaunch`` hierarchy (:func:`tracer`). The trace is off unless a run
asks for it (``--debug``, ``debug=True``, or ``TFLAUNCH_DEBUG`` set to anything but empty, 0, false,
no or off: :func:`wanted`): then :class:`RunTrace` takes every record of the hierarchy for the
run's length, holding them until the run folder exists, and writes them to its ``debug.log``.

Off, the ``tflaunch`` logger has no handler and a level above every record's, so a call such as
``log.debug("attempt %d", n)`` costs one level check and formats nothing. It never reaches the
console nor a handler the program's own logging set up (it does not propagate), whatever that
program's logging says.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path

from ..options import DEBUG_VARIABLE
from .files import open_own

ROOT = "tflaunch"
_FALSE = ("", "0", "false", "no", "off")
_OFF = logging.CRITICAL + 1  # no record of the hierarchy is taken
EARLY_AT_MOST = 100_000  # records held before the run folder exists (the preflight's, at most)
FORMAT = "%(asctime)s.%(msecs)03d %(threadName)s %(name)s: %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"
LOG_MODE = 0o600  # the trace names hosts, paths and tasks: its owner's alone

_root = logging.getLogger(ROOT)
_root.propagate = False
_root.setLevel(_OFF)
_lock = threading.Lock()
_tracing: list["RunTrace"] = []  # the runs tracing now (launch() calls in threads of one program may overlap)


def tracer(name: str) -> logging.Logger:
    """The logger of one part of tflaunch: ``tracer("session")`` is ``tflaunch.session``."""
    return logging.getLogger(f"{ROOT}.{name}")


def wanted(option: bool, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether a run writes its trace: its ``debug`` option, or ``TFLAUNCH_DEBUG`` in its environment."""
    return bool(option) or environ.get(DEBUG_VARIABLE, "").strip().lower() not in _FALSE


class RunTrace(logging.Handler):
    """The trace of one run: records held from :meth:`begin` until :meth:`open` names the file,
    then written there, a line each, until :meth:`end`."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter(FORMAT, DATE_FORMAT))
        self._early: list[str] | None = []
        self._stream = None

    @classmethod
    def begin(cls) -> "RunTrace":
        trace = cls()
        with _lock:
            _tracing.append(trace)
            _root.addHandler(trace)
            _root.setLevel(logging.DEBUG)
        return trace

    def open(self, path: Path) -> None:
        """Write the trace to ``path`` from now on (made anew, never through a link), after what came before."""
        try:
            stream = open(open_own(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, LOG_MODE), "w", buffering=1)
        except OSError:
            return  # no trace rather than no run
        with self.lock:
            self._stream = stream
            for line in self._early or ():
                stream.write(line)
            self._early = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + "\n"
            if self._stream is not None:
                self._stream.write(line)  # line-buffered: what a crash leaves is whole lines
            elif self._early is not None and len(self._early) < EARLY_AT_MOST:
                self._early.append(line)
        except Exception:
            self.handleError(record)

    def handleError(self, record: logging.LogRecord) -> None:
        pass  # a full disk costs the trace, never a message on the console

    def end(self) -> None:
        """The run ended: the hierarchy goes back to off when no other run traces."""
        with _lock:
            _root.removeHandler(self)
            if self in _tracing:
                _tracing.remove(self)
            if not _tracing:
                _root.setLevel(_OFF)
        with self.lock:
            if self._stream is not None:
                try:
                    self._stream.close()
                except OSError:
                    pass
            self._stream, self._early = None, None
