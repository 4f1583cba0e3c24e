"""tflaunch on a machine shared with other users: what another user's processes can do to your runs.

Each attack runs as a real second user (``nobody``, through setpriv) against real tflaunch runs,
real locks and real sockets. The temp directory is one of the test's own, shared the way /tmp is
(mode 1777); HOME is one of the test's own too, so nothing here touches the machine's /tmp or ~.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, TASK, env_lines_of
from launcher.cluster.mesh_probe import listen
from launcher.cluster.ports import reserve_ports
from launcher.cluster.probe import port_is_free

SYSTEM_PYTHON = "/usr/bin/python3"
NOBODY = 65534

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not (Path(SYSTEM_PYTHON).exists() and shutil.which("setpriv")),
    reason="needs root, setpriv and the system python3 to act as a second user")


def as_nobody(code: str, *args: str, **kwargs) -> subprocess.Popen:
    """``code`` run by the system python3 as user nobody (the project's venv is out of nobody's reach)."""
    return subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                             SYSTEM_PYTHON, "-c", code, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={"PATH": "/usr/bin:/bin"}, cwd="/")


def nobody_did(code: str, *args: str) -> str:
    proc = as_nobody(code, *args)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return out


class Attacker:
    """A process of nobody's that set something up, says READY, and keeps it until stdin closes."""

    def __init__(self, code: str, *args: str):
        self.proc = as_nobody(code + "\nprint('READY', flush=True)\nsys.stdin.read()\n", *args)
        line = self.proc.stdout.readline()
        if line.strip() != "READY":
            self.proc.kill()
            raise AssertionError(f"the other user's process did not get ready: {line}{self.proc.stderr.read()}")

    def stop(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture
def shared_tmp(folder_for_others):
    """A temp directory shared by every user as /tmp is (1777, its parent traversable)."""
    return folder_for_others(0o1777)


@pytest.fixture
def home(tmp_path):
    path = tmp_path / "home"
    path.mkdir(mode=0o700)
    return path


def run_tflaunch(tmp_path: Path, shared_tmp: Path, home: Path, *args: str, timeout: float = 120):
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CACHE_HOME", "XDG_RUNTIME_DIR")}
    env.update(PYTHONPATH=str(ROOT), TMPDIR=str(shared_tmp), HOME=str(home))
    cut = args.index("--") if "--" in args else len(args)
    argv = [sys.executable, "-m", "launcher", *args[:cut], "--log-dir", str(tmp_path / "logs"), *args[cut:]]
    return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)


def ports_of(tmp_path: Path) -> list[int]:
    """The ports in the TF_CONFIG that worker-0 of the test's one run printed."""
    (run_dir,) = (tmp_path / "logs").iterdir()
    config = json.loads(env_lines_of((run_dir / "worker-0.log").read_text())[0]["TF_CONFIG"])
    return [int(address.rsplit(":", 1)[1]) for address in config["cluster"]["worker"]]


# What another user plants where tflaunch keeps its port lock (its old shared folder, and the
# per-user folder names), every lock file name pointing at a file of the victim's.
PLANT = r'''
import os, sys
shared, victim, uid, mode = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
bait = os.path.join(shared, "bait")
os.mkdir(bait)
os.chmod(bait, 0o777)
names = ["ports.lock", "ports-%s.lock" % os.uname().nodename]
for name in names:
    os.symlink(victim, os.path.join(bait, name))
for folder in ("tflaunch-ports", "tflaunch-" + uid):
    path = os.path.join(shared, folder)
    if mode == "link":
        os.symlink(bait, path)
    else:
        os.mkdir(path)
        os.chmod(path, 0o1777)
        for name in names:
            os.symlink(victim, os.path.join(path, name))
'''


@pytest.mark.parametrize("mode", ["folder", "link"])
def test_a_planted_lock_folder_leaves_your_files_alone_and_the_run_works(tmp_path, shared_tmp, home, mode):
    victim = tmp_path / "authorized_keys"
    victim.write_text("ssh-ed25519 AAAA... me@here\n")
    victim.chmod(0o600)
    nobody_did(PLANT, str(shared_tmp), str(victim), str(os.geteuid()), mode)
    done = run_tflaunch(tmp_path, shared_tmp, home, "--local", "2", "--", "python", TASK, "env")
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert victim.read_text() == "ssh-ed25519 AAAA... me@here\n"
    assert done.returncode == 0, done.stderr
    assert len(set(ports_of(tmp_path))) == 2
    # The planted folder is not the user's: the lock went to a folder of the user's own.
    private = home / ".cache" / "tflaunch"
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    (lock,) = private.iterdir()
    assert stat.S_IMODE(lock.lstat().st_mode) == 0o600 and lock.is_file() and not lock.is_symlink()


