"""Hangs that name their culprit, and ``tflaunch stacks``.

Fast tests check the pure parts on real data: the hang rule (launcher/run/faults/watchdog.py,
:func:`stalled`), py-spy's text (launcher/run/faults/pyspy.py) and the verdict (launcher/run/faults/hang_verdict.py)
on py-spy dumps captured from hung TensorFlow clusters (tests/fixtures/stacks/). Slow tests run
real tflaunch runs: small Python tasks for the control socket, three-task clusters of the
stand-in worker (tests/workers/lockstep.py, lock step over sockets) for the hangs themselves, and
one real MultiWorkerMirroredStrategy hang (tests/helpers/mwms_hang.py) whose culprit is named.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import LOCKSTEP, TASK
from launcher.records.control import SOCKET, short_path
from launcher.run.faults.hang_verdict import CULPRIT, NO_STACKS, SAME_PLACE, UNCLEAR, names, peer_groups, verdict
from launcher.run.faults.pyspy import LIBRARY, STDLIB, USER, kind_of, parse_dump
from launcher.run.faults.watchdog import Activity, cpu_over, stalled
from polling import wait_for

STACKS = Path(__file__).resolve().parents[2] / "fixtures" / "stacks"
HANG = str(Path(__file__).resolve().parents[2] / "helpers" / "mwms_hang.py")


def dumps_of(case: str) -> dict:
    return {path.stem: parse_dump(path.read_text()) for path in sorted((STACKS / case).glob("*.txt"))}


def roles_of(tasks) -> dict[str, str]:
    return {name: name.rsplit("-", 1)[0] for name in tasks}


def judge(dumps: dict):
    return verdict(dumps, roles_of(dumps))


# -- the hang rule -----------------------------------------------------------------------------------

NOW = 1_000.0


def idle(role: str = "worker", metric: float | None = None, share: float = 0.01) -> Activity:
    """A task sampled every second for the last 100 s, using ``share`` of a core."""
    return Activity(role, metric, tuple((t, share * (t - 900.0)) for t in range(900, 1001)))


@pytest.mark.parametrize("tasks, expected", [
    ({"worker-0": idle(), "worker-1": idle()}, True),
    ({"worker-0": idle(), "worker-1": idle(metric=NOW - 5)}, False),  # a metric line in the window
    ({"worker-0": idle(), "worker-1": idle(metric=NOW - 11)}, True),  # ... before it
    ({"worker-0": idle(), "worker-1": idle(share=0.5)}, False),  # computing without printing
    ({"chief-0": idle("chief", share=0.9), "worker-0": idle()}, False),  # the chief alone works (a checkpoint)
    ({"worker-0": idle(), "worker-1": idle(share=0.09)}, True),  # under a tenth of a core: waiting
    ({"chief-0": idle("chief"), "ps-0": idle("ps", share=1.0), "evaluator-0": idle("evaluator", share=1.0)},
     True),  # ps and evaluator are not watched...
    ({"ps-0": idle("ps"), "evaluator-0": idle("evaluator")}, False),  # ... so alone they never hang
    ({"worker-0": idle(), "worker-1": Activity("worker", None, ((996.0, 0.0), (1000.0, 0.0)))},
     False),  # sampled over half the window only: cannot tell yet
])
def test_the_hang_rule(tasks, expected):
    found = stalled(tasks, NOW, since=0.0, window=10.0)
    assert (found is not None) is expected
    if found is not None:
        assert set(found.cpu) == {name for name, a in tasks.items() if a.role in ("chief", "worker")}


def test_no_hang_in_the_attempts_first_window():
    tasks = {"worker-0": idle()}
    assert stalled(tasks, NOW, since=NOW - 10.0, window=10.0) is None
    assert stalled(tasks, NOW, since=NOW - 10.5, window=10.0) is not None


def test_a_task_never_sampled_is_judged_by_metrics_alone_after_a_grace():
    tasks = {"worker-0": idle(), "worker-1": Activity("worker")}
    assert stalled(tasks, NOW, since=NOW - 15.0, window=10.0) is None  # the agent may not have reported yet
    found = stalled(tasks, NOW, since=NOW - 25.0, window=10.0)
    assert found is not None and found.cpu["worker-1"] is None


@pytest.mark.parametrize("readings, share", [
    (((0.0, 0.0), (5.0, 1.0), (10.0, 2.0)), 0.2),
    (((0.0, 0.0), (4.0, 0.0), (10.0, 3.0)), 0.3),  # from the newest reading at or before the window's start
    (((2.0, 0.0), (10.0, 4.0)), 0.5),  # the first reading came after it: over what is covered
    (((6.0, 0.0), (10.0, 4.0)), None),  # less than half the window covered
    ((), None),
])
def test_cpu_over_the_window(readings, share):
    assert cpu_over(readings, start=0.0, window=10.0) == share


# -- py-spy's text ------------------------------------------------------------------------------------


def test_a_dump_parses_into_processes_threads_and_frames():
    dump = parse_dump((STACKS / "input-stall" / "worker-2.txt").read_text())
    assert dump.problem is None
    (process,) = dump.processes
    assert process.pid == 11449 and "mwms_hang.py input-stall" in process.command
    main, generator = process.threads
    assert (main.ident, main.state, main.name, main.label) == ("11449", "idle", "MainThread", "MainThread")
    assert str(main.frames[0]) == "quick_execute (tensorflow/python/eager/execute.py:53)"
    assert str(main.frames[-1]) == "<module> (mwms_hang.py:147)"
    assert (generator.label, str(generator.owner), str(generator.user_frame)) == (
        "thread 11825", "slow_source (mwms_hang.py:51)", "slow_source (mwms_hang.py:51)")
    assert str(main.owner) == "quick_execute (tensorflow/python/eager/execute.py:53)"
    assert str(main.user_frame) == "input_stall (mwms_hang.py:79)"


def test_a_thread_in_the_standard_library_belongs_to_the_code_that_called_it():
    chief = parse_dump((STACKS / "parameter-server" / "chief-0.txt").read_text())
    handler = next(t for t in chief.threads if t.name == "WorkerPreemptionHandler")
    assert str(handler.frames[0]) == "Condition.wait (threading.py:327)"
    assert handler.owner.function == "WorkerPreemptionHandler._preemption_handler"


@pytest.mark.parametrize("text, problem", [
    ("no stack dump: the task has ended\n", "no stack dump: the task has ended"),
    ("Error: Failed to find python version from target process\n", "Error: Failed to find python version"),
    ("", "py-spy printed nothing"),
])
def test_text_without_threads_is_a_dump_with_a_problem(text, problem):
    dump = parse_dump(text)
    assert dump.threads == [] and dump.problem.startswith(problem)


@pytest.mark.parametrize("path, kind", [
    ("tensorflow/python/eager/execute.py", LIBRARY), ("tf_keras/src/engine/training.py", LIBRARY),
    ("threading.py", STDLIB), ("concurrent/futures/thread.py", STDLIB), ("<frozen runpy>", STDLIB),
    ("/usr/lib/python3.11/threading.py", STDLIB), ("/opt/venv/lib/python3.11/site-packages/grpc/_channel.py", LIBRARY),
    ("__autograph_generated_filelw0shkm7.py", LIBRARY),
    ("mwms_hang.py", USER), ("trainer/fit_loop.py", USER), ("/home/me/train.py", USER), ("<string>", USER),
])
def test_frames_are_sorted_into_the_standard_library_libraries_and_the_users_code(path, kind):
    assert kind_of(path) == kind


# -- the verdict ---------------------------------------------------------------------------------------


def test_an_input_pipeline_stall_names_the_task_whose_generator_sleeps():
    found = judge(dumps_of("input-stall"))
    assert found.kind == CULPRIT and found.tasks == ("worker-2",)
    (place,) = found.culprits[0].places
    assert (place.thread, str(place.user)) == ("thread 11825", "slow_source (mwms_hang.py:51)")
    (others,) = found.others
    assert others.tasks == ("worker-0", "worker-1")
    assert found.summary() == (
        "worker-2 differs from the rest: thread 11825 in slow_source (mwms_hang.py:51); worker-0 and worker-1 are "
        "at: MainThread in quick_execute (tensorflow/python/eager/execute.py:53), from input_stall (mwms_hang.py:79)")


@pytest.mark.parametrize("culprit", ["chief-0", "worker-0", "worker-1"])
def test_the_culprit_is_found_in_any_role_and_position(culprit):
    # The chief's real dump waits in user code while the workers wait in the all-reduce; the same
    # files, renamed, put the waiting task anywhere in the cluster.
    real = dumps_of("barrier-wait-chief")
    waiting = real["chief-0"]
    in_collective = real["worker-0"]
    dumps = {name: waiting if name == culprit else in_collective for name in ("chief-0", "worker-0", "worker-1")}
    found = judge(dumps)
    assert found.tasks == (culprit,)
    assert found.culprits[0].describe() == "MainThread in wait_for_barrier_file (mwms_hang.py:86)"


@pytest.mark.parametrize("pair", [("worker-1", "worker-2"), ("worker-2", "worker-0")])
def test_of_two_tasks_the_one_stopped_in_user_code_is_named(pair):
    all_dumps = dumps_of("input-stall")
    found = judge({name: all_dumps[name] for name in pair})
    assert found.tasks == ("worker-2",)
    waiting = dumps_of("barrier-wait-chief")
    found = judge({"worker-0": waiting["chief-0"], "worker-1": waiting["worker-1"]})
    assert found.tasks == ("worker-0",)


def test_every_task_in_the_same_place_blames_none():
    found = judge(dumps_of("all-wait"))
    assert (found.kind, found.tasks) == (SAME_PLACE, ())
    assert found.summary().startswith("every task is in the same place (MainThread in wait_for_barrier_file "
                                      "(mwms_hang.py:86)): no task to blame")
    in_collective = dumps_of("barrier-wait-chief")
    found = judge({"worker-0": in_collective["worker-0"], "worker-1": in_collective["worker-1"]})
    assert (found.kind, found.tasks) == (SAME_PLACE, ())


def flagged(case: str, task: str, state: str):
    """A real dump with py-spy's idle/active flag of every thread set to ``state``."""
    text = (STACKS / case / f"{task}.txt").read_text()
    return parse_dump(text.replace(" (idle)", f" ({state})"))


