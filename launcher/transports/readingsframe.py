"""A readings frame as a host agent writes it (:func:`launcher.agent.sampling.readings`), on
tflaunch's side: checked whole where it arrives, parsed once when a reading is asked for.

A line per task, ``id rss_bytes cpu_seconds processes waited_seconds``, then for a watched task its threads'
totals, 4, 6 or 7 words (:meth:`launcher.agent.threads.ThreadWatch.totals`).
"""

from __future__ import annotations

import re
from typing import Mapping, Protocol

from .base import Reading, ThreadTimes

_INT, _DEC = rb"-?[0-9]+", rb"-?[0-9]+\.[0-9]+"
_READING = _INT + b" " + _INT + b" " + _DEC + b" " + _INT + b" " + _DEC + \
    b"(?: " + _INT + b" " + _DEC + b" " + _INT + b" " + _DEC + b"(?: " + _INT + b" " + _DEC + b"(?: " + _INT + b")?)?)?"
READINGS_TEXT = re.compile(_READING + b"(?:\n" + _READING + b")*\n?")


def well_formed(payload: bytes) -> bool:
    """Whether ``payload`` is a readings frame, line for line (one regular expression, one pass)."""
    return READINGS_TEXT.fullmatch(payload) is not None


class _Process(Protocol):
    pid: int | None  # None while its agent has not said it


def parse_readings(payload: bytes, at: float, processes: Mapping[int, _Process]) -> dict[int, Reading]:
    """{process id: its :class:`Reading`} of a frame that is :func:`well_formed`, for those of
    ``processes`` (by their id on the link) it names; ``at``: when it came."""
    found = {}
    for line in payload.split(b"\n"):
        words = line.split()
        if not words:
            continue
        ident = int(words[0])
        process = processes.get(ident)
        if process is None:
            continue
        threads = None
        if len(words) > 5:
            gpu = (int(words[9]), float(words[10])) if len(words) >= 11 else (0, 0.0)
            threads = ThreadTimes(int(words[5]), float(words[6]), int(words[7]), float(words[8]), *gpu,
                                  gpu_stale=int(words[11]) if len(words) == 12 else 0)
        found[ident] = Reading(process.pid, int(words[1]), float(words[2]), int(words[3]), at, threads,
                               float(words[4]))
    return found
