"""A run folder is its owner's: nobody else reads it, nobody else swaps it.

Another user (``nobody``, through setpriv) tries to read a finished run's files, to read them as a
member of the log directory's group, and to rename a running run's folder away and plant its own.
"""

from __future__ import annotations

import grp
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, TASK
from test_shared_machine import NOBODY, SYSTEM_PYTHON, nobody_did, pytestmark  # noqa: F401 (root and setpriv)

# Reads every file named (argv[1:]) and says, per file, "read" or "refused".
READ = r'''
import sys
for path in sys.argv[1:]:
    try:
        open(path, "rb").read()
        print("read")
    except PermissionError:
        print("refused")
'''

# Renames the run folder (argv[1]) away and makes one of nobody's in its place; prints what happened.
SWAP = r'''
import os, sys
run = sys.argv[1]
try:
    os.rename(run, run + ".away")
    os.mkdir(run, 0o777)
    print("swapped")
except PermissionError:
    print("refused")
'''


def tflaunch(cwd: Path, log_dir: Path, *task: str, umask: str = "022", options: tuple[str, ...] = (),
             user: tuple[str, ...] = ()) -> subprocess.Popen:
    """tflaunch --local 1 writing into ``log_dir``, run by root or by ``user`` (a setpriv prefix)."""
    argv = [*user, "sh", "-c", f'umask {umask} && exec "$@"', "sh", sys.executable, "-m", "launcher", "--local", "1",
            "--log-dir", str(log_dir), *options, "--", "python", TASK, *task]
    return subprocess.Popen(argv, cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finished(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def everything_in(run_dir: Path) -> tuple[list[Path], list[Path]]:
    """(folders, files) of a run folder, the folder itself first."""
    inside = list(run_dir.rglob("*"))
    return [run_dir, *(p for p in inside if p.is_dir())], [p for p in inside if p.is_file()]


@pytest.mark.slow
def test_a_run_folder_and_everything_in_it_is_its_owners_alone(tmp_path, folder_for_others):
    log_dir = folder_for_others(0o1777)  # shared as /tmp is: others reach it, and the run folder's mode is all
    done = finished(tflaunch(tmp_path, log_dir, "print:my-token-1234", "exit-if:worker-0:3", umask="000"))
    assert done.returncode == 3, done.stderr
    (run_dir,) = log_dir.iterdir()
    folders, files = everything_in(run_dir)
    assert {"run.json", "merged.log", "worker-0.log", "metrics.jsonl"} <= {p.name for p in files}
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in folders} == {"0o700"}
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in files} == {"0o600"}
    paths = [str(p) for p in files]
    assert nobody_did(READ, *paths).split() == ["refused"] * len(paths)


@pytest.mark.slow
def test_another_user_asking_about_runs_they_cannot_read_gets_one_line_not_a_traceback(tmp_path, folder_for_others):
    log_dir = folder_for_others(0o1777)
    assert finished(tflaunch(tmp_path, log_dir, "print:done")).returncode == 0
    (run_dir,) = log_dir.iterdir()
    nobody = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", sys.executable, "-m", "launcher"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for command in ("runs", "status", "report", "logs", "stacks"):
        done = subprocess.run([*nobody, command, "--log-dir", str(log_dir)], capture_output=True, text=True,
                              timeout=60, cwd=log_dir, env=env)
        assert "Traceback" not in done.stderr, (command, done.stderr)
        if command == "runs":  # listed, as a run that cannot be read, beside any the user can read
            assert done.returncode == 0 and "unreadable" in done.stdout, done
        else:
            assert done.returncode == 2, (command, done)
            assert done.stderr.strip() == f"tflaunch: error: {run_dir / 'run.json'}: cannot read it (Permission denied)"


def as_group_member(gid: int, code: str, *args: str) -> str:
    done = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", f"--groups={gid}", SYSTEM_PYTHON,
                           "-c", code, *args], capture_output=True, text=True, timeout=60, cwd="/",
                          env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    return done.stdout


