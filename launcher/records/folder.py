"""Run folders: ``logs/<run-id>/`` with per-task logs, merged.log, metrics.jsonl and run.json.

Layout of one run::

    logs/20261122-140501-a3f9/
        run.json            the run record (records/record.py): cluster, tasks, commands, env, attempts, exit codes
        merged.log          every line of every task: "<time> <task> | <text>"
        metrics.jsonl       the metric records tasks printed (see output.METRIC_PREFIX)
        attempt-1/worker-0.log   each task's own stdout and stderr, byte for byte
        worker-0.log -> attempt-1/worker-0.log   (the latest attempt)
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .record import RunRecord

MANIFEST = "run.json"
MERGED = "merged.log"
METRICS = "metrics.jsonl"
RESOURCES = "resources.json"


def iso_time(when: float) -> str:
    """A local timestamp with its UTC offset, to the millisecond, as run files record times."""
    return datetime.fromtimestamp(when).astimezone().isoformat(timespec="milliseconds")


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` through a temporary file and a rename: readers never see half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def new_run_id(now: float | None = None) -> str:
    """A run id that sorts by start time and stays unique between runs started together."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return f"{stamp}-{os.urandom(2).hex()}"


class RunFolder:
    """The files of one run."""

    def __init__(self, path: Path):
        self.path = Path(path)

    @classmethod
    def create(cls, log_dir: Path, run_id: str) -> "RunFolder":
        path = Path(log_dir) / run_id
        path.mkdir(parents=True, exist_ok=False)
        return cls(path)

    @property
    def run_id(self) -> str:
        return self.path.name

    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST

    @property
    def merged_path(self) -> Path:
        return self.path / MERGED

    @property
    def metrics_path(self) -> Path:
        return self.path / METRICS

    def attempt_dir(self, attempt: int) -> Path:
        return self.path / f"attempt-{attempt}"

    def task_log(self, name: str, attempt: int) -> Path:
        return self.attempt_dir(attempt) / f"{name}.log"

    def open_task_log(self, name: str, attempt: int) -> int:
        """A write descriptor for a task's stdout and stderr; the top-level link follows it."""
        path = self.task_log(name, attempt)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        link = self.path / f"{name}.log"
        tmp = self.path / f".{name}.log.tmp"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(path.relative_to(self.path))
        tmp.replace(link)
        return fd

    def write_manifest(self, manifest: dict[str, Any], final: bool = False) -> None:
        """Replace run.json atomically: readers never see half a file.

        Live rewrites are compact (json's C encoder); the final one is indented for people.
        """
        text = json.dumps(manifest, indent=2) if final else json.dumps(manifest, separators=(",", ":"))
        write_atomically(self.manifest_path, text + "\n")

    def read_manifest(self) -> dict[str, Any]:
        return json.loads(self.manifest_path.read_text())

    def read_metrics(self) -> list[dict[str, Any]]:
        """The metric records in the order they arrived; a half-written last line is left out."""
        try:
            text = self.metrics_path.read_text(errors="replace")
        except OSError:
            return []
        records = []
        for line in text.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
        return records

    def read_resources(self) -> dict[str, dict[str, Any]]:
        """Per-task CPU and memory figures from ``resources.json``; empty when it was not sampled."""
        try:
            tasks = json.loads((self.path / RESOURCES).read_text()).get("tasks")
        except (OSError, ValueError, AttributeError):
            return {}
        return tasks if isinstance(tasks, dict) else {}

    def write_record(self, record: "RunRecord", final: bool = False) -> None:
        """Write the run's typed record as run.json (see :mod:`launcher.records.record`)."""
        self.write_manifest(record.to_json(), final=final)

    def read_record(self) -> "RunRecord":
        """The run's record; ValueError when run.json is not a run record, OSError when unreadable."""
        from .record import RunRecord

        return RunRecord.from_json(self.read_manifest())
