"""The cgroups the tests make (tests/suite.py's favoured queue, a CPU quota that holds a task to a
share of one CPU): what is in one moved back to its parent before it is removed."""

from __future__ import annotations

import os
from pathlib import Path

from polling import wait_for


def move_out(folder: Path, parent: Path) -> None:
    """Every process in the cgroup ``folder`` moved to the cgroup ``parent``; one that ended meanwhile
    is passed over."""
    for pid in (folder / "cgroup.procs").read_text().split():
        try:
            (parent / "cgroup.procs").write_text(pid)
        except OSError:
            pass  # it ended meanwhile


class CpuQuota:
    """A cgroup of its own with a CPU quota, where a test moves a process to hold it to a share of
    one CPU: cgroup v2's ``cpu.max`` or v1's cpu controller (``cpu.cfs_quota_us``)."""

    def __init__(self, share: float):
        period = 100_000
        quota = int(share * period)
        name = f"tflaunch-test-{os.getpid()}"
        v2 = Path("/sys/fs/cgroup")
        if "cpu" in (v2 / "cgroup.controllers").read_text().split() if (v2 / "cgroup.controllers").exists() else False:
            (v2 / "cgroup.subtree_control").write_text("+cpu")
            self.folder = v2 / name
            self.folder.mkdir()
            (self.folder / "cpu.max").write_text(f"{quota} {period}")
            self.root = v2
        else:
            v1 = next(p for p in (Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup/cpu,cpuacct"))
                      if (p / "cpu.cfs_quota_us").exists())
            self.folder = v1 / name
            self.folder.mkdir()
            (self.folder / "cpu.cfs_period_us").write_text(str(period))
            (self.folder / "cpu.cfs_quota_us").write_text(str(quota))
            self.root = v1

    def hold(self, pid: int) -> None:
        (self.folder / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        move_out(self.folder, self.root)
        wait_for(lambda: not (self.folder / "cgroup.procs").read_text().strip(), timeout=10,
                 message="the quota's cgroup empty")
        self.folder.rmdir()


def cpu_quotas_available() -> bool:
    if os.geteuid() != 0:
        return False
    v2 = Path("/sys/fs/cgroup/cgroup.controllers")
    return (v2.exists() and "cpu" in v2.read_text().split()) or Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").exists()
