"""launcher.run.faults.diagnose on real error text: fixtures captured on this machine or quoted from public reports.

Each fixture in tests/fixtures/errors/ is named RULE.txt or RULE.VARIANT.txt; its first line says
where it came from (``# captured: <command>, ...`` or ``# reported: <url>``) and is not part of the
text diagnosed.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.run.faults.diagnose import Diagnosis, diagnose

pytestmark = pytest.mark.unit  # the live TensorFlow case is in test_tensorflow_launch.py

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures" / "errors"
WORKERS = ("worker-0", "worker-1")
PS_CLUSTER = ("chief-0", "worker-0", "ps-0")


def fixture(name: str) -> list[str]:
    return (FIXTURES / f"{name}.txt").read_text().splitlines()[1:]


# fixture -> (how the task ended, cluster task names, expected peer, text the summary must match)
CASES = {
    "port-in-use": ({"exit_code": 1}, WORKERS, None, r"could not bind port \d+"),
    "strategy-after-op": ({"exit_code": 1}, WORKERS, None, r"created after another TensorFlow op"),
    "device-config-after-init": ({"exit_code": 1}, WORKERS, None, r"^visible devices"),
    "device-config-after-init.virtual": ({"exit_code": 1}, WORKERS, None, r"^logical \(virtual\) devices"),
    "device-config-after-init.physical": ({"exit_code": 1}, WORKERS, None, r"^GPU memory growth"),
    "threads-after-init": ({"exit_code": 1}, WORKERS, None, r"^thread counts were changed"),
    "keras3-multiworker": ({"exit_code": 1}, WORKERS, None, r"Keras 3"),
    "gpu-library-init.cudnn-handle": ({"exit_code": 1}, WORKERS, None, r"^cuDNN failed"),
    "gpu-library-init.convolution": ({"exit_code": 1}, WORKERS, None, r"^cuDNN failed"),
    "gpu-library-init.cublas": ({"signal": 6}, WORKERS, None, r"^cuBLAS failed"),
    "gpu-library-init.gemm": ({"exit_code": 1}, WORKERS, None, r"^cuBLAS failed"),
    "tensor-oom": ({"exit_code": 1}, WORKERS, None, r"shape \[1099511627776\] on CPU:0$"),
    "peer-heartbeat": ({"exit_code": 1}, WORKERS, "worker-1", r"^worker-1 stopped sending heartbeats"),
    "peer-connection-lost": ({"exit_code": 1}, WORKERS, "worker-1", r"connection to worker-1 closed"),
    "peer-unreachable": ({"exit_code": 1}, PS_CLUSTER, None,
                         r"could not connect to 127\.0\.0\.1:\d+ \(Connection refused\)"),
    "cluster-not-formed": ({"signal": 9}, WORKERS, "worker-1", r"worker-1 never connected to this task"),
    "cluster-not-formed.non-leader": ({"signal": 9}, WORKERS, "worker-0", r"never connected to worker-0"),
    "killed": ({"signal": 9}, WORKERS, None, r"out-of-memory killer"),
    "module-not-found": ({"exit_code": 1}, ("worker-0",), None, r"cannot import tensorflow"),
    "module-not-found.trainer": ({"exit_code": 1}, ("worker-0",), None,
                                 r"^/usr/bin/python3 cannot import trainer"),
}


def ended(how: dict) -> dict:
    return {"signal": how.get("signal"), "exit_code": how.get("exit_code")}


def test_every_fixture_has_a_case_and_a_source_line():
    names = {p.name[:-4] for p in FIXTURES.glob("*.txt")}
    assert names == set(CASES)
    for name in names:
        first = (FIXTURES / f"{name}.txt").read_text().splitlines()[0]
        source = r"# (captured: .+, TensorFlow \d+\.\d+ CPU, \d{4}-\d\d-\d\d$|reported: https://\S+)"
        assert re.match(source, first), name


@pytest.mark.parametrize("name", sorted(CASES))
def test_fixture_yields_its_rule(name):
    how, names, peer, summary = CASES[name]
    found = diagnose(fixture(name), **ended(how), task_names=names)
    assert found is not None, name
    assert found.rule == name.split(".")[0]
    assert found.peer == peer
    assert re.search(summary, found.summary), found.summary
    assert "\n" not in found.summary and "\n" not in found.fix and found.fix


def test_fixes_say_what_the_brief_fix_is():
    assert "before any other TensorFlow op" in diagnose(fixture("strategy-after-op"), signal=None, exit_code=1,
                                                       task_names=WORKERS).fix
    assert "`gpus`" in diagnose(fixture("device-config-after-init"), signal=None, exit_code=1, task_names=WORKERS).fix
    keras = diagnose(fixture("keras3-multiworker"), signal=None, exit_code=1, task_names=WORKERS).fix
    assert "TF_USE_LEGACY_KERAS=1" in keras and "tf_keras" in keras
    gpu = diagnose(fixture("gpu-library-init.cublas"), signal=6, exit_code=None, task_names=WORKERS).fix
    assert "TF_FORCE_GPU_ALLOW_GROWTH=true" in gpu and "fewer tasks" in gpu
    assert "dmesg" in diagnose(fixture("killed"), signal=9, exit_code=None, task_names=WORKERS).fix
    assert "127.0.0.1:" in diagnose(fixture("peer-unreachable"), signal=None, exit_code=1, task_names=PS_CLUSTER).fix
    assert "`python:`" in diagnose(fixture("module-not-found"), signal=None, exit_code=1, task_names=WORKERS).fix


PLAIN_ERROR = """\
step 3: loss 0.25
Traceback (most recent call last):
  File "/srv/train.py", line 12, in <module>
    main()
  File "/srv/train.py", line 9, in main
    raise ValueError("bad learning rate: -1")
