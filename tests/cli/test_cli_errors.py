"""Every user error on the command line has one format: ``tflaunch: error: <message>`` as the last line
of stderr, exit code 2, nothing on stdout and no traceback; click's own usage errors (an unknown
option, a value out of range, a bad choice) included, which keep only their usage line above it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BAD_FILE = "worker: [localhost:70000]\n"

CASES = {
    "unknown option": (["runs", "--bogus"], "tflaunch runs has no option --bogus; see 'tflaunch runs --help'"),
    "value out of range": (["runs", "--last", "0"], "Invalid value for '--last': 0 is not in the range"),
    "count below its least": (["--local", "0", "--dry-run"], "--local: expected a whole number >= 1, got 0"),
    "negative ps count": (["check", "--local", "2", "--ps", "-1"], "--ps: expected a whole number >= 0, got -1"),
    "option without its value": (["runs", "--log-dir"], "Option '--log-dir' requires an argument"),
    "bad choice": (["export", "--local", "1", "--format", "yaml"], "Invalid value for '--format': 'yaml'"),
    "bad value read by a callback": (["--local", "2", "--gpus", "x", "--dry-run"],
                                     "--gpus: expected GPU indices (whole numbers) such as 0,1, got 'x'"),
    "bad --env name": (["--local", "1", "-e", "1X=2", "--dry-run"], "expected KEY=VALUE or KEY"),
    "options that do not go together": (["--local", "2", "--requeue", "--dry-run"],
                                        "--requeue and --run-dir only apply to --slurm"),
    "two clusters named": (["check", "--local", "2", "-H", "localhost:2"], "give either a cluster file or --local N"),
    "too few runs to compare": (["compare", "one", "--log-dir", "{logs}"], "compare needs at least two runs"),
    "too few slots for submit's roles": (["submit", "--nodes", "1", "--chief", "--ps", "2", "--dry-run", "--", "t"],
                                         "need 4 task slots; job (to be submitted): 1 task slot on 1 node (ask"),
    "a submit option's bad value": (["submit", "--nodes", "1", "--sbatch-option", "qos", "--dry-run"],
                                    "expected an sbatch option such as --qos=high, got 'qos'"),
    "missing cluster file": (["missing.yaml", "--dry-run"], "missing.yaml: no such cluster file"),
    "bad value in a cluster file": (["bad.yaml", "--dry-run"], "bad.yaml: worker[0]"),
    "no run to show": (["logs", "--log-dir", "{logs}"], "{logs}"),
    "a Python script for a cluster file": (["my_train.py"], "my_train.py is a Python script, not a cluster file; the "
                                           "task command goes after '--': tflaunch --local N -- python my_train.py"),
    "a command without --": (["--local", "2", "python", "train.py", "--lr", "0.1"],
                             "the task command goes after '--': tflaunch --local 2 -- python train.py --lr 0.1"),
    "a script without --": (["-H", "localhost:2", "--chief", "train.py"],
                            "the task command goes after '--': tflaunch -H localhost:2 --chief -- python train.py"),
    "a command after a cluster file": (["bad.yaml", "--dry-run", "python3", "t.py"],
                                       "the task command goes after '--': tflaunch bad.yaml --dry-run -- python3 t.py"),
    "a command after a cluster file of another name": (["cluster.txt", "python", "t.py"], "the task command goes "
                                                       "after '--': tflaunch cluster.txt -- python t.py"),
    "a program for a cluster file": (["python", "t.py"], "the task command goes after '--': tflaunch --local N -- "
                                                         "python t.py"),
    "export's command without --": (["export", "--local", "2", "python", "t.py"],
                                    "the task command goes after '--': tflaunch export --local 2 -- python t.py"),
    "submit's command without --": (["submit", "--nodes", "1", "python", "t.py"],
                                    "the task command goes after '--': tflaunch submit --nodes 1 -- python t.py"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_user_error_has_the_one_format(tmp_path, case):
    args, wanted = CASES[case]
    logs = tmp_path / "logs"
    args = [a.format(logs=logs) for a in args]
    wanted = wanted.format(logs=logs)
    (tmp_path / "bad.yaml").write_text(BAD_FILE)
    (tmp_path / "cluster.txt").write_text(BAD_FILE)
    done = subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    lines = done.stderr.splitlines()
    assert done.returncode == 2, done.stderr
    assert lines and lines[-1].startswith("tflaunch: error: ") and wanted in lines[-1], done.stderr
    assert not any(line.startswith("Error") for line in lines), done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    # What may stand above the error line: click's usage line and its pointer to --help, nothing else.
    assert all(line.startswith(("Usage: tflaunch", "Try 'tflaunch")) for line in lines[:-1]), done.stderr


# A task's option before "--", and a typo of one of tflaunch's options: one line each, exit 2.
UNKNOWN_OPTIONS = {
    "a task option before --": (["--local", "2", "--epochs", "2"], "tflaunch has no option --epochs; to pass it to the "
                                "command, put it after --: tflaunch --local 2 -- python -m trainer --epochs 2"),
    "task options around tflaunch's": (["--local", "2", "--epochs", "2", "--dry-run", "--lr=0.1"],
                                       "tflaunch has no option --epochs; to pass it to the command, put it after --: "
                                       "tflaunch --local 2 --dry-run -- python -m trainer --epochs 2 --lr=0.1"),
    "a task option before -- and the command": (["-H", "localhost:2", "--epochs", "2", "--", "python", "t.py"],
                                                "put it after --: tflaunch -H localhost:2 -- python t.py --epochs 2"),
    "a task option to export": (["export", "--local", "2", "--epochs", "1"],
                                "tflaunch export has no option --epochs; to pass it to the command, put it after --: "
                                "tflaunch export --local 2 -- python -m trainer --epochs 1"),
    "a typo": (["--loacl", "2"], "tflaunch has no option --loacl; did you mean --local?"),
    "a typo of another command's option": (["runs", "--lats", "2"], "tflaunch runs has no option --lats; did you mean "
                                                                    "--last?"),
}


@pytest.mark.parametrize("case", list(UNKNOWN_OPTIONS))
def test_an_unknown_option_is_one_line_with_the_fix(tmp_path, case):
    args, wanted = UNKNOWN_OPTIONS[case]
    done = subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("tflaunch: error: tflaunch") and line.endswith(wanted), line


def test_every_mistake_of_a_cluster_file_is_one_error_line(tmp_path):
    (tmp_path / "bad.yaml").write_text("threads: many\nworker:\n  - {host: localhost, port: 70000}\n"
                                       "  - {host: localhost, prot: 2222}\n")
    done = subprocess.run([sys.executable, "-m", "launcher", "bad.yaml", "--dry-run"], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.splitlines() == [
        "tflaunch: error: bad.yaml: threads: expected 'auto', 'off' or a thread count >= 1, got 'many'",
        "tflaunch: error: bad.yaml: worker[0].port: expected a port 1-65535, got 70000",
        "tflaunch: error: bad.yaml: worker[1].prot: unknown key; did you mean 'port'?",
    ]


@pytest.mark.parametrize("command, section, keys", [
    (["export"], "worker: [a, b]\nkubernetes: {name: Bad_Name, workdir: rel}", ["kubernetes.name", "kubernetes.workdir"]),
    (["submit", "--dry-run"], "slurm: {nodes: x, requeue: 3}", ["slurm.nodes", "slurm.requeue"]),
])
def test_every_mistake_of_a_section_that_export_or_submit_reads_is_listed(tmp_path, command, section, keys):
    (tmp_path / "c.yaml").write_text(f"command: python t.py\n{section}\n")
    done = subprocess.run([sys.executable, "-m", "launcher", *command, "c.yaml"], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert [line.split(": ")[3] for line in done.stderr.splitlines()] == keys, done.stderr
    assert all(line.startswith("tflaunch: error: c.yaml: ") for line in done.stderr.splitlines())


def test_a_file_that_is_no_cluster_file_and_no_script_is_read_as_one(tmp_path):
    (tmp_path / "notes.txt").write_text("just some notes\n")
    done = subprocess.run([sys.executable, "-m", "launcher", "notes.txt", "--dry-run"], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert (done.returncode, done.stderr) == (2, "tflaunch: error: notes.txt: top level: expected a mapping of cluster "
                                                 "keys or a list of host:port workers, got 'just some notes'\n")


@pytest.mark.parametrize("args, usage", [
    (["--help"], "Usage: tflaunch (CLUSTER.yaml | --local N | -H HOSTS) [OPTIONS] [-- CMD...]"),
    (["run", "--help"], "Usage: tflaunch run [OPTIONS] (CLUSTER.yaml | --local N | -H HOSTS) [-- CMD...]"),
    (["--local", "x"], "Usage: tflaunch [OPTIONS] (CLUSTER.yaml | --local N | -H HOSTS) [-- CMD...]"),
    (["export", "--local", "x"], "Usage: tflaunch export [OPTIONS] (CLUSTER.yaml | --local N | -H HOSTS) [-- CMD...]"),
    (["check", "--help"], "Usage: tflaunch check [OPTIONS] (CLUSTER.yaml | --local N | -H HOSTS)"),
])
def test_the_usage_line_shows_local_n_and_the_task_command(args, usage):
    done = subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLUMNS": "60"})
    assert (done.stdout + done.stderr).splitlines()[0] == usage
