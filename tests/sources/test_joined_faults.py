"""What goes wrong in a run of nodes that joined it (``--nnodes``), on the namespaced test hosts
with no ssh used, as the ssh tests check it: the hang culprit and its frame (in the verdict and in
``tflaunch stacks``), a straggler, a node lost without a spare (the cluster shrinks within
``--nnodes MIN:MAX``, and below MIN the run ends in one line), and a node the platform restarts
at a new address. The tasks are the stand-in worker (tests/workers/lockstep.py) or tests/helpers/task.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from conftest import LOCKSTEP, TASK
from polling import wait_for
from test_joined_nodes import Nodes, kill_tree

pytestmark = [pytest.mark.slow, pytest.mark.ssh, pytest.mark.timeout(240)]

HUNG_HERE = "# the task hangs here"  # the stand-in's line in hang_in_exchange
REJOIN_WAIT = 1.0  # --rdzv-rejoin-wait: how long a lost node is waited for before the next attempt


def line_of(marker: str, path: str = LOCKSTEP) -> int:
    return next(n for n, text in enumerate(Path(path).read_text().splitlines(), 1) if marker in text)


def lines_with(text: str, part: str) -> list[str]:
    return [line for line in text.splitlines() if part in line]


def seconds_at(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


@pytest.fixture
def nodes(testhosts, tmp_path):
    made = Nodes(testhosts, tmp_path)
    yield made
    made.stop_all()
    made.no_ssh()


def test_the_culprit_of_a_hang_across_joined_nodes_is_named_with_its_frame_and_by_stacks(nodes):
    extra = ("--hang-timeout", "10", "--env", "LOCKSTEP_HANG=worker-2=4")
    owner = nodes.start(0, "python", LOCKSTEP, "--epochs", "1000", "--step-metrics", extra=extra)
    nodes.start(1, "python", LOCKSTEP)
    nodes.start(2, "python", LOCKSTEP)
    wait_for(lambda: "STALLED" in nodes.merged() if list((nodes.tmp / "logs").glob("*/merged.log")) else False,
             timeout=90, message="worker-2 hung in the exchange")
    where = ("hang_in_exchange", "lockstep.py", line_of(HUNG_HERE))

    def named():
        shown = subprocess.run([sys.executable, "-m", "launcher", "stacks", "--log-dir", str(nodes.tmp / "logs"),
                                "--json"], capture_output=True, text=True, timeout=60, cwd=nodes.tmp, env=nodes.env)
        assert shown.returncode == 0, shown.stderr
        answer = json.loads(shown.stdout)
        return answer if answer["verdict"]["verdict"] == "culprit" else None
    answer = wait_for(named, timeout=30, interval=0.5, message="the others waiting in the exchange")
    (culprit,) = answer["verdict"]["culprits"]
    assert culprit["task"] == "worker-2"
    assert ("MainThread", *where) in {(t["thread"], t["function"], t["file"], t["line"]) for t in culprit["threads"]}
    code, out = nodes.finish(owner)
    assert code == 124, out[-3000:]
    record = nodes.record()
    assert record["attempts"][0]["blamed_tasks"] == ["worker-2"]
    root = record["root_cause"]
    assert root["task"] == "worker-2" and root["host"] == "rank-2" and root["diagnosis"]["rule"] == "hang"
    (evidence,) = root["diagnosis"]["evidence"]["culprits"]
    first = evidence["threads"][0]
    assert (first["thread"], first["function"], first["file"], first["line"]) == ("MainThread", *where), evidence
    (failed,) = lines_with(out, "failed: hang timeout")
    assert f"worker-2 differs from the rest: MainThread in {where[0]} (lockstep.py:{where[2]})" in failed, failed
    (run,) = (nodes.tmp / "logs").iterdir()
    for name in ("worker-0", "worker-1", "worker-2"):
        assert "lockstep.py" in (run / "attempt-1" / "stacks" / f"{name}.txt").read_text()
    for rank in (1, 2):
        assert nodes.finish(nodes.procs[rank])[0] == 124


@pytest.mark.favoured  # step times: its tasks, which mostly wait, must get the CPU as soon as they wake
def test_a_straggler_on_a_joined_node_is_named_once(testhosts, tmp_path):
    # worker-1's input thread sleeps 0.2 s per step, in lock step with worker-0 and worker-2: named
    # once an 8 s window of readings shows it (about 14 s in on a quiet machine), of 35 s or so.
    nodes = Nodes(testhosts, tmp_path, nnodes=3)
    try:
        extra = ("--straggler-warm-up", "2", "--straggler-window", "8", "-e", "LOCKSTEP_INPUT_SLEEP=worker-1=0.2")
        train = ("python", LOCKSTEP, "--epochs", "14", "--steps", "10", "--step-seconds", "0.1")
        owner = nodes.start(0, *train, extra=extra)
        nodes.start(1, *train)
        nodes.start(2, *train)
        code, out = nodes.finish(owner, timeout=200)
        assert code == 0, out[-3000:]
        named = lines_with(out, "straggler: worker-1 on rank-1 holds the others back")
        assert len(named) == 1 and "its threads sleep or wait for a disk" in named[0], out[-3000:]
        assert lines_with(out, "straggler: worker-0") == lines_with(out, "straggler: worker-2") == [], out[-3000:]
        (entry,) = nodes.record()["stragglers"]
        assert (entry["task"], entry["host"], entry["attempt"]) == ("worker-1", "rank-1", 1), entry
        assert nodes.finish(nodes.procs[1])[0] == nodes.finish(nodes.procs[2])[0] == 0
    finally:
        nodes.stop_all()
        nodes.no_ssh()


def test_a_node_killed_without_a_spare_shrinks_the_cluster_within_min_max_and_the_run_succeeds(nodes):
    extra = ("--nnodes", "2:3", "--max-restarts", "1", "--restart-delay", "0",
             "--rdzv-rejoin-wait", str(REJOIN_WAIT))
    owner = nodes.start(0, "python", str(TASK), "print:up", "sleep-if:worker-2:600", "sleep:4", extra=extra)
    nodes.start(1, "python", str(TASK))
    nodes.start(2, "python", str(TASK))
    nodes.wait_running()
    killed_at = time.time()
    kill_tree(nodes.procs[2].pid)  # the node dies, and no spare stands in
    code, out = nodes.finish(owner)
    assert code == 0, out[-3000:]
    (lost,) = lines_with(out, "rank-2 lost")
    assert re.fullmatch(r"tflaunch: rank-2 lost \(.+\); attempt 2 runs without worker-2 \(2 training tasks, "
                        r"min_workers 2\)", lost), lost
    record = nodes.record()
    assert [a["outcome"] for a in record["attempts"]] == ["failed", "succeeded"]
    assert record["attempts"][1]["hosts"] == {"worker-0": nodes.hosts[0].address, "worker-1": "rank-1"}
    # Found lost as its connection closed, then waited for only --rdzv-rejoin-wait: no connect timeout.
    assert seconds_at(record["attempts"][1]["started_at"]) - killed_at < REJOIN_WAIT + 4, record["attempts"]
    assert nodes.finish(nodes.procs[1])[0] == 0


def test_below_the_minimum_of_nodes_the_run_ends_in_one_line(nodes):
    extra = ("--nnodes", "3:3", "--max-restarts", "1", "--restart-delay", "0",
             "--rdzv-rejoin-wait", str(REJOIN_WAIT))
    owner = nodes.start(0, "python", str(TASK), "print:up", "forever", extra=extra)
    nodes.start(1, "python", str(TASK))
    nodes.start(2, "python", str(TASK))
    nodes.wait_running()
    killed_at = time.monotonic()
    kill_tree(nodes.procs[2].pid)
    code, out = nodes.finish(owner)
    ended = time.monotonic() - killed_at
    assert code != 0, out[-3000:]
    ending = lines_with(out, "attempt 2 cannot run")
    assert len(ending) == 1, out[-3000:]
    (ending,) = ending
    assert re.fullmatch(r"tflaunch: rank-2 lost \(.+\): attempt 2 cannot run: 2 of 3 training tasks left without "
                        r"worker-2, below min_workers 3; not restarting", ending), ending
    assert "restarting the whole cluster" not in out
    assert ended < REJOIN_WAIT + 2 + 6, ended  # the others' grace (2 s), and the slack of a loaded machine
    assert [a["outcome"] for a in nodes.record()["attempts"]] == ["failed"]
    assert nodes.finish(nodes.procs[1])[0] == code


def test_a_node_restarted_at_a_new_address_rejoins_there_at_the_next_attempt(nodes):
    extra = ("--max-restarts", "1", "--restart-delay", "0", "--rdzv-rejoin-wait", "60")
    owner = nodes.start(0, "python", str(TASK), "env", "print:up", "sleep:5", extra=extra)
    nodes.start(1, "python", str(TASK))
    nodes.start(2, "python", str(TASK))
    nodes.wait_running()
    wait_for(lambda: nodes.merged().count("| up") == 3, timeout=30, message="every task's first lines relayed")
    kill_tree(nodes.procs[2].pid)
    nodes.procs[2].wait()
    new = nodes.hosts[3].address  # the platform starts the node again elsewhere: a new pod, a new IP
    nodes.start(2, "python", str(TASK), host=3)
    code, out = nodes.finish(owner)
    assert code == 0, out[-3000:]
    record = nodes.record()
    assert [a["outcome"] for a in record["attempts"]] == ["failed", "succeeded"]
    task = next(t for t in record["tasks"] if t["name"] == "worker-2")
    assert task["host"] == "rank-2" and task["address"].rsplit(":", 1)[0] == new, task
    # Every task of attempt 2 was told the new address in its TF_CONFIG.
    told = {(int(attempt), json.loads(json.loads(env)["TF_CONFIG"])["cluster"]["worker"][2].rsplit(":", 1)[0])
            for attempt, env in re.findall(r"\[(\d)\] worker-\d \| ENV (.*)", nodes.merged())}
    assert told == {(1, nodes.hosts[2].address), (2, new)}, told
    assert len(re.findall(r"\[2\] worker-\d \| ENV ", nodes.merged())) == 3  # every task of attempt 2 was told
    code, text = nodes.finish(nodes.procs[2])
    assert code == 0, text
