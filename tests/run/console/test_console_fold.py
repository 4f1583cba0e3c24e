"""The console's folding: the same line from many tasks printed once under a range of names.

Pure tests of the rule (:class:`TwinFolder`, :func:`names_text`), the console in-process, the
closing table's folding, and real runs: 256 local tasks, and a line that must not wait for twins
that never come.
"""

from __future__ import annotations

import fcntl
import io
import random
import re
import threading
import time

import pytest

from conftest import TASK
from console_names import console_lines, expand
from launcher.cluster.commands import LEGACY_KERAS_NOTE
from launcher.records.states import TaskState
from launcher.run.console.writer import Console
from launcher.run.console.chatter import twin_key
from launcher.run.lifecycle.summary import FOLD_FROM, task_table
from launcher.run.lifecycle.task import Task
from launcher.run.console.twins import HOLD, TwinFolder, index_ranges, names_text
from launcher.transports.base import ExitStatus
from polling import wait_for


# ---------------------------------------------------------------------------------------------
# Names as ranges


def test_names_of_one_role_become_a_range():
    assert names_text(["worker-3"]) == "worker-3"
    assert names_text([f"worker-{i}" for i in range(16)]) == "worker-[0-15]"
    assert names_text(["worker-0", "worker-1"]) == "worker-[0,1]"
    assert names_text(["worker-9", "worker-0", "worker-3", "worker-2", "worker-1", "worker-5", "worker-8",
                       "worker-7"]) == "worker-[0-3,5,7-9]"
    assert names_text(["worker-2", "worker-2"]) == "worker-2"


def test_several_roles_keep_the_order_they_come_in():
    assert names_text(["chief-0", *(f"worker-{i}" for i in range(15))]) == "chief-0,worker-[0-14]"
    assert names_text(["worker-1", "ps-0", "worker-0", "ps-1"]) == "worker-[0,1],ps-[0,1]"


def test_a_name_that_is_not_role_index_stands_as_itself():
    assert names_text(["worker-01", "launcher", "worker-1"]) == "worker-01,launcher,worker-1"


def test_index_ranges():
    assert index_ranges([0, 1, 2, 3, 5, 7, 8, 9]) == "0-3,5,7-9"
    assert index_ranges([4]) == "4" and index_ranges([4, 5]) == "4,5" and index_ranges([4, 5, 6]) == "4-6"


@pytest.mark.parametrize("seed", range(5))
def test_every_label_reads_back_as_the_names_it_was_made_of(seed):
    rng = random.Random(seed)
    names = sorted({f"{rng.choice(['chief', 'worker', 'ps'])}-{rng.randrange(40)}" for _ in range(30)})
    assert sorted(expand(names_text(names))) == names


# ---------------------------------------------------------------------------------------------
# The folding rule, with the time given


def test_lines_of_several_tasks_within_the_hold_print_once():
    folder = TwinFolder(hold=0.5)
    for i in range(16):
        folder.add_block(f"worker-{i}", b"WARNING: same\n" + b"mine %d\n" % i, now=10.0 + i * 0.01)
    assert folder.due(10.49) == []  # the first copy has waited less than the hold
    out = folder.due(10.5)
    assert out[0] == ([f"worker-{i}" for i in range(16)], b"WARNING: same")
    assert len(out) == 1 + 1  # the shared line, and worker-0's own line that came right after it
    rest = folder.due(11.0)
    assert [line for _, line in rest] == [b"mine %d" % i for i in range(1, 16)]
    assert folder.next_due() is None


def test_a_copy_after_the_line_printed_starts_a_line_of_its_own():
    folder = TwinFolder(hold=0.5)
    folder.add("worker-0", b"epoch done", 0.0)
    assert folder.due(0.5) == [(["worker-0"], b"epoch done")]
    folder.add("worker-1", b"epoch done", 0.6)
    assert folder.next_due() == pytest.approx(1.1)
    assert folder.flush() == [(["worker-1"], b"epoch done")]


