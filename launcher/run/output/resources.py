"""CPU and memory use of a run's tasks, wherever they run, collected on a thread into ``resources.json``.

Each task's host agent samples the task's whole process tree (the task and all its descendants)
and sends the reading to tflaunch (see :mod:`launcher.agent.sampling`); this module turns
the readings into figures. CPU% is the tree's CPU time over the wall time since the previous
reading (100 = one core busy), RSS is the sum of the tree's resident sets (pages shared between
processes count once per process).

``resources.json`` in the run folder::

    {"interval": 1.0, "updated": 1795356008.9, "updated_at": "2026-11-22T14:00:08.904+00:00",
     "tasks": {"worker-0": {"pid": 29869, "samples": 17,
                            "cpu_percent_mean": 93.1, "cpu_percent_peak": 101.2,
                            "rss_mb_mean": 402.5, "rss_mb_peak": 431.0,
                            "latest": {"time": 1795356008.9, "at": "...", "pid": 29869,
                                       "processes": 1, "cpu_percent": 97.4, "rss_mb": 431.0}}}}

One sampler covers the whole run: ``tasks`` holds each task's figures over every attempt, and
``attempts`` (``{"1": {"worker-0": {...}}, "2": ...}``) the same figures attempt by attempt.

A task's first sample has no CPU figure (there is no earlier reading to measure from), so
``samples`` counts RSS readings and the CPU mean is taken over the readings that have one.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ...records.files import write_atomically
from ...records.folder import RESOURCES, iso_time
from ...transports import reading_of
from ...transports.base import Reading

_MB = 1024 * 1024
INDENTED_TASKS = 64



@dataclass
class TaskUsage:
    """Running totals for one task across its samples."""

    pid: int | None = None
    samples: int = 0
    cpu_samples: int = 0
    cpu_sum: float = 0.0
    cpu_peak: float = 0.0
    rss_sum: float = 0.0
    rss_peak: float = 0.0
    # The newest reading's figures, made into ``latest`` only when asked for (a run of thousands
    # of tasks folds readings far more often than it writes them).
    newest: tuple[float, int, int, float | None, float] | None = None
    cpu_seen: float = 0.0  # the tree's CPU seconds at the previous reading
    sampled_at: float | None = None  # time.time() of the previous reading

    def add_reading(self, pid: int, now: float, cpu_seconds: float, rss_mb: float, processes: int) -> None:
        """Fold one reading of the task's process tree (its CPU seconds so far, its RSS) in."""
        cpu_percent = None
        if self.pid != pid:
            # A new process for this task (a restart): CPU deltas start over, totals go on.
            self.pid, self.sampled_at = pid, None
        elif self.sampled_at is not None and now > self.sampled_at:
            cpu_percent = 100.0 * max(0.0, cpu_seconds - self.cpu_seen) / (now - self.sampled_at)
            self.cpu_samples += 1
            self.cpu_sum += cpu_percent
            if cpu_percent > self.cpu_peak:
                self.cpu_peak = cpu_percent
        self.samples += 1
        self.rss_sum += rss_mb
        if rss_mb > self.rss_peak:
            self.rss_peak = rss_mb
        self.cpu_seen, self.sampled_at = cpu_seconds, now
        self.newest = (now, pid, processes, cpu_percent, rss_mb)

    @property
    def latest(self) -> dict[str, Any] | None:
        """The newest reading: when, which process, how many processes, CPU% and RSS."""
        if self.newest is None:
            return None
        now, pid, processes, cpu_percent, rss_mb = self.newest
        return {"time": round(now, 3), "at": iso_time(now), "pid": pid, "processes": processes,
                "cpu_percent": None if cpu_percent is None else round(cpu_percent, 1), "rss_mb": round(rss_mb, 1)}

    def record(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "samples": self.samples,
            "cpu_percent_mean": round(self.cpu_sum / self.cpu_samples, 1) if self.cpu_samples else None,
            "cpu_percent_peak": round(self.cpu_peak, 1) if self.cpu_samples else None,
            "rss_mb_mean": round(self.rss_sum / self.samples, 1) if self.samples else None,
            "rss_mb_peak": round(self.rss_peak, 1) if self.samples else None,
            "latest": self.latest,
        }


