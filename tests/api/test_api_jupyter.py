"""The Python API in a real Jupyter kernel (ipykernel, driven through jupyter_client as a notebook
front end does): the console lines arrive in the cell's output, and Interrupt stops every task by
the shutdown protocol, leaves a final record, and raises LaunchInterrupted in the cell."""

from __future__ import annotations

import json
import queue
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import marked
from polling import wait_for

jupyter_client = pytest.importorskip("jupyter_client", reason="jupyter_client is a test dependency")
pytest.importorskip("ipykernel", reason="ipykernel is a test dependency")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def kernel(tmp_path):
    manager = jupyter_client.KernelManager(kernel_name="python3")
    manager.kernel_spec_manager.whitelist = set()
    # This interpreter's ipykernel, whatever kernels the machine has installed.
    manager.kernel_cmd = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    manager.start_kernel(cwd=str(tmp_path), env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    client = manager.client()
    client.start_channels()
    client.wait_for_ready(timeout=60)
    try:
        yield manager, client
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def execute(client, code: str, timeout: float = 120, on_started=None) -> tuple[str, dict | None]:
    """Run ``code`` in the kernel: (everything the cell printed, the error it raised or None)."""
    msg_id = client.execute(code)
    printed, error, started = [], None, False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            message = client.get_iopub_msg(timeout=1)
        except queue.Empty:
            if on_started and not started and on_started():
                started = True
            continue
        if message["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = message["msg_type"], message["content"]
        if kind == "stream":
            printed.append(content["text"])
        elif kind == "error":
            error = content
        elif kind == "status" and content["execution_state"] == "idle":
            return "".join(printed), error
        if on_started and not started and on_started():
            started = True
    raise AssertionError(f"the cell did not finish within {timeout} s; printed so far: {''.join(printed)[-2000:]}")


def test_launch_in_a_jupyter_kernel_prints_into_the_cell(kernel, tmp_path):
    _, client = kernel
    code = ("from launcher import launch\n"
            f"r = launch(local=2, command=['sh', '-c', 'echo hello from $TFLAUNCH_TASK'], log_dir={str(tmp_path / 'logs')!r})\n"
            "print('RESULT', r.exit_code, r.status.value, [t.state.value for t in r.record.tasks])")
    printed, error = execute(client, code)
    assert error is None, error
    assert "worker-0 | hello from worker-0" in printed and "worker-1 | hello from worker-1" in printed
    assert "RESULT 0 succeeded ['succeeded', 'succeeded']" in printed


def test_interrupting_the_kernel_stops_every_task_and_raises_launch_interrupted(kernel, tmp_path):
    manager, client = kernel
    marker = uuid.uuid4().hex
    logs = tmp_path / "logs"
    code = ("from launcher import launch\n"
            f"launch(local=3, command=['python3', '-c', 'import time; time.sleep(300)', {marker!r}], "
            f"log_dir={str(logs)!r})")

    def started() -> bool:
        if len(marked(marker)) == 3:
            manager.interrupt_kernel()  # what the notebook's Interrupt button does
            return True
        return False

    printed, error = execute(client, code, on_started=started)
    assert error is not None and error["ename"] == "LaunchInterrupted", (error, printed[-2000:])
    wait_for(lambda: not marked(marker), timeout=10, message="every task to be stopped")
    (run_dir,) = logs.iterdir()
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "stopped" and record["exit_code"] == 130 and record["ended_at"]
    assert {t["state"] for t in record["tasks"]} == {"stopped"}
    # The kernel lives on: the next cell runs.
    printed, error = execute(client, "print('still here')")
    assert error is None and "still here" in printed