def test_with_every_lock_folder_taken_by_another_user_the_run_still_runs(tmp_path, shared_tmp, home):
    victim = tmp_path / "victim"
    victim.write_text("mine\n")
    victim.chmod(0o600)
    nobody_did(PLANT, str(shared_tmp), str(victim), str(os.geteuid()), "folder")
    # HOME points into the shared folder too, where nobody made the cache folder first; there is
    # no $XDG_RUNTIME_DIR (run_tflaunch leaves it out).
    nobody_home = shared_tmp / "home"
    nobody_did("import os, sys; os.makedirs(sys.argv[1] + '/.cache/tflaunch', 0o777)", str(nobody_home))
    done = run_tflaunch(tmp_path, shared_tmp, nobody_home, "--local", "2", "--", "python", TASK, "env")
    assert done.returncode == 0, done.stderr
    assert len(set(ports_of(tmp_path))) == 2
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600 and victim.read_text() == "mine\n"
    # The lock was a file of the run's own with no name: nothing of it in the folders nobody made.
    theirs = [shared_tmp / f"tflaunch-{os.geteuid()}", nobody_home / ".cache" / "tflaunch"]
    assert all(p.is_symlink() or p.owner() == "nobody" for folder in theirs for p in folder.iterdir())


LOCK_EVERYTHING = r'''
import fcntl, os, struct, sys
shared, uid = sys.argv[1], sys.argv[2]
held = []
for folder, names in (("tflaunch-ports", ["ports.lock"]),
                      ("tflaunch-" + uid, ["ports.lock", "ports-%s.lock" % os.uname().nodename])):
    path = os.path.join(shared, folder)
    os.mkdir(path)
    os.chmod(path, 0o1777)
    for name in names:
        fd = os.open(os.path.join(path, name), os.O_RDWR | os.O_CREAT, 0o666)
        os.fchmod(fd, 0o666)
        # Every byte that could stand for a port, write-locked for as long as this process lives.
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 65536, 0))
        held.append(fd)
'''


def test_another_users_locks_cannot_block_your_ports(tmp_path, shared_tmp, home):
    attacker = Attacker(LOCK_EVERYTHING, str(shared_tmp), str(os.geteuid()))
    try:
        done = run_tflaunch(tmp_path, shared_tmp, home, "--local", "2", "--", "python", TASK, "env")
    finally:
        attacker.stop()
    assert done.returncode == 0, done.stderr
    assert len(set(ports_of(tmp_path))) == 2


# Every way another user could bind a port: each family and address, with and without
# SO_REUSEADDR and SO_REUSEPORT, then listen. Prints the ones that worked.
TAKE = r'''
import json, socket, sys
port = int(sys.argv[1])
took = []
for family, address, v6only in ((socket.AF_INET, "0.0.0.0", None), (socket.AF_INET, "127.0.0.1", None),
                                (socket.AF_INET6, "::", 0), (socket.AF_INET6, "::", 1), (socket.AF_INET6, "::1", 1)):
    for options in ((), (socket.SO_REUSEADDR,), (socket.SO_REUSEPORT,), (socket.SO_REUSEADDR, socket.SO_REUSEPORT)):
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            if v6only is not None:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, v6only)
            for option in options:
                sock.setsockopt(socket.SOL_SOCKET, option, 1)
            sock.bind((address, port))
            sock.listen()
            took.append("%s v6only=%s options=%s" % (address, v6only, list(options)))
        except OSError:
            pass
        finally:
            sock.close()
print(json.dumps(took))
'''


def taken_by_nobody(port: int) -> list[str]:
    return json.loads(nobody_did(TAKE, str(port)))


def test_ports_reserved_on_this_machine_cannot_be_taken_by_another_user(tmp_path):
    with reserve_ports(["worker-0", "worker-1"], folders=[tmp_path / "locks"]) as reservation:
        for port in reservation.ports.values():
            assert taken_by_nobody(port) == []
            assert port_is_free(port)  # held by tflaunch itself: free for the task it is meant for