def test_a_task_that_repeats_a_line_gets_both_copies():
    folder = TwinFolder()
    folder.add_block("worker-0", b"x\nx\n", 0.0)
    folder.add_block("worker-1", b"x\n", 0.1)
    assert folder.flush() == [(["worker-0", "worker-1"], b"x"), (["worker-0"], b"x")]


def test_each_tasks_order_is_kept_when_tasks_print_the_same_lines_in_another_order():
    folder = TwinFolder()
    folder.add_block("worker-0", b"a\nb\n", 0.0)
    folder.add_block("worker-1", b"b\na\n", 0.1)
    # worker-1 joins "b", so its "a" comes after: joining worker-0's "a" would print it first.
    assert folder.flush() == [(["worker-0"], b"a"), (["worker-0", "worker-1"], b"b"), (["worker-1"], b"a")]


def test_a_flood_prints_its_oldest_lines_early_instead_of_holding_them_all():
    folder = TwinFolder(hold=0.5, max_waiting=100)
    folder.add_block("worker-0", b"".join(b"line %d\n" % i for i in range(250)), 0.0)
    early = folder.due(0.0)
    assert [line for _, line in early] == [b"line %d" % i for i in range(150)]
    assert len(folder) == 100


@pytest.mark.parametrize("seed", range(20))
def test_nothing_is_dropped_and_each_tasks_order_is_kept(seed):
    rng = random.Random(seed)
    tasks = [f"worker-{i}" for i in range(6)]
    vocabulary = [b"common %d" % i for i in range(5)]
    written: dict[str, list[bytes]] = {task: [] for task in tasks}
    folder = TwinFolder(hold=0.5, max_waiting=rng.choice([3, 50, 10_000]))
    printed: list[tuple[list[str], bytes]] = []
    now = 0.0
    for _ in range(300):
        task = rng.choice(tasks)
        lines = [rng.choice(vocabulary) if rng.random() < 0.8 else b"own %d" % rng.randrange(1000)
                 for _ in range(rng.randint(1, 4))]
        written[task] += lines
        folder.add_block(task, b"".join(line + b"\n" for line in lines), now)
        now += rng.choice([0.0, 0.01, 0.2, 0.7])
        printed += folder.due(now)
    printed += folder.flush()
    seen: dict[str, list[bytes]] = {task: [] for task in tasks}
    for names, line in printed:
        assert len(set(names)) == len(names)  # a task appears once in a line
        for name in names:
            seen[name].append(line)
    assert seen == written
    assert len(printed) < sum(map(len, written.values()))  # and something did fold


def test_tensorflow_lines_that_differ_only_in_time_and_thread_are_twins():
    glog = [b"W0000 00:00:1795426522.929680    8464 ops.cc:12] gradient clipping is off",
            b"W0000 00:00:1795426523.100001    9191 ops.cc:12] gradient clipping is off"]
    old = [b"2026-11-23 10:15:26.123456: W tensorflow/core/x.cc:182] slow step",
           b"2026-11-23 10:15:27.000001: W tensorflow/core/x.cc:182] slow step"]
    assert twin_key(glog[0]) == twin_key(glog[1]) and twin_key(old[0]) == twin_key(old[1])
    # The level, the source line and the message still count.
    assert twin_key(glog[0]) != twin_key(glog[0].replace(b"W0000", b"E0000"))
    assert twin_key(glog[0]) != twin_key(glog[0].replace(b"ops.cc:12", b"ops.cc:13"))
    assert twin_key(glog[0]) != twin_key(glog[0] + b"!")
    assert twin_key(b"not a log line") == b"not a log line"
    assert twin_key(b"W0000 00:00:1795426522.929680    8464 no source here") != \
        twin_key(b"W0000 00:00:1795426523.000000    8465 no source here")
    folder = TwinFolder()
    folder.add_block("worker-0", glog[0] + b"\n", 0.0)
    folder.add_block("worker-1", glog[1] + b"\n", 0.1)
    assert folder.flush() == [(["worker-0", "worker-1"], glog[0])]  # shown with the first task's stamp


