"""How often an agent looks at a watched task's threads: as often as the task's ``watch`` field
asks (the run's ``--straggler-window`` over ten, launcher/run/faults/stragglers.py), so a shorter
window gets its looks, and a task not watched gets none. Real agents on real pipes, driven through
tflaunch's end (test_hostagent.Host)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from launcher.run.faults.stragglers import LOOKS_PER_WINDOW, look_every
from launcher.transports.proxies import AgentTask
from launcher.transports.shipping import watch_fields
from test_hostagent import Host, ready

SLEEPER = "import time; print('ready', flush=True); time.sleep(600)"


def start(host: Host, name: str, fields: dict) -> AgentTask:
    log = host.tmp_path / f"{name}.log"
    log.touch()
    task = AgentTask(host.link, name, None, host.logs)
    task.log_file = str(log)
    host.link.start(task, {"name": name, "argv": ["python3", "-c", SLEEPER], "env": {}, "cwd": None, "grace": 2.0,
                           "output": str(log), **fields})
    return task


@pytest.mark.unit
def test_a_window_gives_its_looks_and_a_task_not_watched_sends_none():
    assert look_every(20.0) == 20.0 / LOOKS_PER_WINDOW == 2.0
    # What the transports send of a planned task (its gpus and watch_every), for the agent.
    assert watch_fields(SimpleNamespace(gpus=(0, 1), watch_every=0.5)) == {"watch": "0.5", "gpus": "0,1"}
    assert watch_fields(SimpleNamespace(gpus=(), watch_every=0.5)) == {"watch": "0.5", "gpus": None}
    assert watch_fields(SimpleNamespace(gpus=(0, 1), watch_every=None)) == {"watch": None, "gpus": None}


@pytest.mark.slow
def test_an_agent_looks_as_often_as_its_tasks_window_asks(tmp_path):
    often, seldom = Host(tmp_path), Host(tmp_path)
    try:
        tasks = [start(often, "often", watch_fields_for(0.25)), start(seldom, "seldom", watch_fields_for(2.0)),
                 start(seldom, "unwatched", watch_fields_for(None))]
        for task in tasks:
            ready(task)
        begun = {task.name: looks(task) for task in tasks[:2]}
        time.sleep(6.0)
        counted = {task.name: looks(task) - begun[task.name] for task in tasks[:2]}
        # 24 looks at a quarter of a second on average (drawn between half and one and a half of
        # it), 3 at 2 s: the one far more than the other, whatever the machine's load.
        assert counted["often"] >= 12 and counted["often"] >= 3 * max(counted["seldom"], 1), counted
        assert 1 <= counted["seldom"] <= 6, counted
        reading = tasks[2].reading()
        assert reading is not None and reading.threads is None  # a task not watched has no thread totals
    finally:
        for host in (often, seldom):
            host.close()


def watch_fields_for(every: float | None) -> dict:
    return {"watch": None if every is None else repr(every)}


def looks(task: AgentTask) -> int:
    reading = task.reading()
    return reading.threads.looks if reading is not None and reading.threads is not None else 0
