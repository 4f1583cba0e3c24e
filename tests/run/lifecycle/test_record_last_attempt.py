"""run.json's tasks describe the last attempt: a task moved to a spare names the spare, a task the
cluster shrank without is ``left-out``, and ``status`` and ``runs`` say what the console said.

The hosts are simulated (``TFLAUNCH_SIMULATE_HOSTS=1``: each host's real agent on this machine);
a task that fails the machine's way (a full disk) has its host left out before the restart, as a
lost host would be (test_lost_hosts.py has the same over ssh, and a host cut for good)."""

from __future__ import annotations

import re
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

# In attempt 1 the task named by argv[1] fails as a full disk makes a program fail and the others
# wait to be stopped; in attempt 2 every task reports an epoch and ends well.
FAILS_ONCE = """import os, sys, time
me, attempt = os.environ["TFLAUNCH_TASK"], os.environ["TFLAUNCH_ATTEMPT"]
print("up", me, "attempt", attempt, flush=True)
if attempt == "1":
    if me == sys.argv[1]:
        print("OSError: [Errno 28] No space left on device: '/scratch/cache'", flush=True)
        sys.exit(1)
    time.sleep(60)
print('TFLAUNCH_METRIC {"kind": "epoch", "epoch": 1, "loss": 0.5}', flush=True)
"""


def run_with_one_full_disk(tflaunch, tmp_path, workers: int, failing: str, spare: bool):
    lines = ["ssh: {connect_timeout: 3}", "worker:"] + [f"  - {{host: sim{i}}}" for i in range(1, workers + 1)]
    lines += ["spares:", f"  - {{host: sim{workers + 1}}}"] if spare else ["min_workers: 2"]
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("\n".join(lines) + "\n")
    script = tmp_path / "fails_once.py"
    script.write_text(FAILS_ONCE)
    done = tflaunch.run(str(cluster), "--max-restarts", "1", "--restart-delay", "0", "--no-check", "--",
                        sys.executable, str(script), failing, env={"TFLAUNCH_SIMULATE_HOSTS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def console_table(stderr: str) -> dict[str, tuple[str, str]]:
    """{task: (host, state)} of the closing summary's table."""
    rows = re.findall(r"^tflaunch:   (\S+-\d+)\s+(\S+)\s+(succeeded|failed|stopped)\s", stderr, re.M)
    return {task: (host, state) for task, host, state in rows}


def status_rows(tflaunch, run_dir) -> dict[str, tuple[str, str]]:
    """{task: (host, state)} of ``tflaunch status``'s table, one entry per row."""
    shown = tflaunch.run("status", str(run_dir)).stdout
    rows = re.findall(r"^(\S+-\d+)\s+(\w+)\s+(\S+)\s+(\S+)", shown, re.M)
    assert len(rows) == len({task for task, *_ in rows}), shown
    return {task: (host, state) for task, _, host, state in rows}


def test_a_task_moved_to_a_spare_is_recorded_on_the_spare(tflaunch, tmp_path):
    done = run_with_one_full_disk(tflaunch, tmp_path, 2, "worker-1", spare=True)
    assert "attempt 2 runs worker-1 on spare sim3" in done.stderr, done.stderr[-3000:]
    record = done.record
    assert [a["hosts"] for a in record["attempts"]] == [{"worker-0": "sim1", "worker-1": "sim2"},
                                                        {"worker-0": "sim1", "worker-1": "sim3"}]
    tasks = {t["name"]: t for t in record["tasks"]}
    assert {name: (t["host"], t["state"], t["attempt"]) for name, t in tasks.items()} == {
        "worker-0": ("sim1", "succeeded", 2), "worker-1": ("sim3", "succeeded", 2)}
    assert tasks["worker-1"]["address"].startswith("sim3:"), tasks["worker-1"]
    expected = {"worker-0": ("sim1", "succeeded"), "worker-1": ("sim3", "succeeded")}
    assert console_table(done.stderr) == expected, done.stderr[-2000:]
    assert status_rows(tflaunch, done.run_dir) == expected


@pytest.mark.parametrize("failing, kept, left_out", [
    ("worker-2", {"worker-0": "sim1", "worker-1": "sim2"}, ("worker-2", "sim3")),
    # worker-2 runs as worker-1 on sim3: the task left out keeps the file's name.
    ("worker-1", {"worker-0": "sim1", "worker-1": "sim3"}, ("worker-1", "sim2")),
], ids=["last", "renumbered"])
def test_a_task_the_cluster_shrank_without_is_recorded_as_left_out(tflaunch, tmp_path, failing, kept, left_out):
    done = run_with_one_full_disk(tflaunch, tmp_path, 3, failing, spare=False)
    assert f"runs without {left_out[0]} (2 training tasks, min_workers 2)" in done.stderr, done.stderr[-3000:]
    record = done.record
    assert record["attempts"][1]["hosts"] == kept
    ran = [(t["name"], t["host"], t["state"], t["attempt"]) for t in record["tasks"] if t["state"] != "left-out"]
    assert ran == [(name, host, "succeeded", 2) for name, host in kept.items()]
    dropped = [t for t in record["tasks"] if t["state"] == "left-out"]
    assert [(t["name"], t["host"], t["attempt"], t["pid"], t["env"]) for t in dropped] == [(*left_out, 2, None, {})]
    assert "pending" not in {t["state"] for t in record["tasks"]}
    assert console_table(done.stderr) == {name: (host, "succeeded") for name, host in kept.items()}
    shown = tflaunch.run("status", str(done.run_dir)).stdout
    assert re.search(rf"^{left_out[0]}\s+worker\s+{left_out[1]}\s+left-out\s", shown, re.M), shown
    for name, host in kept.items():
        assert re.search(rf"^{name}\s+worker\s+{host}\s+succeeded\s", shown, re.M), shown
    excluded = (rf"^excluded: {left_out[1]} left out of attempt 2: left out after {failing} failed the machine's "
                rf"way \(.*\); attempt 2 runs without {left_out[0]}$")
    assert len(re.findall(excluded, shown, re.M)) == 1, shown
    assert re.search(rf"^{left_out[0]}\s+worker\s+{left_out[1]}\s+left-out\s+-\s+-\s+-\s+-\s+-$", shown, re.M), shown
    report = tflaunch.run("report", str(done.run_dir)).stdout
    assert len(re.findall(excluded, report, re.M)) == 1, report
    # runs counts the tasks of the last attempt, as the console's closing line does.
    assert re.search(r"succeeded after 2 attempts in .* \(2 tasks\)", done.stderr), done.stderr[-2000:]
    (row,) = [line for line in tflaunch.run("runs").stdout.splitlines() if done.run_dir.name in line]
    assert re.search(r"\s2\s+2\s+succeeded\s", row), row