# ---------------------------------------------------------------------------------------------
# The console in-process


def test_the_console_folds_sixteen_tasks_and_keeps_unique_lines():
    out, err = io.StringIO(), io.StringIO()
    console = Console(out, messages=err, colour=False)
    names = [f"worker-{i}" for i in range(16)]
    console.register(names)
    for name in names:
        console.task_block(name, b"WARNING: one\nWARNING: two\nWARNING: three\n" + f"I am {name}\n".encode())
    console.message("the end")
    console.close()
    assert out.getvalue() == ("worker-[0-15] | WARNING: one\nworker-[0-15] | WARNING: two\n"
                              "worker-[0-15] | WARNING: three\n"
                              + "".join(f"{name.ljust(9)} | I am {name}\n" for name in names))
    assert err.getvalue() == "tflaunch: the end\n"


def test_a_waiting_line_never_waits_for_close_and_messages_come_after_it():
    out, err = io.StringIO(), io.StringIO()
    console = Console(out, messages=err, colour=False)
    console.register(["worker-0", "worker-1"])
    console.task_block("worker-0", b"alone\n")
    started = time.monotonic()
    wait_for(lambda: out.getvalue() == "worker-0 | alone\n", timeout=5, interval=0.02,
             message=lambda: f"the line on the console; so far {out.getvalue()!r}")
    assert time.monotonic() - started >= HOLD - 0.05  # it did wait for twins
    console.task_block("worker-1", b"before the message\n")
    console.message("a message")
    console.close()
    assert out.getvalue() == "worker-0 | alone\nworker-1 | before the message\n"


def test_verbose_and_a_single_shown_task_do_not_fold():
    for options in ({"verbose": True}, {"tasks": ["worker-1"]}):
        out = io.StringIO()
        console = Console(out, messages=io.StringIO(), colour=False, **options)
        console.register(["worker-0", "worker-1"])
        console.task_block("worker-0", b"same\n")
        console.task_block("worker-1", b"same\n")
        console.close()
        expected = "worker-1 | same\n" if "tasks" in options else "worker-0 | same\nworker-1 | same\n"
        assert out.getvalue() == expected, options


def test_a_folded_label_is_bold_and_in_no_tasks_colour():
    out = io.StringIO()
    console = Console(out, messages=io.StringIO(), colour=True)
    console.register(["worker-0", "worker-1"])
    console.task_block("worker-0", b"same\n")
    console.task_block("worker-1", b"same\n")
    console.close()
    assert out.getvalue() == "\x1b[1mworker-[0,1]\x1b[0m | same\n"


# ---------------------------------------------------------------------------------------------
# The closing table


def table_task(index: int, state: TaskState, status: ExitStatus | None, role: str = "worker") -> Task:
    from launcher.cluster.plan import TaskLaunch

    launch = TaskLaunch(name=f"{role}-{index}", role=role, index=index, host=f"node{index % 2}",
                        address="node:1", local=False, argv=("true",), env={}, workdir="/")
    return Task(launch=launch, state=state, status=status, started_at=1.0)


def cells_of(lines: list[str]) -> list[list[str]]:
    return [[cell.strip() for cell in line.split("  ") if cell.strip()] for line in lines[1:]]


