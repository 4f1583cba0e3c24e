"""Smaller faults where tflaunch met input it should refuse or survive: values that would inject lines
into job.sbatch, YAML complex keys, run.json with values of the wrong type, run ids started in the
same second, names that only look like loopback, strangers on a TensorBoard port or a mesh probe.
Each test was written against the fault; real processes wherever behaviour is involved.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, TASK
from polling import wait_for
from launcher.cluster.reader import parse_cluster
from launcher.errors import ConfigError, LaunchError
from launcher.inspect.compare import compare_runs
from launcher.inspect.report import build_report, report_lines, runs_lines, status_lines
from launcher.inspect.runs import find_runs, read_run, resolve_run, summarize
from launcher.inspect.status import run_status
from launcher.records.folder import RunFolder
from launcher.records.record import RecordError, RunRecord
from launcher.slurm.section import read_slurm_section

pytestmark = pytest.mark.timeout(300)


def tflaunch(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})


def one_line_error(done: subprocess.CompletedProcess, *parts: str) -> str:
    """The single stderr line of a refused command (exit 2, no traceback), checked to name ``parts``."""
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tflaunch: error: "), done.stderr
    for part in parts:
        assert part in lines[0], (part, lines[0])
    return lines[0]


# -- 1. control characters bound for job.sbatch -----------------------------------------------


@pytest.mark.parametrize("option, value", [
    ("--partition", "debug\n#SBATCH --uid=0"), ("--account", "proj\rx"), ("--time", "1:00:00\nrm -rf ~"),
    ("--sbatch-option", "--qos=high\n#SBATCH --exclusive"), ("--account", "a\x1b[2Jb"), ("--partition", "a\tb"),
])
def test_submit_refuses_control_characters_in_options(tmp_path, option, value):
    for mode in ("--dry-run", "--wait"):  # --wait would submit: the refusal comes before any folder or sbatch
        done = tflaunch("submit", "--nodes", "1", f"{option}={value}", mode, "--log-dir", str(tmp_path / "logs"),
                        cwd=tmp_path)
        line = one_line_error(done, f"submit: {option}: expected text without control characters", repr(value))
        assert "job.sbatch" in line
        assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize("key, yaml_value, shown", [
    ("partition", '"debug\\n#SBATCH --uid=0"', "'debug\\n#SBATCH --uid=0'"),
    ("account", '"a\\rb"', "'a\\rb'"),
    ("time", '"10\\n"', "'10\\n'"),
    ("sbatch_options", '["--qos=x\\n#SBATCH --exclusive"]', "'--qos=x\\n#SBATCH --exclusive'"),
])
def test_submit_refuses_control_characters_in_the_slurm_section(tmp_path, key, yaml_value, shown):
    (tmp_path / "c.yaml").write_text(f"slurm:\n  nodes: 1\n  {key}: {yaml_value}\n")
    done = tflaunch("submit", "c.yaml", "--dry-run", cwd=tmp_path)
    one_line_error(done, f"c.yaml: slurm.{key}: expected text without control characters", shown)


def test_submit_refuses_a_log_dir_or_working_directory_with_a_newline(tmp_path):
    done = tflaunch("submit", "--nodes", "1", "--dry-run", "--log-dir", str(tmp_path / "a\nb"), cwd=tmp_path)
    one_line_error(done, "submit: --log-dir: expected text without control characters")
    (tmp_path / "c.yaml").write_text('log_dir: "x\\ny"\nslurm: {nodes: 1}\n')
    one_line_error(tflaunch("submit", "c.yaml", "--dry-run", cwd=tmp_path), "c.yaml: log_dir: expected text")
    odd = tmp_path / "w\nx"
    odd.mkdir()
    one_line_error(tflaunch("submit", "--nodes", "1", "--dry-run", cwd=odd), "submit: the working directory")


def test_clean_values_still_make_one_sbatch_line_each(tmp_path):
    done = tflaunch("submit", "--nodes", "1", "--partition", "debug", "--account", "proj", "--time", "1:00:00",
                    "--sbatch-option", "--qos=high", "--dry-run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    sbatch = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("#SBATCH")]
    assert {"--partition=debug", "--account=proj", "--time=1:00:00", "--qos=high"} <= set(sbatch)
    assert all(line.startswith(("#", "exec ")) or not line for line in done.stdout.splitlines())
    settings = read_slurm_section("c.yaml", {"partition": "gpu", "sbatch_options": "--qos=high --exclusive"})
    assert settings.sbatch_options == ("--qos=high", "--exclusive")


# -- 2. YAML complex keys ---------------------------------------------------------------------


@pytest.mark.parametrize("text, line, kind", [
    ("? [a, b]\n: 1\n", 1, "list"),
    ("worker:\n  ? [a, b]\n  : 1\n", 2, "list"),
    ("worker:\n  - host: localhost\n    ? {a: 1}\n    : 2\n", 3, "mapping"),
    ("worker: [{host: localhost, port: auto}]\nenv:\n  ? !!set {A}\n  : 1\n", 3, "mapping"),
])
def test_a_complex_yaml_key_is_a_one_line_error(text, line, kind):
    with pytest.raises(ConfigError) as error:
        parse_cluster(text, "c.yaml", frozenset())
    assert str(error.value) == (f"c.yaml: line {line}: invalid YAML: a {kind} used as a key; "
                                f"expected a plain key such as 'worker'")


def test_a_complex_yaml_key_on_the_command_line_exits_2(tmp_path):
    (tmp_path / "c.yaml").write_text("worker:\n  ? [a, b]\n  : 1\n")
    one_line_error(tflaunch("run", "c.yaml", "--", "true", cwd=tmp_path), "c.yaml: line 2: invalid YAML: a list")
    one_line_error(tflaunch("submit", "c.yaml", "--dry-run", cwd=tmp_path), "c.yaml: line 2: invalid YAML")


# -- 3. run.json with values of the wrong type ------------------------------------------------


def good_record(run_id: str) -> dict:
    """A complete record as a finished run writes it, with its launcher on this host."""
    task = {"name": "worker-0", "role": "worker", "index": 0, "host": "localhost", "address": "localhost:2222",
            "local": True, "argv": ["python", "t.py"], "workdir": "/tmp", "gpus": [0], "env": {"A": "1"},
            "state": "running", "pid": os.getpid(), "started_at": "2026-11-23T10:15:00.000+00:00",
            "ended_at": None, "exit_code": None, "signal": None, "error": None, "attempt": 1, "restarts": 0,
            "leftovers": []}
    return {"run_id": run_id, "source": "--local 2", "status": "running", "format_version": 2,
            "tflaunch_version": "0.1.0", "exit_code": None, "max_restarts": 1,
            "started_at": "2026-11-23T10:15:00.000+00:00", "ended_at": None, "duration_seconds": 1.5,
            "launcher": {"pid": os.getpid(), "host": os.uname().nodename, "cwd": "/tmp", "argv": ["tflaunch"]},
            "cluster": {"worker": ["localhost:2222", "localhost:2223"]}, "command": "python t.py", "notes": ["n"],
            "tasks": [task, {**task, "name": "worker-1", "index": 1, "state": "failed", "exit_code": 3,
                             "signal": 9, "ended_at": "2026-11-23T10:15:01.000+00:00"}],
            "root_cause": {"task": "worker-1", "host": "localhost", "exit_code": 3, "signal": None, "error": None,
                           "tail": ["x"], "diagnosis": {"rule": "oom"}},
            "attempts": [{"attempt": 1, "started_at": None, "ended_at": None, "outcome": "failed", "exit_code": 3,
                          "failed_task": "worker-1", "reason": "r", "blamed_tasks": ["worker-1"], "diagnosis": None}],
            "error": None}


def leaf_paths(value, path=()):
    """Every key path in a JSON value, containers included."""
    yield path
    if isinstance(value, dict):
        for key, item in value.items():
            yield from leaf_paths(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from leaf_paths(item, (*path, i))


def replaced(data, path, value):
    data = copy.deepcopy(data)
    if not path:
        return value
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return data


WRONG = ["3", "x", 3, -7, 2.5, True, None, [], ["a", 1], {}, {"k": [1]}, float("nan"), float("inf"), 2**70, 0]


def show_everything(run) -> None:
    """What runs, status, report and compare do with one run; only a LaunchError may come out."""
    runs_lines([summarize(run)])
    if run.problem:
        return
    status_lines(run_status(run, measure_seconds=0))
    try:
        report_lines(build_report(run, all_tasks=True))
        compare_runs([run, run])
    except LaunchError:
        pass  # no metrics: a message, not a crash


def test_every_wrong_type_anywhere_in_run_json_is_unreadable_or_shown_never_a_crash(tmp_path):
    folder = RunFolder(tmp_path / "20261123-101500-ab12")
    folder.path.mkdir()
    folder.metrics_path.write_text('{"kind":"epoch","epoch":1,"task":"worker-0","epoch_seconds":"x","loss":"y",'
                                   '"samples_per_second":[1],"global_batch":"z","attempt":1}\n'
                                   '{"kind":"final","task":"worker-0","total_seconds":"9","test_accuracy":"a"}\n')
    (folder.path / "resources.json").write_text('{"tasks": {"worker-0": "x", "worker-1": {"rss_mb_mean": "9"}}}')
    base = good_record(folder.run_id)
    cases = unreadable = 0
    for path in list(leaf_paths(base)):
        for value in WRONG:
            data = replaced(base, path, value)
            folder.record_path.write_text(json.dumps(data))
            run = read_run(folder.path)
            show_everything(run)
            cases += 1
            if run.problem:
                unreadable += 1
                assert run.problem.startswith(f"{folder.record_path}: not a run record (")
                assert "\n" not in run.problem and str(run.status) == "unreadable"
    assert cases > 1000 and unreadable > cases // 2
    for text in ("", "{", "[]", "null", '"x"', "[" * 100_000, "\udcff"):
        folder.record_path.write_text(text, errors="surrogateescape")
        assert read_run(folder.path).problem.startswith(f"{folder.record_path}: not a run record")


@pytest.mark.parametrize("path, value, message", [
    (("launcher",), "me", "launcher: expected an object, got 'me'"),
    (("tasks",), "worker-0", "tasks: expected a list, got 'worker-0'"),
    (("tasks", 1, "exit_code"), "3", "tasks[1].exit_code: expected an integer, got '3'"),
    (("duration_seconds",), "1.5", "duration_seconds: expected a finite number, got '1.5'"),
    (("tasks", 0, "pid"), -1, "tasks[0].pid: expected a process id, got -1"),
    (("attempts", 0, "outcome"), 3, "attempts[0].outcome: expected a word such as 'failed', got 3"),
    (("tasks", 0, "name"), None, "tasks[0].name: expected a string, got null"),
    (("cluster", "worker", 0), 1, "cluster.worker[0]: expected a string, got 1"),
])
def test_the_problem_names_the_key_path_and_the_value(path, value, message):
    with pytest.raises(RecordError) as error:
        RunRecord.from_json(replaced(good_record("r"), path, value))
    assert str(error.value) == message


def test_a_missing_task_name_is_named_and_a_good_record_reads_whole():
    data = good_record("r")
    del data["tasks"][1]["name"]
    with pytest.raises(RecordError, match=r"^tasks\[1\]\.name: missing$"):
        RunRecord.from_json(data)
    record = RunRecord.from_json(good_record("r"))
    assert RunRecord.from_json(record.to_json()) == record and record.tasks[1].exit_code == 3


def test_runs_status_and_report_list_the_others_and_name_the_unreadable_run(tmp_path):
    logs = tmp_path / "logs"
    for _ in range(2):
        done = tflaunch("--local", "1", "--log-dir", str(logs), "--", sys.executable, TASK,
                        'print:TFLAUNCH_METRIC {"kind":"epoch","epoch":1,"loss":0.5}', cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    good, bad = sorted(p.name for p in logs.iterdir())
    data = json.loads((logs / bad / "run.json").read_text())
    data["launcher"], data["tasks"][0]["exit_code"] = "tflaunch", "0"
    (logs / bad / "run.json").write_text(json.dumps(data))
    listed = tflaunch("runs", "--log-dir", str(logs), cwd=tmp_path)
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()[1:3]}
    assert "succeeded" in rows[good] and "unreadable" in rows[bad]
    problem = f"{logs}/{bad}/run.json: not a run record (launcher: expected an object, got 'tflaunch')"
    assert listed.stdout.splitlines()[3:] == [problem]
    as_json = {r["run_id"]: r for r in json.loads(tflaunch("runs", "--json", "--log-dir", str(logs),
                                                            cwd=tmp_path).stdout)}
    assert as_json[bad]["status"] == "unreadable" and as_json[bad]["problem"] == problem
    assert as_json[good]["status"] == "succeeded" and as_json[good]["problem"] is None
    for command in ("status", "report", "logs"):
        assert tflaunch(command, good, "--log-dir", str(logs), cwd=tmp_path).returncode == 0
        assert one_line_error(tflaunch(command, bad, "--log-dir", str(logs), cwd=tmp_path)) == \
            f"tflaunch: error: {problem}"
    assert {r.run_id: str(r.status) for r in find_runs(logs)} == {good: "succeeded", bad: "unreadable"}
    assert resolve_run(logs, good).record.status == "succeeded"


def test_report_shows_metric_figures_of_the_wrong_type_as_they_are(tmp_path):
    folder = RunFolder(tmp_path / "20261123-101500-ab12")
    folder.path.mkdir()
    data = good_record(folder.run_id)
    data["status"] = "failed"
    folder.record_path.write_text(json.dumps(data))
    folder.metrics_path.write_text('{"kind":"epoch","epoch":1,"task":"worker-0","epoch_seconds":"slow",'
                                   '"samples_per_second":"many","loss":0.5}\n'
                                   '{"kind":"final","task":"worker-0","total_seconds":"long","test_accuracy":0.5}\n')
    (folder.path / "resources.json").write_text('{"tasks": {"worker-0": "x", "worker-1": {"rss_mb_mean": "9"}}}')
    run = read_run(folder.path)
    text = "\n".join(report_lines(build_report(run)))
    assert "slow" in text and "many" in text and "long" in text
    assert "worker-1" in text


@pytest.mark.parametrize("text", ['[1]', '"x"', '{"job_id": ["1"]}', '{"job_id": "7", "submitted_at": 5}',
                                  '{"job_id": true}', '{', "[" * 100_000])
def test_a_damaged_slurm_json_of_a_pending_job_hides_no_other_run(tmp_path, text):
    logs = tmp_path / "logs"
    done = tflaunch("--local", "1", "--log-dir", str(logs), "--", "true", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    pending = logs / "20261123-101500-ab12"
    pending.mkdir()
    (pending / "slurm.json").write_text(text)
    listed = tflaunch("runs", "--log-dir", str(logs), cwd=tmp_path)
    assert listed.returncode == 0 and "succeeded" in listed.stdout, listed.stderr
    assert "Traceback" not in listed.stderr


# -- 4. run.json reaches the disk before it replaces the last copy ----------------------------


def syscalls(trace: Path) -> list[tuple[str, str, str]]:
    """(call, path, second path) of each openat/fsync/rename in an ``strace -f -y`` trace, in order."""
    events = []
    for line in trace.read_text().splitlines():
        if "resumed>" in line:
            continue  # the second half of a call already counted when it began
        if m := re.search(r'\bopenat\(\S+, "([^"]+)"', line):
            events.append(("open", os.path.abspath(m.group(1)), ""))
        elif m := re.search(r"\bfsync\(\d+<([^>]+)>", line):
            events.append(("fsync", m.group(1), ""))
        elif m := re.search(r'\brename\("([^"]+)", "([^"]+)"', line):
            events.append(("rename", os.path.abspath(m.group(1)), os.path.abspath(m.group(2))))
    return events


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed (apt-get install strace)")
def test_each_run_json_copy_is_fsynced_before_its_rename_and_the_folder_at_milestones(tmp_path):
    trace = tmp_path / "trace"
    # worker-1 ends well before worker-0: its end is a milestone between the tasks starting and the end.
    done = subprocess.run(["strace", "-f", "-qq", "-y", "-e", "trace=openat,fsync,rename", "-o", str(trace),
                           sys.executable, "-m", "launcher", "--local", "2", "--log-dir", str(tmp_path / "logs"),
                           "--", sys.executable, TASK, "sleep:1.5", "exit-if:worker-1:0", "sleep:2.5"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    (run_dir,) = (tmp_path / "logs").iterdir()
    record, synced, renames, folder_syncs, after_rename = str(run_dir / "run.json"), {}, 0, [], False
    for call, path, target in syscalls(trace):
        if call == "open" and ".run.json." in path:
            synced[path] = False
        elif call == "fsync" and path in synced:
            synced[path] = True
        elif call == "rename" and target == record:
            assert synced.get(path), f"{path} renamed over run.json before it was fsynced"
            renames, after_rename = renames + 1, True
        elif call == "fsync" and path == str(run_dir):
            folder_syncs.append(after_rename)
            after_rename = False
    # The first record, worker-1's end and the final record; the tasks starting are not a milestone.
    assert renames >= 4 and 3 <= len(folder_syncs) < renames and all(folder_syncs), (renames, folder_syncs)
    assert json.loads((run_dir / "run.json").read_text())["status"] == "succeeded"


# -- 5. run ids drawn in the same second ------------------------------------------------------


def test_thousands_of_runs_created_in_one_second_each_get_their_own_folder(tmp_path):
    import threading
    import time

    # 16 threads x 150 folders in one second: with 65,536 ids a second, about 40 draws collide.
    threads, each, made, errors = 16, 150, [], []
    barrier = threading.Barrier(threads)

    def create() -> None:
        barrier.wait()
        for _ in range(each):
            try:
                made.append(RunFolder.create(tmp_path / "logs", "test").path.name)
            except ConfigError as exc:
                errors.append(str(exc))

    time.sleep(1 - time.time() % 1)  # start at the top of a second, so that most draws share it
    workers = [threading.Thread(target=create) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert errors == []
    assert len(made) == len(set(made)) == threads * each == len(list((tmp_path / "logs").iterdir()))


def test_a_log_dir_that_is_a_dangling_link_is_still_one_line(tmp_path):
    (tmp_path / "logs").symlink_to(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match=r"cannot create a run folder in .*: File exists$"):
        RunFolder.create(tmp_path / "logs", "test")


# -- 6. only loopback addresses are this machine by their look --------------------------------


@pytest.mark.parametrize("host, local", [
    ("127.0.0.1", True), ("127.0.0.3", True), ("127.255.255.254", True), ("::1", True), ("[::1]", True),
    ("::ffff:127.0.0.2", True), ("127.foo.example", False), ("127.0.0.1.example", False), ("1270.0.0.1", False),
    ("127.", False), ("10.0.0.1", False),
])
def test_a_name_that_starts_with_127_is_not_this_machine(host, local):
    from launcher.cluster.spec import is_local

    assert is_local(host, frozenset()) is local


def test_a_name_that_starts_with_127_gets_the_exposure_check_of_any_name():
    from launcher.cluster.exposure import public_addresses

    resolver = {"127.foo.example": ["93.184.216.34"], "127.0.0.2": ["127.0.0.2"]}.get
    assert public_addresses(["127.foo.example", "127.0.0.2"], resolver=resolver) == {
        "127.foo.example": ["93.184.216.34"]}


def test_a_task_on_a_host_named_127_something_goes_over_ssh_not_here(tmp_path):
    (tmp_path / "c.yaml").write_text("worker:\n  - host: 127.foo.example\n    port: auto\n"
                                     "  - host: 127.0.0.2\n    port: auto\n")
    plan = tflaunch("run", "c.yaml", "--dry-run", "--", "true", cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    assert "worker-0: host 127.foo.example (ssh)" in plan.stdout
    assert "worker-1: host 127.0.0.2 (this machine)" in plan.stdout
    done = tflaunch("run", "c.yaml", "--log-dir", str(tmp_path / "logs"), "--", sys.executable, TASK, "print:RAN",
                    cwd=tmp_path)
    assert done.returncode != 0 and "127.foo.example" in done.stderr and "ssh" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not any(p.read_text().count("RAN") for p in tmp_path.glob("logs/*/*.log"))


# -- 7. TensorBoard is ready when tflaunch's own server serves its logdir ---------------------

FAKE_TENSORBOARD = """\
import http.server, json, sys
class Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"logdir": sys.argv[1]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", 0), Answer)
print(server.server_address[1], flush=True)
server.serve_forever()
"""
SYSTEM_PYTHON = "/usr/bin/python3"  # runs as nobody (the venv's interpreter lives under /root)
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def fake_tensorboard(logdir: str, as_nobody: bool = False) -> tuple[subprocess.Popen, int]:
    """An HTTP server that answers every GET with ``{"logdir": logdir}``, and its port."""
    argv = [*NOBODY, SYSTEM_PYTHON] if as_nobody else [sys.executable]
    proc = subprocess.Popen([*argv, "-c", FAKE_TENSORBOARD, logdir], stdout=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    return proc, int(proc.stdout.readline())


def stopped(*procs: subprocess.Popen) -> None:
    for proc in procs:
        proc.kill()
        proc.wait()


@pytest.mark.skipif(not (Path(SYSTEM_PYTHON).exists() and shutil.which("setpriv") and os.geteuid() == 0),
                    reason="needs root, setpriv and /usr/bin/python3 for a second user")
def test_a_strangers_server_on_the_port_is_not_tflaunchs_tensorboard(tmp_path):
    from launcher.tensorboard import TensorBoard, TensorBoardError

    logdir = tmp_path / "tensorboard"
    # Another user took the port between tflaunch's check and TensorBoard's bind, and even answers
    # with the right logdir; the process tflaunch started (here one that never listens) is not it.
    stranger, port = fake_tensorboard(str(logdir), as_nobody=True)
    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        assert psutil_user(stranger.pid) == "nobody"
        with pytest.raises(TensorBoardError, match=r"did not serve http://127\.0\.0\.1:\d+/ within 6 s"):
            TensorBoard(ours, "127.0.0.1", port, logdir, None).wait_ready(timeout=6)
    finally:
        stopped(stranger, ours)


def test_tensorboard_is_ready_only_when_its_own_process_names_its_logdir(tmp_path):
    from launcher.tensorboard import TensorBoard, TensorBoardError

    logdir = tmp_path / "tensorboard"
    other, other_port = fake_tensorboard(str(tmp_path / "elsewhere"))
    right, right_port = fake_tensorboard(str(logdir))
    try:
        with pytest.raises(TensorBoardError, match="did not serve"):
            TensorBoard(other, "127.0.0.1", other_port, logdir, None).wait_ready(timeout=6)
        TensorBoard(right, "127.0.0.1", right_port, logdir, None).wait_ready(timeout=60)
    finally:
        stopped(other, right)


def psutil_user(pid: int) -> str:
    import psutil

    return psutil.Process(pid).username()


# -- 8. the mesh probe's listeners and a stranger's connections -------------------------------

STRANGER = """\
import socket, sys, time
port, count = int(sys.argv[1]), int(sys.argv[2])
socks, failed = [], 0
for _ in range(count):
    sock = socket.socket()
    sock.settimeout(10)
    try:
        sock.connect(("127.0.0.1", port))
    except OSError:
        failed += 1
        continue
    sock.setblocking(False)
    try:
        sock.send(b"x" * 65536)  # read and dropped by the probe, never kept
    except OSError:
        pass
    socks.append(sock)