def assert_shared_with_group_alone(run_dir: Path, gid: int) -> None:
    """Every folder of ``run_dir`` 2750 and every file 0640, all of group ``gid``: a member reads
    each file, a user outside the group none."""
    folders, files = everything_in(run_dir)
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in folders} == {"0o2750"}
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in files} == {"0o640"}
    assert {p.stat().st_gid for p in [*folders, *files]} == {gid}
    paths = [str(p) for p in files]
    assert as_group_member(gid, READ, *paths).split() == ["read"] * len(paths)
    assert nobody_did(READ, *paths).split() == ["refused"] * len(paths)  # not in the group: nothing


@pytest.mark.slow
def test_a_log_directory_shared_with_its_group_shares_runs_with_that_group_alone(tmp_path, folder_for_others):
    gid = grp.getgrnam("users").gr_gid
    log_dir = folder_for_others(0o3770)  # set-group-ID and sticky: the group's, nobody swaps another's folder
    os.chown(log_dir, -1, gid)
    log_dir.chmod(0o3770)
    done = finished(tflaunch(tmp_path, log_dir, "print:hello", umask="077"))
    assert done.returncode == 0, done.stderr
    (run_dir,) = log_dir.iterdir()
    assert_shared_with_group_alone(run_dir, gid)


@pytest.mark.slow
def test_a_run_given_a_group_shares_its_folder_with_that_group_alone(tmp_path, folder_for_others):
    gid = grp.getgrnam("users").gr_gid
    log_dir = folder_for_others(0o1777)  # root's, not shared with any group: the option alone shares the run
    done = finished(tflaunch(tmp_path, log_dir, "print:my-token-1234", umask="077", options=("--log-group", "users")))
    assert done.returncode == 0, done.stderr
    (run_dir,) = log_dir.iterdir()
    assert {"run.json", "merged.log", "worker-0.log"} <= {p.name for p in everything_in(run_dir)[1]}
    assert_shared_with_group_alone(run_dir, gid)


# As another user, with the system python3 (the project's venv is out of its reach): asks for --log-group
# argv[2] and makes a run folder with that group in argv[1]; prints the folder, or the one-line refusal.
GROUP_RUN = r'''
import sys
sys.path.insert(0, sys.argv[3])
from launcher.errors import LaunchError
from launcher.options import RunOptions
from launcher.records.folder import RunFolder
try:
    options = RunOptions(log_group=sys.argv[2])
    print(RunFolder.create(sys.argv[1], "cluster.yaml", group=options.log_group).path)
except LaunchError as exc:
    print(f"refused: {exc}")
'''


def test_a_group_the_user_is_not_in_is_refused_in_one_line_and_one_it_is_in_is_given(folder_for_others):
    gid = grp.getgrnam("users").gr_gid
    log_dir = folder_for_others(0o1777)
    said = nobody_did(GROUP_RUN, str(log_dir / "logs"), "users", str(ROOT)).strip()
    assert said == f"refused: --log-group: you are not a member of group 'users' (gid {gid}), so a run folder " \
                   f"cannot be given it"
    assert list(log_dir.iterdir()) == []  # nothing made
    run_dir = Path(as_group_member(gid, GROUP_RUN, str(log_dir / "logs"), str(gid), str(ROOT)).strip())
    info = run_dir.stat()
    assert (info.st_uid, info.st_gid, oct(stat.S_IMODE(info.st_mode))) == (NOBODY, gid, "0o2750")


@pytest.mark.parametrize("value, why", [("no-such-group-here", "no group 'no-such-group-here' on this machine"),
                                        ("[users]", "expected the name or number of a group, got a list")])