# The byte ranges of every OFD lock /proc/locks shows (start and end), as another user reads them.
LOCKED_BYTES = r'''
import json
print(json.dumps([line.split()[-2:] for line in open("/proc/locks") if "OFDLCK" in line]))
'''


def test_no_other_user_can_read_which_ports_this_machine_locked(tmp_path):
    names = [f"worker-{i}" for i in range(8)]
    with reserve_ports(names, folders=[tmp_path / "locks"], hold=0) as reservation:
        seen = {int(start) for start, _ in json.loads(nobody_did(LOCKED_BYTES))}
        ports = set(reservation.ports.values())
    assert len(ports) == 8 and not ports & seen  # the locks are there, under keyed bytes
    assert len(seen) >= 8


def test_the_tasks_bind_the_ports_that_were_held_for_them(tmp_path, shared_tmp, home):
    # The holds end just before the tasks start: each task binds its own port (exit 5 if it cannot).
    done = run_tflaunch(tmp_path, shared_tmp, home, "--local", "3", "--", "python", TASK, "bind")
    assert done.returncode == 0, done.stderr
    (run_dir,) = (tmp_path / "logs").iterdir()
    assert all((run_dir / f"worker-{i}.log").read_text().startswith("BOUND ") for i in range(3))


def test_ports_an_agent_holds_cannot_be_taken_by_another_user_but_this_users_probes_can_listen():
    from launcher.options import RunOptions
    from launcher.transports.local import LocalTransport

    transport = LocalTransport(RunOptions())
    try:
        ports = transport.link_for(None).pick_ports(2, timeout=30.0)
        for port in ports:
            assert taken_by_nobody(port) == []
            assert port_is_free(port)
            with listen(port) as probe:  # the mesh probe listens on a held port, as before a run
                with socket.create_connection(("127.0.0.1", port), timeout=10):
                    pass
                probe.accept()[0].close()
    finally:
        transport.close()


def test_dry_run_takes_no_lock_and_picks_no_port(tmp_path, shared_tmp, home):
    done = run_tflaunch(tmp_path, shared_tmp, home, "-H", "localhost:3", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert list(shared_tmp.iterdir()) == [] and list(home.iterdir()) == []
    assert ("port auto: worker-0, worker-1, worker-2 on this machine: tflaunch picks free ports when the run starts"
            in done.stdout), done.stdout
    assert '"worker":["localhost:0","localhost:0","localhost:0"]' in done.stdout


def test_nothing_a_run_leaves_outside_its_run_folder_is_writable_by_another_user(tmp_path, shared_tmp, home):
    done = run_tflaunch(tmp_path, shared_tmp, home, "--local", "2", "--", "python", TASK, "env")
    assert done.returncode == 0, done.stderr
    left = [p for top in (shared_tmp, home) for p in top.rglob("*")]
    assert left, "a run keeps its port lock in a folder of the user's own"
    for path in left:
        info = path.lstat()
        assert not stat.S_ISLNK(info.st_mode), path
        assert info.st_uid == os.geteuid(), path
        assert stat.S_IMODE(info.st_mode) & 0o077 == 0, f"{path}: {oct(info.st_mode)}"


# A cluster file of ten lines whose aliases, written out, stand for 9**9 values (argv[1]: its path).
ALIAS_BOMB = r'''
import sys
lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
lines += ["a%d: &a%d [%s]" % (i, i, ", ".join(["*a%d" % (i - 1)] * 9)) for i in range(1, 9)]
open(sys.argv[1], "w").write("\n".join(lines + ["worker: *a8"]) + "\n")
'''


@pytest.mark.timeout(60)  # before aliases were counted, reading the file spun one core for minutes
def test_a_cluster_file_another_user_wrote_to_spin_the_cpu_is_refused_in_one_line(tmp_path, shared_tmp):
    bomb = shared_tmp / "cluster.yaml"
    nobody_did(ALIAS_BOMB, str(bomb))
    done = subprocess.run([sys.executable, "-m", "launcher", "--dry-run", str(bomb)], cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=50)
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"tflaunch: error: {bomb}: line ") and "aliases expand to more than 1,000,000" in line