def test_the_table_folds_alike_tasks_from_eight_on():
    ok, term = ExitStatus(code=0), ExitStatus(signal=15)
    tasks = [table_task(0, TaskState.SUCCEEDED, ok, role="chief")]
    tasks += [table_task(i, TaskState.SUCCEEDED, ok) for i in range(6)]
    tasks += [table_task(6, TaskState.STOPPED, term)]
    usage = {t.name: {"rss_mb_peak": 700.0 + i, "cpu_percent_mean": 50.0 + i, "cpu_percent_peak": 90.0 + i}
             for i, t in enumerate(tasks)}
    usage["worker-4"] = {"rss_mb_peak": 2900.0, "cpu_percent_mean": 55.0, "cpu_percent_peak": 99.0}  # an outlier
    assert len(tasks) == FOLD_FROM
    assert cells_of(task_table(tasks, usage)) == [
        ["chief-0,worker-[0-3,5] (6 tasks)", "2 hosts", "succeeded", "exit code 0", "706 MB", "53 %", "96 %"],
        ["worker-4", "node0", "succeeded", "exit code 0", "2,900 MB", "55 %", "99 %"],
        ["worker-6", "node0", "stopped", "SIGTERM from tflaunch", "707 MB", "57 %", "97 %"],
    ]
    assert len(task_table(tasks[:FOLD_FROM - 1], usage)) == FOLD_FROM  # seven tasks: a row each


def test_a_busy_task_keeps_a_row_of_its_own_and_tasks_never_measured_join_any_row():
    ok = ExitStatus(code=0)
    tasks = [table_task(i, TaskState.SUCCEEDED, ok) for i in range(10)]
    usage = {f"worker-{i}": {"rss_mb_peak": 400.0, "cpu_percent_mean": 30.0, "cpu_percent_peak": 60.0}
             for i in range(1, 6)}
    usage["worker-2"]["cpu_percent_mean"] = 95.0
    usage["worker-5"]["rss_mb_peak"] = 350.0  # within a quarter: alike
    usage["worker-7"] = {"rss_mb_peak": 290.0}  # 290 to 400 is more than a quarter of 400: a row of its own
    assert [row[0] for row in cells_of(task_table(tasks, usage))] == [
        "worker-[0,1,3-6,8,9] (8 tasks)", "worker-2", "worker-7"]


# ---------------------------------------------------------------------------------------------
# Real runs


SHARED = ["WARNING: the same first line", "WARNING: the same second line", "the same third line"]


@pytest.mark.slow
def test_256_local_tasks_print_their_shared_lines_a_handful_of_times(tflaunch, tmp_path):
    # Every task waits on a shared lock the test holds, so all 256 print at about the same moment.
    lock = tmp_path / "go"
    lock.touch()
    body = "".join(f"{line}\\n" for line in SHARED)
    script = f"echo ready; flock -s {lock} true; printf '{body}unique %s\\n' \"$TFLAUNCH_TASK\""
    with open(lock) as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        proc = tflaunch.start("--local", "256", "--", "sh", "-c", script)
        try:
            wait_for(lambda: tflaunch.merged_text().count("| ready\n") == 256, timeout=240, interval=0.5,
                     message=lambda: f"256 tasks to be ready: {tflaunch.merged_text().count('| ready')} so far")
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)
        out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-3000:]
    names = {f"worker-{i}" for i in range(256)}
    lines = console_lines(out)
    by_text: dict[str, list[list[str]]] = {}
    for tasks, text in lines:
        by_text.setdefault(text, []).append(tasks)
    for text in [*SHARED, "ready"]:
        told = [name for tasks in by_text.pop(text) for name in tasks]
        assert sorted(told) == sorted(names), text  # each task once: none dropped, none twice
    for text in SHARED:
        assert len([1 for _, line in lines if line == text]) <= 8, out  # a handful, not 256
    # What is left: each task's unique line, once, under its own name.
    assert sorted((tasks[0], text) for text, groups in by_text.items() for tasks in groups) == \
        sorted((name, f"unique {name}") for name in names)
    assert all(len(groups) == 1 and len(groups[0]) == 1 for groups in by_text.values())
    assert len(lines) < 256 + 40, len(lines)
    # Each task's order: its shared lines came before its unique line on the console too.
    position = {}
    for at, (tasks, text) in enumerate(lines):
        for name in tasks:
            position.setdefault(name, []).append((at, text))
    assert all([text for _, text in position[name]] == ["ready", *SHARED, f"unique {name}"] for name in names)
    # The files are untouched by folding: every task's log and merged.log as the tasks wrote them.
    run_dir = tflaunch.latest_run()
    expected = "ready\n" + "".join(f"{line}\n" for line in SHARED)
    for name in names:
        assert (run_dir / f"{name}.log").read_bytes() == f"{expected}unique {name}\n".encode()
    merged = (run_dir / "merged.log").read_text()
    for line in SHARED:
        assert merged.count(f" | {line}\n") == 256