@pytest.mark.parametrize("state", ["active", "active+gil"])
def test_the_same_frames_are_the_same_place_whether_idle_or_active(state):
    # py-spy's flag is the OS's view of the thread at the sampling moment: one of three tasks
    # waiting at the same line may come out active, and it is still where the others are.
    dumps = dumps_of("all-wait")
    dumps["worker-1"] = flagged("all-wait", "worker-1", state)
    found = judge(dumps)
    assert (found.kind, found.tasks) == (SAME_PLACE, ())
    (crowd,) = found.others
    assert crowd.tasks == ("worker-0", "worker-1", "worker-2")
    real = dumps_of("barrier-wait-chief")
    found = judge({"worker-0": real["worker-0"], "worker-1": flagged("barrier-wait-chief", "worker-1", state)})
    assert (found.kind, found.tasks) == (SAME_PLACE, ())


@pytest.mark.parametrize("state", ["idle", "active"])
def test_a_task_at_another_line_of_the_same_function_differs_whether_idle_or_active(state):
    # The line is what tells a stuck task from peers stopped in the same function.
    dumps = dumps_of("all-wait")
    moved = (STACKS / "all-wait" / "worker-2.txt").read_text().replace(" (idle)", f" ({state})").replace(
        "wait_for_barrier_file (mwms_hang.py:86)", "wait_for_barrier_file (mwms_hang.py:84)")
    dumps["worker-2"] = parse_dump(moved)
    found = judge(dumps)
    assert (found.kind, found.tasks) == (CULPRIT, ("worker-2",))
    assert found.culprits[0].describe() == "MainThread in wait_for_barrier_file (mwms_hang.py:84)"
    waiting = flagged("barrier-wait-chief", "chief-0", state)
    assert judge({**dumps_of("barrier-wait-chief"), "chief-0": waiting}).tasks == ("chief-0",)