ValueError: bad learning rate: -1""".splitlines()


def test_unknown_problems_give_none():
    assert diagnose(PLAIN_ERROR, signal=None, exit_code=1, task_names=WORKERS) is None
    assert diagnose([], signal=None, exit_code=1, task_names=WORKERS) is None
    assert diagnose(["epoch 1 done", ""], signal=None, exit_code=2, task_names=WORKERS) is None
    assert diagnose([], signal=15, exit_code=None, task_names=WORKERS) is None


def test_sigkill_without_a_traceback_is_the_oom_killer_and_with_one_is_not():
    assert diagnose(["Epoch 2/5"], signal=9, exit_code=None, task_names=WORKERS).rule == "killed"
    assert diagnose([], signal=9, exit_code=None, task_names=WORKERS).rule == "killed"
    assert diagnose(["Epoch 2/5"], signal=None, exit_code=137, task_names=WORKERS).rule == "killed"  # through a shell
    assert diagnose(PLAIN_ERROR, signal=9, exit_code=None, task_names=WORKERS) is None
    assert diagnose(["Epoch 2/5"], signal=15, exit_code=None, task_names=WORKERS) is None


def test_sigkill_after_a_caught_sigterm_is_a_stop_not_the_oom_killer():
    # MWMS tasks catch SIGTERM (TF logs "SIGTERM caught") and live on until the stop escalates to SIGKILL.
    stopped = fixture("cluster-not-formed.non-leader")
    assert any("SIGTERM caught" in line for line in stopped)
    assert diagnose(stopped, signal=9, exit_code=None, task_names=PS_CLUSTER) is None
    assert diagnose(stopped[:-1], signal=9, exit_code=None, task_names=PS_CLUSTER).rule == "killed"


def survived_warnings() -> list[str]:
    """The connection errors the chief logged before its final traceback."""
    lines = fixture("peer-unreachable")
    return lines[:lines.index("Traceback (most recent call last):")]


def test_sigkill_beats_warnings_the_task_had_survived():
    survived = survived_warnings()
    assert diagnose(survived, signal=9, exit_code=None, task_names=PS_CLUSTER).rule == "killed"


def test_warnings_before_the_final_traceback_do_not_count():
    survived = survived_warnings()
    assert "Connection refused" in "\n".join(survived)
    assert diagnose(survived + PLAIN_ERROR, signal=None, exit_code=1, task_names=PS_CLUSTER) is None


def test_chained_tracebacks_keep_the_cause():
    cause = fixture("peer-unreachable")
    cause = cause[max(i for i, line in enumerate(cause) if line.startswith("Traceback")):]
    chained = cause + ["", "During handling of the above exception, another exception occurred:", ""] + PLAIN_ERROR[1:]
    assert diagnose(chained, signal=None, exit_code=1, task_names=PS_CLUSTER).rule == "peer-unreachable"


def test_specific_causes_win_over_the_errors_they_bring():
    # cuDNN failing because the GPU's memory is gone comes with OOM lines: the cuDNN rule names the cause.
    oom = [line for line in fixture("tensor-oom") if "OOM when allocating" in line][:1]
    cudnn = fixture("gpu-library-init.cudnn-handle")
    assert diagnose(oom + cudnn, signal=None, exit_code=1, task_names=WORKERS).rule == "gpu-library-init"
    # A survivor whose collective failed on a closed socket and then on heartbeats: the heartbeat names the dead task.
    lost = fixture("peer-connection-lost")
    beat = fixture("peer-heartbeat")
    found = diagnose(lost + beat, signal=None, exit_code=1, task_names=WORKERS)
    assert (found.rule, found.peer) == ("peer-heartbeat", "worker-1")
    # A missing module after connection warnings: the import error is what ended the task.
    found = diagnose(survived_warnings() + fixture("module-not-found"), signal=None, exit_code=1,
                     task_names=PS_CLUSTER)
    assert found.rule == "module-not-found"
    # The Keras 3 error ends a task whose leader log also shows the cluster forming: PerReplica is the cause.
    forming = [line for line in fixture("cluster-not-formed") if "tasks to connect" in line or "task:1" in line]
    assert diagnose(forming + fixture("keras3-multiworker"), signal=None, exit_code=1,
                    task_names=WORKERS).rule == "keras3-multiworker"


def test_peer_names_come_from_the_cluster():
    beat = fixture("peer-heartbeat")
    assert diagnose(beat, signal=None, exit_code=1, task_names=["worker-0", "worker-1", "worker-2"]).peer == "worker-1"
    assert diagnose(beat, signal=None, exit_code=1, task_names=[]).peer == "worker-1"
    unknown = diagnose(beat, signal=None, exit_code=1, task_names=["chief-0", "worker-0"])
    assert unknown.peer is None and "/job:worker/task:1" in unknown.summary
    chief = [line.replace("/job:worker/replica:0/task:1", "/job:chief/replica:0/task:0") for line in beat]
    assert diagnose(chief, signal=None, exit_code=1, task_names=["chief-0", "worker-0"]).peer == "chief-0"


def test_several_unhealthy_tasks_are_all_named():
    lines = ["UnavailableError: The following tasks are unhealthy (stopped sending heartbeats):",
             "/job:worker/replica:0/task:2", "/job:worker/replica:0/task:3",
             "The tasks have crashed. Check the task logs for an earlier error"]
    found = diagnose(lines, signal=None, exit_code=1, task_names=[f"worker-{i}" for i in range(4)])
    assert found.peer == "worker-2" and "worker-2 and worker-3" in found.summary


def test_a_parameter_server_task_waiting_on_its_server_is_not_a_cluster_that_never_formed():
    served = fixture("cluster-not-formed.non-leader")
    assert diagnose(served, signal=9, exit_code=None, task_names=PS_CLUSTER) is None
    assert diagnose(served, signal=9, exit_code=None, task_names=["chief-0", "worker-0"]).peer == "chief-0"


def test_diagnosis_is_a_frozen_value():
    found = Diagnosis("port-in-use", "s", "f")
    assert found.peer is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        found.rule = "x"  # type: ignore[misc]


def test_the_module_does_not_import_tensorflow():
    code = "import sys, launcher.run.faults.diagnose; print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


OFFLINE = ("the sealed run has no outside network: neither slirp4netns nor pasta is installed",
           "apt-get install slirp4netns (or passt, for pasta), or run with --no-seal")


@pytest.mark.parametrize("last, found", [
    ("Exception: URL fetch failure on https://storage.googleapis.com/tensorflow/tf-keras-datasets/mnist.npz: None -- "
     "[Errno -3] Temporary failure in name resolution", "URL fetch failure"),
    ("urllib.error.URLError: <urlopen error [Errno -3] Temporary failure in name resolution>", "urlopen error"),
    ("requests.exceptions.ConnectionError: HTTPSConnectionPool(host='huggingface.co', port=443): Max retries exceeded "
     "with url: /bert/resolve/main/config.json", "Max retries exceeded with url"),
    ("socket.gaierror: [Errno -2] Name or service not known", "[Errno -2] Name or service not known"),
    ("OSError: [Errno 101] Network is unreachable", "[Errno 101] Network is unreachable"),
    ("curl: (6) Could not resolve host: example.com", "Could not resolve host"),
])
def test_a_name_or_network_error_where_the_network_has_no_way_out_names_the_way_out(last, found):
    lines = ["Traceback (most recent call last):", '  File "train.py", line 3, in <module>', last]
    known = diagnose(lines, signal=None, exit_code=1, task_names=WORKERS, offline=OFFLINE)
    assert known == Diagnosis("no-outside-network", f"a name or network error ({found}): {OFFLINE[0]}", OFFLINE[1])
    # The same failure where the network has a way out is not put on it.
    other = diagnose(lines, signal=None, exit_code=1, task_names=WORKERS)
    assert other is None or other.rule != "no-outside-network"


def test_a_peer_that_refuses_in_a_run_without_outside_network_is_still_the_peers():
    lines = fixture("peer-unreachable")
    assert diagnose(lines, signal=None, exit_code=1, task_names=WORKERS, offline=OFFLINE).rule == "peer-unreachable"