class ResourceSampler(threading.Thread):
    """Folds the agents' readings of each live task into figures every ``interval`` seconds.

    ``live_readings`` returns ``{task_name: Reading}`` for the tasks running right now; it is
    called from this thread. ``resources.json`` is rewritten every ``write_every`` seconds when
    new readings came, and on :meth:`stop`. A run sets both intervals by its size (a pass costs
    in proportion to its tasks; see :mod:`launcher.run.lifecycle.session`). Nothing here raises into the caller: a failed
    sample or write is skipped, since resource figures must never disturb the run they describe.
    """

    def __init__(self, live_readings: Callable[[], dict[str, Reading]], run_dir: Path | str, interval: float = 1.0,
                 write_every: float = 2.0, attempt: Callable[[], int] = lambda: 1):
        super().__init__(name="tflaunch-resources", daemon=True)
        self.live_readings = live_readings
        self.attempt = attempt  # the attempt the live tasks belong to, read at each sample
        self.path = Path(run_dir) / RESOURCES
        self.interval = interval
        self.write_every = write_every
        self.usage: dict[str, TaskUsage] = {}  # over the whole run
        self.by_attempt: dict[int, dict[str, TaskUsage]] = {}
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()  # stop() may write while the thread's last write runs
        self._taken: dict[str, float] = {}  # task -> time of the last reading folded in
        self._unwritten = False  # readings folded in since the last write

    def run(self) -> None:
        last_write = time.monotonic()
        while not self._stopping.wait(self.interval):
            self.sample_once()
            if self._unwritten and time.monotonic() - last_write >= self.write_every:
                self.write()
                last_write = time.monotonic()

    def stop(self, timeout: float = 5.0) -> None:
        """End sampling and write the final figures."""
        self._stopping.set()
        try:
            if self.is_alive() and threading.current_thread() is not self:
                self.join(timeout)
        except RuntimeError:
            pass  # never started
        self.sample_once()
        self.write()

    def sample_once(self) -> None:
        """Fold in every reading that is new since the last call (also usable without the thread)."""
        try:
            readings = dict(self.live_readings())
        except Exception:
            return
        attempt = self.attempt()
        taken, usage = self._taken, self.usage
        with self._lock:
            of_attempt = self.by_attempt.get(attempt)
            for name, reading in readings.items():
                try:
                    if reading.at <= taken.get(name, 0.0):
                        continue
                    taken[name] = reading.at
                    self._unwritten = True
                    figures = (int(reading.pid or 0), reading.at, float(reading.cpu_seconds),
                               reading.rss_bytes / _MB, reading.processes)
                    whole = usage.get(name) or usage.setdefault(name, TaskUsage())
                    whole.add_reading(*figures)
                    if of_attempt is None:
                        of_attempt = self.by_attempt[attempt] = {}
                    (of_attempt.get(name) or of_attempt.setdefault(name, TaskUsage())).add_reading(*figures)
                except Exception:
                    continue  # a malformed reading is skipped, never the run

    def snapshot(self) -> dict[str, Any]:
        """The figures as written to ``resources.json``."""
        now = time.time()
        with self._lock:
            attempts = {str(k): {name: usage.record() for name, usage in tasks_of.items()}
                        for k, tasks_of in sorted(self.by_attempt.items())}
            # One attempt: the run's figures are that attempt's, folded from the same readings, so
            # made once (a write at 256 tasks took 14 ms, most of it making each task's figures).
            tasks = next(iter(attempts.values())) if len(attempts) == 1 \
                else {name: usage.record() for name, usage in self.usage.items()}
        return {"interval": self.interval, "updated": round(now, 3), "updated_at": iso_time(now), "tasks": tasks,
                "attempts": attempts}

    def write(self) -> None:
        """Replace ``resources.json`` atomically; a failed write is skipped."""
        self._unwritten = False
        try:
            snapshot = self.snapshot()
            # Indented for people up to INDENTED_TASKS tasks; a larger file is written by json's C
            # encoder (indenting is pure Python, ten times the time), as often as the run writes it.
            indent = 2 if len(snapshot["tasks"]) <= INDENTED_TASKS else None
            data = json.dumps(snapshot, indent=indent) + "\n"
            with self._write_lock:
                write_atomically(self.path, data)
        except Exception:
            pass


def measure_tasks(pids: dict[str, int], seconds: float, run_dir: Path) -> dict[str, dict[str, Any]]:
    """CPU% over ``seconds`` and RSS now of each live task of this machine in ``pids`` (``tflaunch
    status``), measured the way its agent samples it: two readings folded as a run folds them."""
    sampler = ResourceSampler(lambda: {name: reading_of(pid) for name, pid in pids.items()},
                              run_dir)  # never started or written: two readings only
    sampler.sample_once()
    time.sleep(seconds)
    sampler.sample_once()
    return {name: usage.latest for name, usage in sampler.usage.items() if usage.latest}