def test_a_parameter_server_cluster_blames_neither_its_servers_nor_its_waiting_evaluator():
    found = judge(dumps_of("parameter-server"))
    assert found.tasks == ()
    assert peer_groups(roles_of(dumps_of("parameter-server"))) == [
        ["chief-0"], ["evaluator-0"], ["ps-0"], ["worker-0", "worker-1"]]


def test_a_tie_blames_no_task():
    real = dumps_of("barrier-wait-chief")
    halves = {f"worker-{i}": real["chief-0"] if i % 2 else real["worker-0"] for i in range(4)}
    assert judge(halves).kind == UNCLEAR


@pytest.mark.parametrize("count, odd, blamed", [
    (256, [255], [255]), (256, [0, 77], [0, 77]), (256, list(range(85)), list(range(85))),
    (256, list(range(86)), []),  # more than a third: no clear minority
    (256, list(range(128)), []),
])
def test_the_verdict_scales_to_256_tasks(count, odd, blamed):
    real = dumps_of("barrier-wait-chief")
    dumps = {f"worker-{i}": real["chief-0"] if i in odd else real["worker-0"] for i in range(count)}
    started = time.perf_counter()
    found = judge(dumps)
    assert found.tasks == tuple(f"worker-{i}" for i in blamed)
    assert time.perf_counter() - started < 5.0
    if blamed and len(blamed) > 4:
        assert f"{len(blamed)} tasks (worker-0, worker-1, worker-2, ...) differ" in found.summary()


def test_tasks_without_stacks_are_left_out_and_said():
    dumps = dumps_of("input-stall")
    dumps["worker-3"] = parse_dump("no stack dump: no answer from the agent on node2 within 10 s\n")
    found = judge(dumps)
    assert found.tasks == ("worker-2",)
    assert found.missing == (("worker-3", "no stack dump: no answer from the agent on node2 within 10 s"),)
    assert "(no stacks from worker-3: no stack dump: no answer" in found.summary()
    assert judge({"worker-0": parse_dump("")}).kind == NO_STACKS


def test_names_stay_short():
    assert names(["a"]) == "a" and names(["a", "b"]) == "a and b" and names(["a", "b", "c"]) == "a, b and c"
    assert names([f"w{i}" for i in range(9)]) == "9 tasks (w0, w1, w2, ...)"


