"""tflaunch's own trace: its decisions, written to the run folder's ``debug.log`` when asked for.

Every module that decides something (the session, the supervisor, the straggler rule, each host
link) has a logger of the ``tflaunch`` hierarchy (:func:`tracer`). The trace is off unless a run
asks for it (``--debug``, ``debug=True``, or ``TFLAUNCH_DEBUG`` set to anything but empty, 0, false,
no or off: :func:`wanted`): then :class:`RunTrace` takes the hierarchy's records of its run for the
run's length, holding them until the run folder exists, and writes them to its ``debug.log``,
kept within the run's ``--log-max-size`` as a task's log is (:mod:`.boundedlog`).

A record is the run's when it comes from the thread that runs it (the one that began the trace),
or when it names the run: an object made for a run and served from a thread every run shares (a
host link, served by the one links' thread) logs through :func:`bound`, which names it. So two
``launch()`` calls in threads of one program each trace to their own ``debug.log`` only.

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
from typing import TYPE_CHECKING

from ..options import DEBUG_VARIABLE
from .files import open_own

if TYPE_CHECKING:
    from .boundedlog import BoundedLog

ROOT = "tflaunch"
_FALSE = ("", "0", "false", "no", "off")
_OFF = logging.CRITICAL + 1  # no record of the hierarchy is taken
EARLY_AT_MOST = 100_000  # records held before the run folder exists (the preflight's, at most)
FORMAT = "%(asctime)s.%(msecs)03d %(threadName)s %(name)s: %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"
LOG_MODE = 0o600  # the trace names hosts, paths and tasks: its owner's alone
RUN_KEY = "tflaunch_run"  # the attribute by which a record names its run's trace (see bound)

_root = logging.getLogger(ROOT)
_root.propagate = False
_root.setLevel(_OFF)
_lock = threading.Lock()
_tracing: list["RunTrace"] = []  # the runs tracing now (launch() calls in threads of one program may overlap)
_threads: dict[int, "RunTrace"] = {}  # the thread that runs a traced run -> its trace


def tracer(name: str) -> logging.Logger:
    """The logger of one part of tflaunch: ``tracer("session")`` is ``tflaunch.session``."""
    return logging.getLogger(f"{ROOT}.{name}")


def run_trace() -> "RunTrace | None":
    """The trace of the run this thread runs, if that run traces."""
    return _threads.get(threading.get_ident())


def bound(logger: logging.Logger, trace: "RunTrace | None") -> logging.Logger | logging.LoggerAdapter:
    """``logger`` with its records naming ``trace``'s run (:func:`run_trace` in the run's thread), for
    an object of that run that other threads serve: they go to that run's trace only."""
    return logger if trace is None else logging.LoggerAdapter(logger, {RUN_KEY: trace})


def wanted(option: bool, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether a run writes its trace: its ``debug`` option, or ``TFLAUNCH_DEBUG`` in its environment."""
    return bool(option) or environ.get(DEBUG_VARIABLE, "").strip().lower() not in _FALSE


class RunTrace(logging.Handler):
    """The trace of one run: its records held from :meth:`begin` (in the thread that runs it) until
    :meth:`open` names the file, then written there, a line each, until :meth:`end`."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter(FORMAT, DATE_FORMAT))
        self._early: list[str] | None = []
        self._log: BoundedLog | None = None
        self._thread = threading.get_ident()

    @classmethod
    def begin(cls) -> "RunTrace":
        trace = cls()
        with _lock:
            _tracing.append(trace)
            _threads[trace._thread] = trace
            _root.addHandler(trace)
            _root.setLevel(logging.DEBUG)
        return trace

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether the record is this run's: it names the run, or comes from the run's thread."""
        return (record.__dict__.get(RUN_KEY) or _threads.get(record.thread)) is self

    def open(self, path: Path, max_size: int) -> bool:
        """Write the trace to ``path`` from now on, after what came before, within ``max_size``
        bytes (made anew, never through a link); False when it cannot be made (no trace rather
        than no run)."""
        from .boundedlog import BoundedLog  # a traced run's only: the start loads nothing it does not need

        try:
            os.close(open_own(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, LOG_MODE))
            log = BoundedLog(path, max_size, LOG_MODE)
            with self.lock:
                log.write("".join(self._early or ()).encode("utf-8", "replace"))
                self._log, self._early = log, None
        except OSError:
            return False
        return True

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + "\n"
            if self._log is not None:
                self._log.write(line.encode("utf-8", "replace"))  # whole lines: what a crash leaves is readable
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
            if _threads.get(self._thread) is self:
                del _threads[self._thread]
            if not _tracing:
                _root.setLevel(_OFF)
        with self.lock:
            if self._log is not None:
                try:
                    self._log.close()
                except OSError:
                    pass
            self._log, self._early = None, None