print("OPEN %d %d" % (len(socks), failed), flush=True)
closed, shown = set(), -1
while True:  # say how many the probe has closed, until the test closes stdin... or forever
    for i, sock in enumerate(socks):
        if i not in closed:
            try:
                if sock.recv(65536) == b"":
                    closed.add(i)
            except BlockingIOError:
                pass
            except OSError:
                closed.add(i)
    if len(closed) != shown:
        shown = len(closed)
        print("CLOSED %d" % shown, flush=True)
    time.sleep(0.1)
"""
needs_nobody = pytest.mark.skipif(not (Path(SYSTEM_PYTHON).exists() and shutil.which("setpriv") and
                                       os.geteuid() == 0), reason="needs root, setpriv and /usr/bin/python3")


def mesh_probe(targets: int, timeout: float) -> tuple[subprocess.Popen, int]:
    """The real probe, started as tflaunch starts it on a host, and the port it listens on."""
    import base64

    from launcher.run.checks.mesh import MESH_SOURCE

    for _ in range(20):  # a port found free may be taken before the probe binds it (a busy machine)
        port = free_local_port()
        request = {"listen": [port], "timeout": timeout, "lifetime": 120,
                   "targets": [{"id": i, "host": "127.0.0.1", "port": port} for i in range(targets)]}
        encoded = base64.b64encode(json.dumps(request).encode()).decode()
        proc = subprocess.Popen([sys.executable, "-c", MESH_SOURCE, encoded], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        listening = proc.stdout.readline().strip()
        if listening == 'TFLAUNCH_MESH_LISTENING {"%d": null}' % port:
            return proc, port
        assert "address already in use" in listening, listening
        stopped(proc)
    pytest.fail("no port the mesh probe could listen on")


def free_local_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def backlog(port: int) -> int:
    """Connections waiting in the kernel to be accepted on ``port`` (the listener's Recv-Q)."""
    listener = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True).stdout
    return int(listener.split()[1])