def test_the_verdict_json_carries_the_evidence():
    data = judge(dumps_of("input-stall")).to_json()
    assert data["verdict"] == "culprit"
    assert data["culprits"] == [{"task": "worker-2", "role": "worker", "threads": [
        {"thread": "thread 11825", "function": "slow_source", "file": "mwms_hang.py", "line": 51,
         "innermost": "slow_source (mwms_hang.py:51)", "code": "user"}]}]
    assert data["others"][0]["tasks"] == ["worker-0", "worker-1"]
    assert data["others"][0]["threads"][0]["innermost"] == "quick_execute (tensorflow/python/eager/execute.py:53)"
    json.dumps(data)


def test_the_modules_do_not_import_tensorflow():
    code = ("import sys, launcher.run.faults.hang_verdict, launcher.run.faults.stacks_server, launcher.run.faults.watchdog, launcher.inspect.stacks; "
            "print('tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[3])
    assert out.stdout.strip() == "False"


def test_a_lone_parameter_server_chief_stopped_in_its_own_code_is_named():
    servers = dumps_of("parameter-server")
    dumps = {**servers, "chief-0": dumps_of("barrier-wait-chief")["chief-0"]}
    assert judge(dumps).tasks == ("chief-0",)


def test_report_shows_a_hangs_root_cause_under_its_first_line(tmp_path):
    from launcher.inspect.report import build_report, report_lines
    from launcher.inspect.runs import load_run
    from launcher.records.folder import RunFolder
    from launcher.records.record import RootCause, RunRecord
    from launcher.records.states import RunStatus

    found = judge(dumps_of("input-stall"))
    record = RunRecord("20261125-142402-c2ea", "--local 3", status=RunStatus.FAILED, exit_code=124,
                       started_at="2026-11-25T14:24:02.000+00:00",
                       root_cause=RootCause("worker-2", "localhost", diagnosis={"rule": "hang", "summary": found.summary()}))
    folder = RunFolder(tmp_path / record.run_id)
    folder.path.mkdir()
    folder.write_record(record, final=True)
    (folder.path / "metrics.jsonl").write_text(json.dumps({"kind": "epoch", "task": "worker-0", "epoch": 1,
                                                           "loss": 0.5, "attempt": 1, "time": 1.0}) + "\n")
    lines = report_lines(build_report(load_run(folder.path)))
    assert lines[1] == f"root cause: worker-2 on localhost: {found.summary()}"


# -- the control socket and `tflaunch stacks`, on small Python tasks -------------------------------------

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
ROOT = Path(__file__).resolve().parents[3]


def running_run(tflaunch, proc) -> Path:
    """The run folder of a started tflaunch once its socket serves and every task has a pid."""
    def ready():
        if proc.poll() is not None:
            pytest.fail(f"tflaunch ended early: {proc.stderr.read()[-2000:]}", pytrace=False)
        run_dir = tflaunch.latest_run()
        if not run_dir or not (run_dir / "control.sock").exists():
            return None
        record = json.loads((run_dir / "run.json").read_text())
        return run_dir if all(t.get("pid") for t in record["tasks"]) else None
    return wait_for(ready, timeout=60, message="the run to start its tasks")


def stop(proc) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)


def stacks(tflaunch, *args: str, user: list[str] = (), cwd: Path | None = None) -> subprocess.CompletedProcess:
    argv = [*user, sys.executable, "-m", "launcher", "stacks", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=cwd or tflaunch.cwd,
                          env=tflaunch.env())


def sleepers(tflaunch, *extra: str) -> subprocess.Popen:
    """Three tasks asleep at one line of task.py, worker-1 at another."""
    return tflaunch.start("--local", "3", *extra, "--", "python", TASK, "print:up", "sleep-if:worker-1:600", "forever")


def test_stacks_of_a_running_run_name_the_odd_task_and_leave_the_run_alone(tflaunch, tmp_path):
    tflaunch.log_dir = tmp_path / ("deep-" * 20) / "logs"  # a socket path over Unix's limit of ~107 bytes
    proc = sleepers(tflaunch)
    try:
        run_dir = running_run(tflaunch, proc)
        assert len(str(run_dir / "control.sock")) > 110
        assert (run_dir / "control.sock").stat().st_mode & 0o777 == 0o600
        started = time.monotonic()
        shown = stacks(tflaunch, "--log-dir", str(tflaunch.log_dir))
        assert time.monotonic() - started < 10.0
        assert shown.returncode == 0, shown.stderr
        lines = shown.stdout.splitlines()
        assert lines[0].startswith(f"run {run_dir.name}, attempt 1: stacks of 3 running tasks")
        assert lines[1].startswith("verdict: worker-1 differs from the rest: MainThread in main (task.py:")
        assert sum(line.startswith("== worker-") for line in lines) == 3
        by_path = json.loads(stacks(tflaunch, str(run_dir), "--json").stdout)  # RUN as the folder's path
        by_prefix = json.loads(stacks(tflaunch, run_dir.name[:17], "--json", "--log-dir", str(tflaunch.log_dir)).stdout)
        for answer in (by_path, by_prefix):
            assert answer["verdict"]["culprits"][0]["task"] == "worker-1"
            assert {t["name"] for t in answer["tasks"]} == {"worker-0", "worker-1", "worker-2"}
            assert all("task.py" in t["stacks"] for t in answer["tasks"])
        assert proc.poll() is None  # the run goes on
        record = json.loads((run_dir / "run.json").read_text())
        assert record["status"] == "running" and {t["state"] for t in record["tasks"]} == {"running"}
    finally:
        stop(proc)
    assert proc.returncode == 130
    assert not (run_dir / "control.sock").exists()
    ended = stacks(tflaunch, str(run_dir))
    assert ended.returncode == 2
    assert ended.stderr.strip() == (f"tflaunch: error: run {run_dir.name} is not running (stopped): "
                                    "'tflaunch stacks' asks a running run's tflaunch")


