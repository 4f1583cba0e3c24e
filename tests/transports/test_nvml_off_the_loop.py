"""The agent reads its tasks' GPUs through NVML on a thread of its own (launcher/agent/gpus.py): a
hung GPU driver leaves the task's GPU readings stale while the agent's heartbeats and readings go on.

No GPU here: a stand-in NVML library, compiled from C for the test and named to the agent by
``TFLAUNCH_NVML_LIBRARY``, answers like a GPU held at half its clock by a power cap, or, once a
file exists, blocks in its clock call for good as a hung driver does (a real thread, in a real
foreign call). Real agents on real pipes, driven through tflaunch's end (test_hostagent.Host)."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from launcher.agent.gpus import NVML_DEADLINE, NVML_LIBRARY
from polling import wait_for
from launcher.transports.proxies import AgentTask
from test_hostagent import Host, ready

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")]

STAND_IN = r"""
#include <stdlib.h>
#include <unistd.h>
static void hang_if_asked(void) {
    const char *flag = getenv("STAND_IN_NVML_HANGS_WHEN");
    while (flag && access(flag, F_OK) == 0) pause();
}
int nvmlInit_v2(void) { return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned index, void **handle) { *handle = (void *)(long)(index + 1); return 0; }
int nvmlDeviceGetClockInfo(void *handle, int type, unsigned *clock) { hang_if_asked(); *clock = 900; return 0; }
int nvmlDeviceGetMaxClockInfo(void *handle, int type, unsigned *clock) { *clock = 1800; return 0; }
int nvmlDeviceGetCurrentClocksThrottleReasons(void *handle, unsigned long long *reasons) { *reasons = 0x4; return 0; }
int nvmlDeviceGetUtilizationRates(void *handle, unsigned *use) { use[0] = 100; use[1] = 40; return 0; }
"""
SLEEPER = "import time; print('ready', flush=True); time.sleep(600)"


@pytest.fixture
def stand_in(tmp_path) -> Path:
    source = tmp_path / "nvml.c"
    source.write_text(STAND_IN)
    library = tmp_path / "libnvml-stand-in.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return library


def start_watched(host: Host, name: str) -> AgentTask:
    """A task whose threads and GPU 0 the agent watches, as for the straggler rule."""
    log = host.tmp_path / f"{name}.log"
    log.touch()
    task = AgentTask(host.link, name, None, host.logs)
    task.log_file = str(log)
    host.link.start(task, {"name": name, "argv": ["python3", "-c", SLEEPER], "env": {}, "cwd": None, "grace": 2.0,
                           "output": str(log), "watch": "2.0", "gpus": "0"})
    return task


def test_a_hung_nvml_call_leaves_the_gpu_readings_stale_and_the_heartbeats_going(tmp_path, stand_in, monkeypatch):
    hangs = tmp_path / "hang"
    hangs.touch()
    monkeypatch.setenv(NVML_LIBRARY, str(stand_in))
    monkeypatch.setenv("STAND_IN_NVML_HANGS_WHEN", str(tmp_path / "never"))
    healthy = Host(tmp_path, keepalive=3)
    monkeypatch.setenv("STAND_IN_NVML_HANGS_WHEN", str(hangs))  # read by the library at each call, in its agent
    hung = Host(tmp_path, keepalive=3)
    hosts = (healthy, hung)
    try:
        tasks = [start_watched(host, f"gpu-task-{n}") for n, host in enumerate(hosts)]
        for task in tasks:
            ready(task)
        # The first census asks for a round at once; the next, 10 s on, counts its readings or, where
        # the round is still under way past NVML_DEADLINE, counts the readings stale.
        def totals(task):
            reading = task.reading()
            return reading.threads if reading is not None and reading.threads is not None else None

        wait_for(lambda: (totals(tasks[0]) and totals(tasks[0]).gpu_looks >= 1
                          and totals(tasks[1]) and totals(tasks[1]).gpu_stale >= 1), timeout=40,
                 message=lambda: f"GPU readings and stale ones: {totals(tasks[0])}, {totals(tasks[1])}")
        good, stale = totals(tasks[0]), totals(tasks[1])
        assert good.gpu_slowdown / good.gpu_looks == pytest.approx(0.5) and good.gpu_stale == 0, good
        assert stale.gpu_looks == 0 and stale.looks > 5, stale
        # The hung agent's loop goes on: its heartbeats keep its link (3 s keep-alive), its readings
        # keep coming, and its task still stops when asked.
        for _ in range(3):
            time.sleep(1.0)
            assert hung.link.lost_reason is None and time.monotonic() - hung.link.last_heard < 2.5
            assert time.time() - tasks[1].reading().at < 2.5
        assert NVML_DEADLINE < 10
        tasks[1].terminate()
        wait_for(lambda: tasks[1].poll() is not None, timeout=10, message="the task on the hung agent to stop")
    finally:
        hangs.unlink(missing_ok=True)
        for host in hosts:
            host.close()