@pytest.mark.slow
def test_a_line_is_shown_long_before_its_task_sleeps_to_the_end(tflaunch):
    proc = tflaunch.start("--local", "2", "--", "python", TASK, "print:same line", "exit-if:worker-1:0",
                          "print:only worker-0", "sleep:10")
    seen: dict[str, float] = {}

    def read() -> None:
        for line in proc.stdout:
            seen.setdefault(line.rstrip("\n"), time.monotonic())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    proc.wait(timeout=120)
    ended = time.monotonic()
    reader.join(10)
    assert proc.returncode == 0, proc.stderr.read()
    assert "worker-[0,1] | same line" in seen, seen
    assert "worker-0 | only worker-0" in seen, seen  # its twin never comes: shown after the hold anyway
    # Both were on the console while worker-0 still slept: well before its 10 s were over.
    assert ended - seen["worker-0 | only worker-0"] >= 5, (ended, seen)
    assert ended - seen["worker-[0,1] | same line"] >= 5, (ended, seen)


def test_a_real_table_of_eight_tasks_is_one_row(tflaunch):
    done = tflaunch.run("--local", "8", "--", "sh", "-c", "exit 0")
    assert done.returncode == 0, done.stderr
    assert re.search(r"^tflaunch:   worker-\[0-7\] \(8 tasks\)\s+localhost\s+succeeded\s+exit code 0 ", done.stderr, re.M), \
        done.stderr
    assert "worker-3" not in done.stderr


def test_the_keras_note_is_shown_for_python_that_may_import_tensorflow_and_not_for_sleep(tflaunch):
    python = tflaunch.run("--local", "2", "--", "python", "-c", "import numpy")
    stdlib = tflaunch.run("--local", "2", "--", "python", "-c", "import sys")
    sleep = tflaunch.run("--local", "2", "--", "sleep", "0")
    assert python.returncode == stdlib.returncode == sleep.returncode == 0, python.stderr + stdlib.stderr + sleep.stderr
    assert f"tflaunch: {LEGACY_KERAS_NOTE}" in python.stderr
    assert "TF_USE_LEGACY_KERAS" not in stdlib.stderr, stdlib.stderr
    assert "TF_USE_LEGACY_KERAS" not in sleep.stderr, sleep.stderr


def test_the_keras_note_follows_what_a_python_script_imports(tflaunch, tmp_path):
    plain = tmp_path / "plain.py"
    plain.write_text("#!/usr/bin/env python3\nimport json\nprint('trained', json.dumps(1))\n")
    plain.chmod(0o755)
    (tmp_path / "train.py").write_text("import json\nimport numpy\nprint('trained with numpy')\n")
    done = tflaunch.run("--local", "2", "--", str(plain))
    assert done.returncode == 0, done.stderr
    assert "TF_USE_LEGACY_KERAS" not in done.stderr, done.stderr  # a script of the standard library only
    assert "worker-[0,1] | trained 1" in done.stdout
    # Read relative to the tasks' working directory, as the tasks run it.
    cluster = tmp_path / "c.yaml"
    cluster.write_text(f"workdir: {tmp_path}\ncommand: python train.py\nworker: [localhost:auto, localhost:auto]\n")
    done = tflaunch.run(str(cluster))
    assert done.returncode == 0, done.stderr
    assert f"tflaunch: {LEGACY_KERAS_NOTE}" in done.stderr
    assert "worker-[0,1] | trained with numpy" in done.stdout