def test_a_folder_that_cannot_hold_the_socket_costs_the_run_nothing_but_stacks(tmp_path):
    from launcher.records.folder import RunFolder
    from launcher.records.control import ControlError, ask
    from launcher.run.faults.stacks_server import ControlServer

    gone = tmp_path / "20261125-142402-c2ea"  # removed under the run, say
    server = ControlServer(RunFolder(gone), lambda: None).start()
    server.close()
    with pytest.raises(ControlError, match="has no control socket"):
        ask(gone, gone.name, {"op": "stacks"})


@pytest.fixture
def descriptors_past_1024():
    """This process holds 1,100 more descriptors while the test runs: every one it makes now is
    numbered past 1024, as in a tflaunch of a few hundred hosts (three descriptors each)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1300:
        pytest.skip(f"the hard limit on open files here is {hard}, under the 1,300 this needs")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1300) if hard == resource.RLIM_INFINITY
                                                else min(hard, max(soft, 1300)), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_control_server_and_the_signal_wait_serve_descriptors_past_1024(tmp_path, descriptors_past_1024):
    # select() refuses a descriptor numbered 1024 or more; these waits use poll().
    from launcher.records.control import ControlError, ask
    from launcher.records.folder import RunFolder
    from launcher.run.faults.stacks_server import ControlServer
    from launcher.run.lifecycle.signals import Signals

    run_dir = tmp_path / "20261128-101500-abcd"
    run_dir.mkdir()
    server = ControlServer(RunFolder(run_dir), lambda: None).start()
    try:
        assert server._listener.fileno() > 1024
        with pytest.raises(ControlError, match="has no running task right now"):
            ask(run_dir, run_dir.name, {"op": "stacks"}, timeout=5)
    finally:
        server.close()
    signals = Signals()
    try:
        started = time.monotonic()
        assert signals.wait(0.05) is None and time.monotonic() - started >= 0.04
    finally:
        signals.close()


@pytest.fixture
def shared_dir(folder_for_others):
    """A folder another user can traverse but not write."""
    return folder_for_others(0o755)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user with setpriv")
def test_another_user_cannot_ask_for_the_stacks_even_through_an_open_socket(tflaunch, shared_dir):
    tflaunch.log_dir = shared_dir / "logs"
    proc = sleepers(tflaunch)
    try:
        run_dir = running_run(tflaunch, proc)
        # The run folder is its owner's alone: another user cannot even find the run, and says so in one line.
        hidden = stacks(tflaunch, "--log-dir", str(tflaunch.log_dir), user=NOBODY, cwd=shared_dir)
        assert hidden.returncode == 2
        assert hidden.stderr.strip() == (f"tflaunch: error: log directory {tflaunch.log_dir}/ cannot be read by you: "
                                         f"a run folder is its owner's alone (docs/security.md)")
        # Folders opened to everyone by their owner: the socket's owner check still refuses.
        tflaunch.log_dir.chmod(0o755)
        run_dir.chmod(0o755)
        (run_dir / "run.json").chmod(0o644)
        refused = stacks(tflaunch, "--log-dir", str(tflaunch.log_dir), user=NOBODY, cwd=shared_dir)
        assert refused.returncode == 2
        assert refused.stderr.strip() == (f"tflaunch: error: run {run_dir.name} belongs to another user: only the "
                                          f"user who started it may ask for its stacks ({run_dir / 'control.sock'})")
        # Even with the socket opened to everyone, tflaunch checks who is asking and says nothing.
        (run_dir / "control.sock").chmod(0o666)
        peek = ("import socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\n"
                "try:\n    s.sendall(b'{\"op\": \"stacks\"}\\n')\n    print(repr(s.recv(1000)))\n"
                "except OSError as e:\n    print('closed', e.errno)")
        answered = subprocess.run([*NOBODY, sys.executable, "-c", peek, str(run_dir / "control.sock")],
                                  capture_output=True, text=True, timeout=60, cwd=shared_dir)
        assert answered.stdout.strip() in ("b''", "closed 32", "closed 104"), answered.stderr  # nothing, or EPIPE
        closed = stacks(tflaunch, "--log-dir", str(tflaunch.log_dir), user=NOBODY, cwd=shared_dir)
        # The asker checks who serves too: root's tflaunch is not nobody's, so nobody does not ask it.
        assert closed.returncode == 2 and "control.sock is served by uid 0, not by you" in closed.stderr
        assert len(closed.stderr.strip().splitlines()) == 1
        mine = stacks(tflaunch, "--log-dir", str(tflaunch.log_dir))
        assert mine.returncode == 0 and "verdict: worker-1 differs" in mine.stdout
        assert proc.poll() is None
    finally:
        stop(proc)


def dial(run_dir: Path) -> socket.socket:
    """A client of the run's control socket, however deep its folder (the way tflaunch dials it)."""
    client = socket.socket(socket.AF_UNIX)
    with short_path(run_dir, SOCKET) as address:
        client.connect(address)
    return client


