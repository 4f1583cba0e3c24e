"""The cgroups the tests make (tests/suite.py's favoured queue, test_stragglers.py's CPU quota):
what is in one moved back to its parent before it is removed."""

from __future__ import annotations

from pathlib import Path


def move_out(folder: Path, parent: Path) -> None:
    """Every process in the cgroup ``folder`` moved to the cgroup ``parent``; one that ended meanwhile
    is passed over."""
    for pid in (folder / "cgroup.procs").read_text().split():
        try:
            (parent / "cgroup.procs").write_text(pid)
        except OSError:
            pass  # it ended meanwhile