def stranger(port: int, count: int) -> tuple[subprocess.Popen, list[str]]:
    proc = subprocess.Popen([*NOBODY, SYSTEM_PYTHON, "-c", STRANGER, str(port), str(count)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    return proc, proc.stdout.readline().split()


@needs_nobody
def test_a_strangers_connections_to_the_mesh_probe_are_bounded_and_each_has_a_deadline(tmp_path):
    import socket

    probe, port = mesh_probe(targets=200, timeout=3)
    visitor, opened = stranger(port, 100)
    try:
        assert opened == ["OPEN", "100", "0"]
        wait_for(lambda: backlog(port) == 0, message="the probe to accept every connection")
        # Held at once: MAX_HELD of the stranger's 100, not all of them.
        assert len(os.listdir(f"/proc/{probe.pid}/fd")) <= 64 + 10
        with socket.create_connection(("127.0.0.1", port), timeout=10):
            pass  # a prober still gets in
        closed = None
        while closed != "CLOSED 100":  # every one reset by its deadline (3 s), whatever the stranger does
            closed = visitor.stdout.readline().strip()
            assert closed.startswith("CLOSED"), closed
        probe.stdin.write("go\n")
        probe.stdin.flush()
        results = json.loads(probe.stdout.readline().split(" ", 1)[1])
        assert len(results) == 200 and all(r["ok"] for r in results), results[:3]
        probe.stdin.close()
        assert probe.wait(timeout=30) == 0
    finally:
        stopped(visitor)
        if probe.poll() is None:
            stopped(probe)