def test_silent_or_oversized_clients_cannot_hold_the_socket(tflaunch):
    proc = sleepers(tflaunch)
    silent = []
    try:
        run_dir = running_run(tflaunch, proc)
        for _ in range(8):  # every slot taken by a client that never says anything
            silent.append(dial(run_dir))
        wait_for(lambda: stacks(tflaunch, "--log-dir", str(tflaunch.log_dir)).returncode == 2, timeout=30,
                 message="a request beyond the slots to be turned away")
        for client in silent:
            client.close()
        silent.clear()
        silent.append(dial(run_dir))  # one silent client costs one slot, not the socket
        shown = stacks(tflaunch, "--log-dir", str(tflaunch.log_dir))
        assert shown.returncode == 0 and "verdict: worker-1 differs" in shown.stdout
        big = dial(run_dir)
        big.sendall(b"x" * 5000)
        answer = json.loads(big.makefile("rb").readline())
        big.close()
        assert answer == {"ok": False, "error": "request longer than 4096 bytes"}
        odd = dial(run_dir)
        odd.sendall(b'{"op": "shutdown"}\n')
        assert json.loads(odd.makefile("rb").readline()) == {"ok": False,
                                                             "error": "unknown request 'shutdown' (known: 'stacks')"}
        odd.close()
        assert proc.poll() is None
    finally:
        for client in silent:
            client.close()
        stop(proc)


# -- hangs of lock-step clusters: the stand-in worker, and one real MultiWorkerMirroredStrategy hang ------

HANG_TIMEOUT = 6
PEERS = str(Path(LOCKSTEP).with_name("peers.py"))
WAITING_IN_TF = "quick_execute (tensorflow/python/eager/execute.py:53)"  # a MWMS task waiting in the all-reduce


def line_of(marker: str, path: str = HANG) -> int:
    """The line of ``path`` (tests/helpers/mwms_hang.py) that holds ``marker``."""
    return next(n for n, text in enumerate(Path(path).read_text().splitlines(), 1) if marker in text)


def hung_run(tflaunch, cluster: list[str], mode: str, culprit: str = "", *extra: str, timeout: float = 240):
    return tflaunch.run(*cluster, "--hang-timeout", str(HANG_TIMEOUT), "--grace", "1", *extra, "--",
                        "python", HANG, mode, culprit, timeout=timeout)


def hung_stand_in(tflaunch, cluster: list[str], *knobs: str, timeout: float = 120):
    """A stand-in cluster run with the hang timeout; ``knobs`` are its LOCKSTEP_* settings (``NAME=VALUE``)."""
    settings = [arg for knob in knobs for arg in ("--env", knob)]
    return tflaunch.run(*cluster, "--hang-timeout", str(HANG_TIMEOUT), "--grace", "1", *settings, "--",
                        "python", LOCKSTEP, "--epochs", "1000", "--step-metrics", timeout=timeout)


def in_exchange() -> str:
    """Where a stand-in task waits for a late peer: its main thread in a socket read."""
    return f"read_exactly (peers.py:{line_of('# a late peer keeps the main thread here', PEERS)})"


HUNG_HERE = "# the task hangs here"  # the stand-in's line in hang_in_exchange


