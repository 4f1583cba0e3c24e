"""The Python API (launcher.api): from a script, from a thread, and interrupted with Ctrl-C mid-run."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from conftest import HELPERS, ROOT, TASK, descendants_alive, env_lines_of
from console_names import tasks_saying
from polling import wait_for

import launcher
from launcher import LaunchFailed, LaunchResult, launch, run_record, runs
from launcher.errors import LaunchError

pytestmark = pytest.mark.timeout(120)
API_RUN = str(HELPERS / "api_run.py")


def api_script(log_dir: Path, *actions: str, **popen) -> subprocess.Popen:
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    return subprocess.Popen([sys.executable, API_RUN, str(log_dir), *actions], env=env, cwd=log_dir.parent,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def result_of(stdout: str) -> dict:
    (line,) = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(line[len("RESULT "):])


def test_importing_launcher_stays_cheap():
    code = ("import sys, launcher\n"
            "from launcher import launch, runs, run_record\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'click', 'yaml', 'psutil')\n"
            "               or m in ('launcher.run.lifecycle.session', 'launcher.run.lifecycle.launch', 'launcher.cli'))\n"
            "print(heavy)")
    done = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_api_from_a_script(tmp_path):
    proc = api_script(tmp_path / "logs", "env", "print:hello-from-the-task")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    result = result_of(out)
    assert result["ended"] == "returned" and result["exit_code"] == 0
    assert result["status"] == result["record_status"] == "succeeded"
    assert result["tasks"] == {"chief-0": "succeeded", "worker-0": "succeeded", "worker-1": "succeeded"}
    assert result["sigint_restored"]  # the script's own Ctrl-C handling is back
    # The console lines went to the script's stdout: the tasks' lines and tflaunch's summary.
    assert sorted(tasks_saying(out, "hello-from-the-task")) == ["chief-0", "worker-0", "worker-1"]  # folded or not
    assert f"tflaunch: run {Path(result['run_dir']).name} succeeded" in out
    record = json.loads((Path(result["run_dir"]) / "run.json").read_text())
    assert record["status"] == "succeeded" and record["source"] == "launch(local=2, chief=True)"


def test_api_from_a_thread_installs_no_signal_handler(tmp_path):
    flag = tmp_path / "finish"
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)}
    lines: list[str] = []
    outcome: list[object] = []

    def call() -> None:
        code = f"import os, time\nwhile not os.path.exists({str(flag)!r}):\n    time.sleep(0.05)\nprint('done')"
        try:
            outcome.append(launch(local=2, command=[sys.executable, "-c", code], log_dir=tmp_path / "logs",
                                  on_line=lines.append))
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            outcome.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    try:
        wait_for(lambda: any(" tasks from launch(local=2); logs in " in line for line in lines), timeout=30,
                 message="the run to start")
        # While the run is under way in the thread, the process's handlers are the ones it had.
        assert {s: signal.getsignal(s) for s in before} == before
    finally:
        flag.touch()
        thread.join(60)
    (result,) = outcome
    assert isinstance(result, LaunchResult), result
    assert result.exit_code == 0 and result.status == "succeeded" and result.ok
    assert [t.state for t in result.record.tasks] == ["succeeded", "succeeded"]
    assert sorted(tasks_saying("\n".join(lines), "done")) == ["worker-0", "worker-1"]  # folded or not
    assert {s: signal.getsignal(s) for s in before} == before
    # runs() and run_record() read the same run back.
    (listed,) = runs(tmp_path / "logs")
    assert listed.run_id == result.run_id == result.run_dir.name
    assert run_record(log_dir=tmp_path / "logs").to_json() == result.record.to_json()
    assert run_record(result.run_id[:15], log_dir=tmp_path / "logs").status == "succeeded"


def test_keyboard_interrupt_mid_run_stops_every_task(tmp_path):
    marker = f"api-interrupt-{uuid.uuid4().hex}"
    proc = api_script(tmp_path / "logs", f"print:{marker}", "child", "forever")
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        # Each task prints the marker and then runs with a grandchild of its own.
        wait_for(lambda: len(tasks_saying("".join(seen), marker)) == 3, timeout=60,  # folded or not
                 message=lambda: f"three tasks to start:\n{''.join(seen)}")
        wait_for(lambda: sum("CHILD " in line for line in seen) == 3, timeout=30, message="their grandchildren")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(10)
    result = result_of("".join(seen))
    assert result["ended"] == "LaunchInterrupted"
    assert result["exit_code"] == 130 and result["status"] == "stopped" and result["record_status"] == "stopped"
    assert set(result["tasks"].values()) == {"stopped"}
    assert result["sigint_restored"]
    record = json.loads((Path(result["run_dir"]) / "run.json").read_text())
    assert record["status"] == "stopped" and record["exit_code"] == 130 and record["ended_at"]
    # Nothing is left: neither the tasks nor the processes they started.
    children = [int(line.split("CHILD ")[1].split()[0]) for line in seen if "CHILD " in line]
    assert descendants_alive(marker) == []
    assert not [pid for pid in children if Path(f"/proc/{pid}").exists()
                and "Z" not in Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0]]


def test_bad_input_raises_the_line_the_command_line_prints(tflaunch, tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\nnode2 slots=lots\n")
    cli = subprocess.run(tflaunch.argv("--hostfile", str(hostfile)), cwd=tmp_path, env=tflaunch.env(),
                         capture_output=True, text=True, timeout=60)
    with pytest.raises(LaunchError) as error:
        launch(hostfile=hostfile, log_dir=tmp_path / "logs")
    assert cli.returncode == error.value.exit_code == 2
    assert cli.stderr.splitlines() == [f"tflaunch: error: {error.value}"]

    cluster = tmp_path / "bad.yaml"
    cluster.write_text("worker:\n  - host: localhost\n    prot: 2222\n")
    cli = subprocess.run(tflaunch.argv(str(cluster)), cwd=tmp_path, env=tflaunch.env(), capture_output=True,
                         text=True, timeout=60)
    with pytest.raises(LaunchError) as error:
        launch(str(cluster))
    assert cli.stderr.splitlines() == [f"tflaunch: error: {error.value}"]
    assert not (tmp_path / "logs").exists()  # nothing started


@pytest.mark.parametrize("kwargs, message", [
    ({}, "give either cluster or local=N, hosts=HOST:SLOTS,... or hostfile=FILE"),
    ({"local": 0}, "local: expected a whole number >= 1, got 0"),
    ({"local": 2, "ps": -1}, "ps: expected a whole number >= 0, got -1"),
    ({"local": 2, "grace": "soon"}, "grace: expected a number of seconds >= 0, got 'soon'"),
    ({"local": 2, "threads": 0}, "threads: expected 'auto', 'off' or a thread count >= 1, got 0"),
    ({"local": 2, "env": {"A-B": "1"}}, "env: expected variable names mapped to strings, or to None (passed by "
                                        "name), got 'A-B'"),
    ({"local": 2, "env": {"A": 1}}, "env['A']: expected a string, or None to pass this process's own value by name, "
                                    "got 'int'"),
    ({"local": 2, "env": {"TF_CONFIG": "{}"}}, "env: TF_CONFIG: is set by tflaunch for every task and cannot be "
                                               "overridden"),
    ({"local": 2, "env": {"TFLAUNCH_TEST_NEVER_SET": None}}, "env: TFLAUNCH_TEST_NEVER_SET: is passed by name (no "
     "value given), but tflaunch's environment has no TFLAUNCH_TEST_NEVER_SET; set it there "
     "(export TFLAUNCH_TEST_NEVER_SET=...) or give a value"),
    ({"local": 2, "command": []}, "command: expected a non-empty list of strings, or a string, got []"),
    ({"local": 2, "tasks": "worker-7"}, "tasks='worker-7': launch(local=2) has no task 'worker-7'; its tasks are: "
                                        "worker-0, worker-1"),
    ({"hosts": "node1:1", "isolate_network": True}, "launch(hosts='node1:1'): isolate_network: needs every task on "
     "this machine; worker[0] runs on 'node1' (a network namespace cannot span hosts)"),
    ({"cluster": {"worker": ["localhost:auto"]}, "chief": True},
     "chief, ps, evaluator and gpus only apply to local, hosts and hostfile; put roles in the cluster file"),
    ({"local": 2, "evaluator": True}, "evaluator applies to hosts and hostfile, not to local"),
    ({"hosts": {"localhost": 0}}, "hosts: localhost:0: expected HOST or HOST:SLOTS with SLOTS a whole number >= 1, "
                                  "such as node1:4"),
    ({"hosts": "node1:2,node1:1"}, "hosts node1:1: 'node1' is also named in hosts node1:2; "
                                   "expected each host once, with all its slots"),
    ({"hosts": "localhost:2", "ps": 2}, "launch(hosts='localhost:2', chief=True, ps=2): ps: a chief, 2 ps tasks and "
                                        "at least one worker need 4 slots; the hosts have 2 (add slots or hosts)"),
    ({"hosts": "localhost:100000"}, "hosts: localhost:100000: more slots than tflaunch runs on one host; "
                                    "expected at most 1024 (one TensorFlow task per slot: 8 for a host with 8 GPUs)"),
    ({"local": 1025}, "launch(local=1025): local: expected at most 1024 tasks on this machine in all, got 1025"),
    ({"local": 2, "gpus": [0.5]}, "gpus: expected GPU indices (whole numbers) such as 0,1, got [0.5]"),
    ({"local": 2, "gpus": [0, 1.0]}, "gpus: expected GPU indices (whole numbers) such as 0,1, got [0, 1.0]"),
    ({"local": 2, "gpus": [True]}, "gpus: expected GPU indices (whole numbers) such as 0,1, got [True]"),
    ({"local": 2, "gpus": "0,x"}, "gpus: expected GPU indices (whole numbers) such as 0,1, got '0,x'"),
    ({"local": 2, "gpus": [0, 0]}, "launch(local=2, gpus=[0, 0]): gpus: expected distinct GPU indices >= 0, got 0,0"),
    ({"local": 2, "quiet": True, "verbose": True}, "launch(): quiet=True and verbose=True cannot be combined"),
    ({"local": 2, "output": sys.stdout, "on_line": print},
     "launch(): output and on_line cannot be combined; give one of them"),
    ({"cluster": {"worker": [{"host": "localhost", "port": 70000}]}}, "cluster: worker[0].port: expected a port 1-65535, "
                                                                     "got 70000"),
])
def test_bad_arguments_raise_one_line_before_anything_starts(tmp_path, kwargs, message):
    with pytest.raises(LaunchError) as error:
        launch(**kwargs, log_dir=tmp_path / "logs")
    assert str(error.value) == message and error.value.exit_code == 2
    assert not (tmp_path / "logs").exists()
    # Worded for a Python caller: keyword arguments, never the command line's options.
    assert not re.search(r"(^|[\s(])(--[a-z]|-H\b)", message), message


def test_a_cluster_mapping_and_hosts_forms_run(tmp_path):
    lines: list[str] = []
    result = launch({"worker": ["localhost:auto", "localhost:auto"], "env": {"USER_GREETING": "hi"}},
                    command=[sys.executable, TASK, "env"], log_dir=tmp_path / "logs", on_line=lines.append)
    assert result.exit_code == 0 and result.record.source == "cluster"
    assert {json.loads(t.env["TF_CONFIG"])["task"]["index"] for t in result.record.tasks} == {0, 1}
    (seen,) = env_lines_of((result.run_dir / "worker-1.log").read_text())
    assert seen["USER_GREETING"] == "hi"
    for hosts in ({"localhost": 2}, ["localhost:2"], "localhost:2"):
        result = launch(hosts=hosts, command=f"{sys.executable} {TASK} bind", log_dir=tmp_path / "logs",
                        quiet=True, on_line=lines.append)
        assert result.exit_code == 0 and result.record.source == "launch(hosts='localhost:2')", hosts
    assert launcher.runs(tmp_path / "logs")[0].run_id == result.run_id


# -- check=True, and messages in a caller's words ---------------------------------------------

def test_check_true_raises_launch_failed_carrying_the_result(tmp_path):
    lines: list[str] = []
    with pytest.raises(LaunchFailed) as failed:
        launch(local=2, command=[sys.executable, TASK, "exit-if:worker-1:3", "sleep:0.2"], log_dir=tmp_path / "logs",
               on_line=lines.append, check=True)
    error = failed.value
    result = error.result
    assert isinstance(error, LaunchError) and isinstance(result, LaunchResult)
    assert not result.ok and result.status == "failed" and error.exit_code == result.exit_code != 0
    assert result.root_cause is not None and (result.root_cause.task, result.root_cause.exit_code) == ("worker-1", 3)
    assert {t.name: (t.state, t.exit_code) for t in result.tasks}["worker-1"] == ("failed", 3)
    # Its message is the summary's first line, as the console showed it.
    assert str(error).startswith(f"run {result.run_id} failed: worker-1 on ") and str(error).endswith(": exit code 3")
    assert f"tflaunch: {error}" in lines
    assert json.loads((result.run_dir / "run.json").read_text())["status"] == "failed"
    # The summary ends where its logs are; the exit code is the result's, no process exits.
    assert lines[-1] == f"tflaunch: logs in {result.run_dir}", lines[-3:]
    assert not [line for line in lines if "exits with" in line]


def test_check_defaults_to_false_and_a_run_that_succeeds_returns_either_way(tmp_path):
    failed = launch(local=1, command=[sys.executable, TASK, "exit:4"], log_dir=tmp_path / "logs", quiet=True,
                    on_line=lambda line: None)
    assert isinstance(failed, LaunchResult) and not failed.ok and failed.root_cause.exit_code == 4
    passed = launch(local=1, command=[sys.executable, TASK, "print:fine"], log_dir=tmp_path / "logs", quiet=True,
                    on_line=lambda line: None, check=True)
    assert passed.ok and passed.root_cause is None and [t.state for t in passed.tasks] == ["succeeded"]


def test_words_of_a_launch_call_stay_in_its_thread():
    from launcher.options import given, label, name, python_words

    assert (name("no_check"), name("hosts"), given("local", 2), given("gpus", (0, 1))) == (
        "--no-check", "-H", "--local 2", "--gpus 0,1")
    seen: list[str] = []
    with python_words():
        assert (name("no_check"), given("chief", True), label([("local", 2), ("gpus", (0, 1))])) == (
            "no_check", "chief=True", "launch(local=2, gpus=[0, 1])")
        other = threading.Thread(target=lambda: seen.append(name("no_check")))
        other.start()
        other.join(30)
    assert seen == ["--no-check"] and name("no_check") == "--no-check"
