"""How the resource sampler folds the agents' readings into resources.json: each reading the one
CPU total of its task's tree, CPU% from one reading to the next of the same process, and the run's
figures beside each attempt's (made once while the run has had one attempt)."""

from __future__ import annotations

import json

import pytest

from launcher.run.output.resources import ResourceSampler
from launcher.transports.base import Reading

pytestmark = pytest.mark.unit
MB = 1 << 20


def test_readings_fold_into_the_runs_figures_and_each_attempts(tmp_path):
    now: dict[str, Reading] = {}
    attempt = [1]
    sampler = ResourceSampler(lambda: dict(now), tmp_path, attempt=lambda: attempt[0])

    def read(**readings: tuple[int, float, int, float]) -> None:
        now.clear()
        now.update({name: Reading(pid, rss * MB, cpu, 1, at) for name, (pid, cpu, rss, at) in readings.items()})
        sampler.sample_once()

    read(a=(10, 1.0, 100, 1000.0), b=(20, 0.0, 50, 1000.0))
    read(a=(10, 2.0, 300, 1002.0), b=(20, 2.0, 50, 1002.0))  # a: 50 % of a core, b: 100 %
    read(a=(10, 2.0, 300, 1002.0), b=(20, 3.0, 50, 1004.0))  # a's reading is not new: not folded again
    sampler.write()
    written = json.loads((tmp_path / "resources.json").read_text())
    assert written["tasks"] == written["attempts"]["1"]
    a, b = written["tasks"]["a"], written["tasks"]["b"]
    assert (a["samples"], a["cpu_percent_mean"], a["cpu_percent_peak"], a["rss_mb_mean"], a["rss_mb_peak"]) == \
        (2, 50.0, 50.0, 200.0, 300.0)
    assert (b["samples"], b["cpu_percent_mean"], b["cpu_percent_peak"]) == (3, 75.0, 100.0)
    assert a["latest"]["pid"] == 10 and a["latest"]["cpu_percent"] == 50.0 and a["latest"]["time"] == 1002.0

    attempt[0] = 2  # a restarted: a new process, whose first reading has no CPU figure; totals go on
    read(a=(11, 0.5, 100, 1010.0))
    read(a=(11, 4.5, 100, 1012.0))  # 200 %
    sampler.write()
    written = json.loads((tmp_path / "resources.json").read_text())
    run, first, second = written["tasks"]["a"], written["attempts"]["1"]["a"], written["attempts"]["2"]["a"]
    assert (run["samples"], run["cpu_percent_mean"], run["cpu_percent_peak"]) == (4, 125.0, 200.0)
    assert (first["samples"], first["cpu_percent_mean"]) == (2, 50.0)
    assert (second["samples"], second["cpu_percent_mean"], second["latest"]["pid"]) == (2, 200.0, 11)
    assert set(written["attempts"]["2"]) == {"a"}