def check_named(done, culprit: str, function: str, line: int, thread: str = "MainThread", script: str = "lockstep.py",
                others_wait: str | None = None) -> dict:
    """The run failed as hung, naming ``culprit`` first: on the console, in run.json and beside the stacks;
    the others' main threads wait at ``others_wait`` (the stand-in's exchange unless given)."""
    assert done.returncode == 124, done.stderr[-3000:]
    record = done.record
    attempt = record["attempts"][0]
    assert attempt["blamed_tasks"] == [culprit]
    where = f"{function} ({script}:{line})"
    assert attempt["reason"].startswith(f"hang timeout: no training progress for {HANG_TIMEOUT} s; {culprit} differs "
                                        f"from the rest: "), attempt["reason"]
    failed = next(line for line in done.stderr.splitlines() if "failed: hang timeout" in line)
    assert f"{culprit} differs from the rest: " in failed and where in failed, failed
    assert done.stderr.index(failed) < done.stderr.index("tasks:")  # the culprit comes first
    root = record["root_cause"]
    assert root["task"] == culprit and root["diagnosis"]["rule"] == "hang"
    (named,) = root["diagnosis"]["evidence"]["culprits"]
    evidence = named["threads"][0]
    assert (evidence["function"], evidence["file"], evidence["line"]) == (function, script, line), named
    if thread:
        assert evidence["thread"] == thread
    others = root["diagnosis"]["evidence"]["others"]
    waiting = others_wait or in_exchange()
    assert others and all(t["innermost"] == waiting
                          for crowd in others for t in crowd["threads"] if t["thread"] == "MainThread"), others
    stacks = done.run_dir / "attempt-1" / "stacks"
    filed = json.loads((stacks / "verdict.json").read_text())
    assert filed["culprits"] == root["diagnosis"]["evidence"]["culprits"]
    assert {p.name for p in stacks.glob("*.txt")} == {f"{t['name']}.txt" for t in record["tasks"]}
    # Declared no sooner than the hang timeout after the last step any task reported.
    last_step = max(m["time"] for m in map(json.loads, (done.run_dir / "metrics.jsonl").read_text().splitlines()))
    declared = json.loads((stacks / "verdict.json").read_text())["declared_at"]
    from datetime import datetime
    assert datetime.fromisoformat(declared).timestamp() - last_step >= HANG_TIMEOUT
    return root


@pytest.mark.alone  # a 6 s hang timeout: a slow start on a loaded machine would look like a hang
@pytest.mark.slow
@pytest.mark.tensorflow
def test_an_input_pipeline_stall_is_declared_and_its_worker_named(tflaunch):
    done = hung_run(tflaunch, ["--local", "3"], "input-stall", "worker-2")
    root = check_named(done, "worker-2", "slow_source", line_of("the input pipeline stalls here"), thread="",
                       script="mwms_hang.py", others_wait=WAITING_IN_TF)
    assert root["diagnosis"]["evidence"]["culprits"][0]["threads"][0]["thread"].startswith("thread ")
    assert "STALLED" in "\n".join(root["tail"])
    shown = subprocess.run(tflaunch.argv("report", done.run_dir.name, "--log-dir", str(tflaunch.log_dir)),
                           capture_output=True, text=True, cwd=tflaunch.cwd, env=tflaunch.env())
    assert shown.returncode == 2  # no epochs to show, but the root cause all the same
    assert "; root cause: worker-2 on localhost: worker-2 differs from the rest: thread " in shown.stderr


@pytest.mark.slow
@pytest.mark.parametrize("culprit", ["chief-0", "worker-0"])
def test_a_task_waiting_in_user_code_between_steps_is_named_in_any_role(tflaunch, culprit):
    done = hung_stand_in(tflaunch, ["--local", "2", "--chief"], f"LOCKSTEP_HANG={culprit}=4")
    check_named(done, culprit, "hang_in_exchange", line_of(HUNG_HERE, LOCKSTEP))


@pytest.mark.slow
def test_a_stuck_worker_that_keeps_logging_is_declared_hung(tflaunch):
    done = hung_stand_in(tflaunch, ["--local", "3"], "LOCKSTEP_HANG=worker-1=4", "LOCKSTEP_HANG_LOG=1")
    check_named(done, "worker-1", "hang_in_exchange", line_of(HUNG_HERE, LOCKSTEP))
    retries = done.task_output("worker-1").count("is not there yet; retrying")
    assert retries >= HANG_TIMEOUT  # it logged all along, and the hang was declared all the same


@pytest.mark.slow
def test_every_task_waiting_in_the_same_place_blames_no_task(tflaunch):
    done = hung_stand_in(tflaunch, ["--local", "3"], "LOCKSTEP_HANG=4")
    assert done.returncode == 124, done.stderr[-3000:]
    attempt = done.record["attempts"][0]
    assert attempt["blamed_tasks"] == [] and done.record["root_cause"] is None
    assert (f"every task is in the same place (MainThread in hang_in_exchange (lockstep.py:"
            f"{line_of(HUNG_HERE, LOCKSTEP)}); input in ") in attempt["reason"], attempt["reason"]
    # ... and their input threads, full, wait in one place too
    assert (f"from slow_source (lockstep.py:{line_of('batches.put(produced)', LOCKSTEP)})): no task to blame"
            in attempt["reason"]), attempt["reason"]
    assert json.loads((done.run_dir / "attempt-1" / "stacks" / "verdict.json").read_text())["verdict"] == "same-place"


