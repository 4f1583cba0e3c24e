"""A run that outlives its machines, on real namespaced hosts over ssh: a host cut for good is left
out, a spare stands in, the cluster shrinks to min_workers (and not below), a host back after its
cooldown rejoins, a host whose task fails the machine's way or is the culprit twice is left out,
a straggler's host is left out with --on-straggler exclude, and a spare the preflight refuses is
never used."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from conftest import LOCKSTEP
from polling import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.ssh, pytest.mark.timeout(400)]

# Each task says where it runs, then waits: for gates/release-<attempt> (it ends well), or for
# gates/fail-<attempt> (worker-0 fails). A task on the host named by BAD_HOST fails at once the
# way a full disk makes a program fail; every task fails on the host named by FLAKY_HOST.
GATED = r'''
import os, socket, sys, time
gates, attempt, me = sys.argv[1], os.environ["TFLAUNCH_ATTEMPT"], os.environ["TFLAUNCH_TASK"]
host = socket.gethostname()
print(f"up {me} on {host} attempt {attempt} world {os.environ['TFLAUNCH_WORLD_SIZE']}", flush=True)
if host == os.environ.get("BAD_HOST"):
    raise OSError(28, "No space left on device", "/scratch/cache")
if host == os.environ.get("FLAKY_HOST"):
    raise RuntimeError("something went wrong on this host")
while True:
    if os.path.exists(os.path.join(gates, f"release-{attempt}")):
        sys.exit(0)
    if me == "worker-0" and os.path.exists(os.path.join(gates, f"fail-{attempt}")):
        sys.exit(3)
    time.sleep(0.1)
'''
# The stand-in worker in lock step: twenty epochs of about half a second, room for a cut after the second.
TRAIN = ("python", LOCKSTEP, "--epochs", "20", "--steps", "10", "--step-seconds", "0.05", "--batch-per-worker", "32")


def cluster_file(tmp_path: Path, testhosts, workers: list[str], spares: list[str] = (), extra: str = "",
                 keepalive: float = 3) -> Path:
    """Workers (and spare slots, on ports their hosts' agents pick) on the named test hosts, reached
    through their ssh config."""
    def entry(name: str, port: str) -> str:
        return f"  - {{host: {name}, address: {testhosts.host(name).address}{port}}}\n"

    text = (f"ssh:\n  options: {json.dumps(testhosts.ssh_options)}\n  connect_timeout: 3\n"
            f"  keepalive_timeout: {keepalive}\n"
            "worker:\n" + "".join(entry(n, f", port: {testhosts.port()}") for n in workers)
            + ("spares:\n" + "".join(entry(n, "") for n in spares) if spares else "") + extra)
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return path


def gated(tmp_path: Path) -> tuple[Path, list[str]]:
    gates = tmp_path / "gates"
    gates.mkdir()
    script = tmp_path / "gated.py"
    script.write_text(GATED)
    return gates, ["python", str(script), str(gates)]


def up_lines(tflaunch, attempt: int) -> dict[str, str]:
    """{task: host} of the tasks that said they are up in ``attempt``."""
    found = re.findall(r"\| up (\S+) on (\S+) attempt (\d+)", tflaunch.merged_text())
    return {task: host for task, host, number in found if int(number) == attempt}


def lines_with(text: str, part: str) -> list[str]:
    return [line for line in text.splitlines() if part in line]


def record_of(tflaunch) -> dict:
    return json.loads((tflaunch.latest_run() / "run.json").read_text())


def left_on(testhosts, names) -> dict[str, list[int]]:
    """The processes other than sshd's on each named host, a few seconds after the run."""
    deadline = time.monotonic() + 8
    while True:
        left = {}
        for name in names:
            pids = []
            for pid in testhosts.pids(name):
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if cmdline and not cmdline.startswith(b"sshd"):
                    pids.append(pid)
            left[name] = pids
        if not any(left.values()) or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def test_a_spare_stands_in_for_a_lost_host_and_the_host_rejoins_after_its_cooldown(tflaunch, testhosts, tmp_path):
    gates, task = gated(tmp_path)
    cluster = cluster_file(tmp_path, testhosts, ["node1", "node2"], spares=["node3"], extra="cooldown: 1\n")
    proc = tflaunch.start(str(cluster), "--max-restarts", "3", "--restart-delay", "0", "--", *task)
    try:
        wait_for(lambda: len(up_lines(tflaunch, 1)) == 2 or proc.poll() is not None, timeout=60, message="attempt 1 up")
        testhosts.cut("node2")
        try:
            wait_for(lambda: len(up_lines(tflaunch, 2)) == 2 or proc.poll() is not None, timeout=60,
                     message="attempt 2 up on the spare")
        finally:
            testhosts.restore("node2")
        assert up_lines(tflaunch, 2) == {"worker-0": "node1", "worker-1": "node3"}
        time.sleep(1.5)  # node2's cooldown passes
        (gates / "fail-2").touch()  # attempt 2 fails: the restart checks the hosts again
        wait_for(lambda: len(up_lines(tflaunch, 3)) == 2 or proc.poll() is not None, timeout=60,
                 message="attempt 3 up")
        (gates / "release-3").touch()
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    assert up_lines(tflaunch, 3) == {"worker-0": "node1", "worker-1": "node2"}  # back on its own host
    lost = lines_with(err, "node2 lost")
    assert len(lost) == 1 and re.fullmatch(r"tflaunch: node2 lost \(.+\); attempt 2 runs worker-1 on spare node3",
                                           lost[0]), err
    assert lines_with(err, "node2 answers again") == [
        "tflaunch: node2 answers again after its 1 s cooldown: attempt 3 runs worker-1 on it again"], err
    record = record_of(tflaunch)
    assert [a["hosts"] for a in record["attempts"]] == [{"worker-0": "node1", "worker-1": "node2"},
                                                        {"worker-0": "node1", "worker-1": "node3"},
                                                        {"worker-0": "node1", "worker-1": "node2"}]
    assert [(e["host"], e["attempt"], e["rejoined"]) for e in record["excluded"]] == [("node2", 2, 3)]
    shown = tflaunch.run("status", str(tflaunch.latest_run())).stdout
    assert "excluded: node2 left out of attempt 2: lost (" in shown and "(rejoined at attempt 3)" in shown, shown
    assert left_on(testhosts, ["node1", "node2", "node3"]) == {"node1": [], "node2": [], "node3": []}


def test_below_min_workers_the_run_ends_at_once_in_one_line(tflaunch, testhosts, tmp_path):
    gates, task = gated(tmp_path)
    cluster = cluster_file(tmp_path, testhosts, ["node1", "node2"], extra="min_workers: 2\n")
    proc = tflaunch.start(str(cluster), "--max-restarts", "3", "--restart-delay", "0", "--", *task)
    try:
        wait_for(lambda: len(up_lines(tflaunch, 1)) == 2 or proc.poll() is not None, timeout=60, message="up")
        testhosts.cut("node2")
        cut_at = time.monotonic()
        try:
            _, err = proc.communicate(timeout=60)
            ended = time.monotonic() - cut_at
        finally:
            testhosts.restore("node2")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 255, err[-3000:]
    ending = lines_with(err, "attempt 2 cannot run")
    assert len(ending) == 1 and re.fullmatch(
        r"tflaunch: node2 lost \(.+\): attempt 2 cannot run: 1 of 2 training tasks left without worker-1, "
        r"below min_workers 2; not restarting", ending[0]), err
    assert "restarting the whole cluster" not in err
    # The keep-alive timeout (3 s), then the check's connect timeout (3 s) and its slack (5 s).
    assert ended < 3 + 2 + 8 + 6, ended
    assert [a["outcome"] for a in record_of(tflaunch)["attempts"]] == ["failed"]
    assert left_on(testhosts, ["node1", "node2"]) == {"node1": [], "node2": []}


@pytest.mark.parametrize("fault, hosts, line", [
    ("BAD_HOST", ["node2", "node3"], "node2 left out after worker-1 failed the machine's way (disk-full: a write failed: "
                                     "no space left on device on the task's host); attempt 2 runs worker-1 on spare node3"),
    ("FLAKY_HOST", ["node2", "node2", "node3"],
     "node2 named as the culprit of two failures in a row; attempt 3 runs worker-1 on spare node3"),
], ids=["machine-fault", "culprit-twice"])
def test_a_host_that_fails_the_machines_way_or_is_the_culprit_twice_is_left_out_for_a_spare(
        tflaunch, testhosts, tmp_path, fault, hosts, line):
    gates, task = gated(tmp_path)
    (gates / f"release-{len(hosts)}").touch()
    cluster = cluster_file(tmp_path, testhosts, ["node1", "node2"], spares=["node3"])
    done = tflaunch.run(str(cluster), "--max-restarts", "3", "--restart-delay", "0", "--env", f"{fault}=node2",
                        "--", *task, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [a["hosts"]["worker-1"] for a in done.record["attempts"]] == hosts
    # run.json's tasks are the last attempt's, where they ran.
    assert [(t["name"], t["host"], t["state"]) for t in done.record["tasks"]] == [
        ("worker-0", "node1", "succeeded"), ("worker-1", "node3", "succeeded")]
    assert lines_with(done.stderr, "; attempt ") == [f"tflaunch: {line}"], done.stderr
    assert [e["host"] for e in done.record["excluded"]] == ["node2"]


@pytest.mark.parametrize("fault", ["no-python", "other-tensorflow"])
def test_a_spare_the_preflight_refuses_is_not_used_and_the_run_goes_on(tflaunch, testhosts, tmp_path, fault):
    from importlib import metadata

    gates, task = gated(tmp_path)
    (gates / "release-1").touch()
    cluster = cluster_file(tmp_path, testhosts, ["node1"], spares=["node2"])
    if fault == "no-python":  # the spare's interpreter is not there: its agent cannot start
        setting, expected = "python: /no/python", "/no/python"
    else:  # the spare's Python finds another TensorFlow first
        shadow = tmp_path / "shadow" / "tensorflow-2.0.0.dist-info"
        shadow.mkdir(parents=True)
        (shadow / "METADATA").write_text("Metadata-Version: 2.1\nName: tensorflow\nVersion: 2.0.0\n")
        setting = f"env: {{PYTHONPATH: {shadow.parent}}}"
        expected = f"node2 differs from the run's hosts: tensorflow 2.0.0 (others {metadata.version('tensorflow')})"
    cluster.write_text(cluster.read_text().replace("spares:\n  - {host: node2,", f"spares:\n  - {{{setting}, host: node2,"))
    done = tflaunch.run(str(cluster), "--", *task, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    refused = lines_with(done.stderr, "spare node2 not used")
    assert len(refused) == 1 and refused[0].startswith("tflaunch: preflight: spare node2 not used: ") \
        and expected in refused[0], done.stderr
    assert [(e["host"], e["attempt"]) for e in done.record["excluded"]] == [("node2", 1)]


@pytest.mark.parametrize("spare", [True, False], ids=["spare", "shrink"])
def test_a_host_cut_for_good_in_training_is_replaced_or_the_cluster_shrinks_with_the_same_global_batch(
        tflaunch, testhosts, tmp_path, spare):
    cluster = cluster_file(tmp_path, testhosts, ["node1", "node2", "node3"], spares=["node4"] if spare else [],
                           extra="" if spare else "min_workers: 2\n")
    proc = tflaunch.start(str(cluster), "--max-restarts", "2", "--restart-delay", "0", "--", *TRAIN)
    try:
        run_dir = wait_for(tflaunch.latest_run, timeout=60, message="the run folder")

        def epochs(attempt: int | None = None) -> list[dict]:
            path = run_dir / "metrics.jsonl"
            found = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
            return [r for r in found if r.get("kind") == "epoch" and r.get("task") == "worker-0"
                    and (attempt is None or r.get("attempt") == attempt)]

        wait_for(lambda: len(epochs()) >= 2 or proc.poll() is not None, timeout=400, message="epoch 2")
        assert proc.poll() is None, "the run ended before the cut"
        testhosts.cut("node3")
        try:
            _, err = proc.communicate(timeout=600)
        finally:
            testhosts.restore("node3")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    change = "runs worker-2 on spare node4" if spare else "runs without worker-2 (2 training tasks, min_workers 2)"
    lost = lines_with(err, "node3 lost")
    assert len(lost) == 1 and lost[0].endswith(f"; attempt 2 {change}"), err
    record = json.loads((run_dir / "run.json").read_text())
    assert [a["outcome"] for a in record["attempts"]] == ["failed", "succeeded"]
    second = record["attempts"][1]["hosts"]
    assert second == ({"worker-0": "node1", "worker-1": "node2", "worker-2": "node4"} if spare
                      else {"worker-0": "node1", "worker-1": "node2"})
    # run.json's tasks are the last attempt's, where they ran, then worker-2 left out when it shrank.
    assert [(t["name"], t["host"], t["state"]) for t in record["tasks"]] == [
        ("worker-0", "node1", "succeeded"), ("worker-1", "node2", "succeeded"),
        ("worker-2", "node4" if spare else "node3", "succeeded" if spare else "left-out")]
    resumed = [r for r in epochs() if r["epoch"] > 0 and r.get("global_batch")]
    # Every epoch of both attempts has the global batch of the first: 3 workers x 32.
    assert {r["global_batch"] for r in resumed} == {96}, resumed
    text = (run_dir / "worker-0.log").read_text()  # the last attempt's (earlier ones move to attempt-N/)
    assert "resuming from backup at epoch" in text, text[-3000:]
    if not spare:
        assert "this attempt has 2: resuming at the start of epoch" in text, text[-3000:]
        assert {r["replicas"] for r in resumed if r.get("attempt") == 2} == {2}
    assert left_on(testhosts, ["node1", "node2", "node3", "node4"]) == {n: [] for n in ("node1", "node2", "node3", "node4")}


@pytest.mark.favoured  # step times: its tasks, which mostly wait, must get the CPU as soon as they wake
def test_a_straggler_host_is_named_over_ssh_and_left_out_for_a_spare(tflaunch, testhosts, tmp_path):
    # Every task on node2 has an input thread that sleeps 0.2 s per step: a slow machine, for good.
    # The stand-in steps in lock step, so node2 holds its peer back at every step's exchange. 24
    # epochs of 10 steps, an 8 s window: attempt 1 runs about 0.3 s a step until node2 is left out
    # (named about 14 s in, left out 4 s later); attempt 2, on the spare, resumes from the backup
    # and runs longer than its warm-up and a whole window.
    cluster = cluster_file(tmp_path, testhosts, ["node1", "node2"], spares=["node3"])
    proc = tflaunch.start(str(cluster), "--on-straggler", "exclude", "--straggler-timeout", "4",
                          "--straggler-warm-up", "2", "--straggler-window", "8", "--max-restarts", "1",
                          "--restart-delay", "0", "-e", "LOCKSTEP_INPUT_SLEEP=node2=0.2", "--",
                          *TRAIN[:3], "24", "--steps", "10", "--step-seconds", "0.1", "--batch-per-worker", "32")
    try:
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    named = lines_with(err, "straggler: worker-1 on node2 holds the others back")
    assert len(named) == 1 and "its threads sleep or wait for a disk" in named[0], err[-3000:]
    assert lines_with(err, "node2 left out as the straggler") == [
        "tflaunch: node2 left out as the straggler (the others kept waiting for it for 4 s or more); attempt 2 "
        "runs worker-1 on spare node3"], err[-3000:]
    record = record_of(tflaunch)
    assert [a["outcome"] for a in record["attempts"]] == ["failed", "succeeded"]
    assert record["attempts"][1]["hosts"] == {"worker-0": "node1", "worker-1": "node3"}
    first = [s for s in record["stragglers"] if s["attempt"] == 1]
    assert [(s["task"], s["host"]) for s in first] == [("worker-1", "node2")]
    assert first[0]["until"] is not None and first[0]["share"] >= 0.2
    # On the spare, the cluster is balanced again: no one is named in attempt 2, which ran longer
    # than its warm-up and a whole window.
    attempt_2 = record["attempts"][1]
    from datetime import datetime
    took = datetime.fromisoformat(attempt_2["ended_at"]) - datetime.fromisoformat(attempt_2["started_at"])
    assert took.total_seconds() > 2 + 8, attempt_2  # the warm-up and the 8 s window
    assert "resuming from backup at epoch" in (tflaunch.latest_run() / "worker-0.log").read_text()
    assert [s for s in record["stragglers"] if s["attempt"] == 2] == [], record["stragglers"]
    assert lines_with(err, "straggler: worker-1 on node3") == lines_with(err, "straggler: worker-0") == [], err[-3000:]
    assert [(e["host"], e["attempt"]) for e in record["excluded"]] == [("node2", 2)]
    assert left_on(testhosts, ["node1", "node2", "node3"]) == {"node1": [], "node2": [], "node3": []}