def test_a_cluster_files_bad_log_group_is_one_line_naming_the_file_key_and_value(tmp_path, value, why):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(f"log_group: {value}\nlog_dir: {tmp_path / 'logs'}\nworker: [localhost:auto]\n")
    done = subprocess.run([sys.executable, "-m", "launcher", str(cluster), "--", "python", TASK, "print:hello"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2, done
    assert done.stderr.strip() == f"tflaunch: error: {cluster}: log_group: {why}"
    assert not (tmp_path / "logs").exists()


def test_a_bad_log_group_option_is_one_line_and_nothing_is_made(tmp_path):
    done = finished(tflaunch(tmp_path, tmp_path / "logs", "print:hello", options=("--log-group", "no-such-group-here")))
    assert done.returncode == 2, done
    assert done.stderr.strip() == "tflaunch: error: --log-group: no group 'no-such-group-here' on this machine"
    assert not (tmp_path / "logs").exists()


@pytest.mark.slow
def test_a_log_directory_others_can_write_without_the_sticky_bit_is_refused_in_one_line(tmp_path, folder_for_others):
    log_dir = folder_for_others(0o777)
    done = finished(tflaunch(tmp_path, log_dir, "print:hello"))
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert str(log_dir) in line and "writable by every user" in line and "chmod +t" in line, line
    assert list(log_dir.iterdir()) == []  # no run folder made, nothing started


@pytest.mark.slow
def test_a_log_directory_inside_another_users_folder_is_refused(tmp_path, folder_for_others):
    shared = folder_for_others(0o1777)
    nobody_did("import os, sys; os.mkdir(sys.argv[1], 0o755)", str(shared / "theirs"))
    os.mkdir(shared / "theirs" / "logs", 0o700)  # root's own, but in a folder whose owner may rename it
    done = finished(tflaunch(tmp_path, shared / "theirs" / "logs", "print:hello"))
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert f"{shared / 'theirs'}" in line and f"another user (uid {NOBODY})" in line, line


@pytest.mark.slow
def test_another_user_cannot_swap_a_running_runs_folder(tmp_path, folder_for_others):
    log_dir = folder_for_others(0o1777)
    proc = tflaunch(tmp_path, log_dir, "print:before", "sleep:3", "print:after")
    deadline = time.monotonic() + 60
    while not list(log_dir.glob("*/worker-0.log")) and time.monotonic() < deadline:
        time.sleep(0.05)
    (run_dir,) = log_dir.iterdir()
    assert nobody_did(SWAP, str(run_dir)).strip() == "refused"
    done = finished(proc)
    assert done.returncode == 0, done.stderr
    assert [p.name for p in log_dir.iterdir()] == [run_dir.name]
    assert json.loads((run_dir / "run.json").read_text())["status"] == "succeeded"
    assert "after" in (run_dir / "worker-0.log").read_text()


def test_a_folder_on_the_way_writable_by_a_group_counts_unless_the_group_is_the_users_own(tmp_path):
    from launcher.records.files import swappable_by_others

    folder = tmp_path / "team"
    folder.mkdir()
    folder.chmod(0o775)
    os.chown(folder, 0, grp.getgrnam("users").gr_gid)
    assert swappable_by_others(folder / "logs") == f"{str(folder)!r} is writable by its group (mode 0775) and has " \
                                                   f"no sticky bit"
    folder.chmod(0o1775)
    assert swappable_by_others(folder / "logs") is None  # sticky: others remove only their own names
    folder.chmod(0o775)
    os.chown(folder, 0, 0)  # root's own private group: nobody else is in it
    assert swappable_by_others(folder / "logs" / "deeper") is None


def test_a_link_on_the_way_that_another_user_owns_is_refused(tmp_path):
    from launcher.records.files import swappable_by_others

    (tmp_path / "real").mkdir()
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "real")
    assert swappable_by_others(link / "logs") is None
    os.lchown(link, NOBODY, NOBODY)  # its owner could point it elsewhere at any time
    assert swappable_by_others(link / "logs") == f"{str(link)!r} is a link of another user's (uid {NOBODY})"