@pytest.mark.alone  # three tasks must each keep over a tenth of a core busy: nothing else may take the CPU
@pytest.mark.slow
def test_tasks_computing_longer_than_the_hang_timeout_without_printing_are_not_hung(tflaunch):
    seconds = 2.5 * HANG_TIMEOUT  # silent for well past the hang timeout
    done = tflaunch.run("--local", "3", "--hang-timeout", str(HANG_TIMEOUT), "--env", f"LOCKSTEP_SILENT={seconds}",
                        "--", "python", LOCKSTEP, "--epochs", "1", timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not (done.run_dir / "attempt-1" / "stacks").exists()
    assert "no training progress" not in done.stderr
    for name in ("worker-0", "worker-1", "worker-2"):
        assert f"{name}: " in done.task_output(name) and "silent steps in" in done.task_output(name)


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user with setpriv")
def test_stacks_of_a_hung_lock_step_run_name_its_culprit_for_its_owner_only(tflaunch, shared_dir):
    tflaunch.log_dir = shared_dir / "logs"
    proc = tflaunch.start("--local", "3", "--grace", "1", "--env", "LOCKSTEP_INPUT_STALL=worker-1=4", "--",
                          "python", LOCKSTEP, "--epochs", "1000")
    try:
        run_dir = running_run(tflaunch, proc)
        wait_for(lambda: "STALLED" in tflaunch.merged_text(), timeout=180, message="worker-1's input to stall")

        def named():
            shown = stacks(tflaunch, "--log-dir", str(tflaunch.log_dir), "--json")
            assert shown.returncode == 0, shown.stderr
            return json.loads(shown.stdout) if json.loads(shown.stdout)["verdict"]["verdict"] == "culprit" else None
        answer = wait_for(named, timeout=60, interval=1.0, message="the other workers to wait in the all-reduce")
        (culprit,) = answer["verdict"]["culprits"]
        assert culprit["task"] == "worker-1"
        # Its input thread stalled in slow_source, and its main thread waits for that input.
        assert {(t["thread"], t["function"], t["line"]) for t in culprit["threads"]} >= {
            ("input", "slow_source", line_of("the input pipeline stalls here", LOCKSTEP)),
            ("MainThread", "train", line_of("batches.get()", LOCKSTEP))}, culprit["threads"]
        assert answer["seconds"] < 5.0
        # Another user finds no run to ask (its folder is its owner's alone), in one line.
        refused = stacks(tflaunch, "--log-dir", str(tflaunch.log_dir), user=NOBODY, cwd=shared_dir)
        assert refused.returncode == 2 and "cannot be read by you" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
        assert proc.poll() is None and json.loads((run_dir / "run.json").read_text())["status"] == "running"
    finally:
        stop(proc)


@pytest.mark.slow
@pytest.mark.ssh
def test_the_culprit_of_a_hang_across_ssh_hosts_is_named_through_the_agents(tflaunch, testhosts, tmp_path):
    node1, node2 = testhosts.hosts[:2]
    port = testhosts.port(span=2)
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(f"ssh:\n  options: {json.dumps(testhosts.ssh_options)}\n  connect_timeout: 3\n"
                       "worker:\n"
                       f"  - host: node1\n    address: {node1.address}\n    port: {port}\n"
                       f"  - host: node1\n    address: {node1.address}\n    port: {port + 1}\n"
                       f"  - host: node2\n    address: {node2.address}\n    port: {port}\n")
    done = hung_stand_in(tflaunch, [str(cluster)], "LOCKSTEP_HANG=worker-2=4")
    root = check_named(done, "worker-2", "hang_in_exchange", line_of(HUNG_HERE, LOCKSTEP))
    assert root["host"] == "node2"
    for name in ("worker-0", "worker-1", "worker-2"):
        assert "lockstep.py" in (done.run_dir / "attempt-1" / "stacks" / f"{name}.txt").read_text()
    assert {t["host"] for t in done.record["tasks"]} == {"node1", "node2"}


# Not alone, so that the Slurm tier's one cluster serves it: a hang timeout of 10 s outlasts a slow start
# of tasks that print one line and sleep.
@pytest.mark.slow
@pytest.mark.slurm
def test_the_culprit_of_a_hang_inside_a_slurm_allocation_is_named_through_the_agents(testslurm, tmp_path):
    logs = tmp_path / "logs"
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\nexec {sys.executable} -m launcher --slurm --hang-timeout 10 --grace 1 "
                      f"--log-dir {logs} -- python {TASK} print:up sleep-if:worker-3:600 forever\n")
    out = tmp_path / "job.out"
    try:
        done = testslurm.run("sbatch", "--wait", f"--output={out}", f"--chdir={tmp_path}", "--nodes=2",
                             "--ntasks-per-node=2", f"--export=ALL,PYTHONPATH={ROOT}", str(script), timeout=240)
        assert done.returncode == 124, out.read_text()[-3000:]
        (run_dir,) = logs.iterdir()
        record = json.loads((run_dir / "run.json").read_text())
        assert record["attempts"][0]["blamed_tasks"] == ["worker-3"]
        assert record["root_cause"]["task"] == "worker-3" and record["root_cause"]["host"] == testslurm.nodes[1]
        (culprit,) = record["root_cause"]["diagnosis"]["evidence"]["culprits"]
        assert (culprit["threads"][0]["function"], culprit["threads"][0]["file"]) == ("main", "task.py")
        assert "worker-3 differs from the rest: MainThread in main (task.py:" in out.read_text()
    finally:
        testslurm.wait_idle(timeout=30)
        testslurm.cancel_all()
