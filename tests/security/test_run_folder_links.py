"""No link is followed in a run folder, and ``tflaunch stacks`` trusts only its own user's tflaunch.

Another user (``nobody``, through setpriv) plants symbolic links, under every name tflaunch used
to write by, in a run folder it can write (as one with a default ACL, or opened up by hand, is);
each points at a file of the run's user, which must come out untouched while the run's own files
come out whole. The same user serves a fake control socket that ``tflaunch stacks`` must refuse.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, TASK
from launcher.options import LOG_MAX_SIZE
from launcher.records.boundedlog import BoundedLog
from launcher.records.control import ControlError, ask
from launcher.records.folder import RunFolder
from launcher.records.record import RunRecord
from launcher.run.faults.stacks_server import ControlServer
from test_shared_machine import Attacker, nobody_did, pytestmark  # noqa: F401 (pytestmark: root and setpriv)

PRECIOUS = "the run's user's own file\n"

# Links to the victim under every name given (argv[3:]), in the folder argv[1].
PLANT = r'''
import os, sys
folder, victim = sys.argv[1], sys.argv[2]
for name in sys.argv[3:]:
    os.symlink(victim, os.path.join(folder, name))
'''


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_text(PRECIOUS)
    return path


@pytest.fixture
def open_folder(folder_for_others) -> Path:
    """A run folder another user can write (0777, not sticky)."""
    return folder_for_others(0o777)


def plant(folder: Path, victim: Path, names: list[str]) -> None:
    nobody_did(PLANT, str(folder), str(victim), *names)
    assert all((folder / name).is_symlink() for name in names)


@pytest.mark.slow
def test_run_json_is_never_written_through_a_planted_link(open_folder, victim):
    folder = RunFolder(open_folder)
    # The temporary names a writer of run.json could be expected to use, this process's among them.
    plant(open_folder, victim, [f".run.json.{os.getpid()}.tmp", ".run.json.tmp", "run.json"])
    folder.write_record(RunRecord(run_id="r", source="test"))
    folder.write_record(RunRecord(run_id="r", source="test", command="again"), final=True)
    assert victim.read_text() == PRECIOUS
    assert folder.read_record().command == "again"
    assert not folder.record_path.is_symlink()


@pytest.mark.slow
def test_task_logs_and_their_parts_are_never_written_through_planted_links(open_folder, victim):
    folder = RunFolder(open_folder)
    # The log itself, the head and stitched copies tflaunch made beside it, and every part name
    # the output below can reach (a part is named by its offset in the output).
    names = ["worker-0.log", ".worker-0.log.head", ".worker-0.log.stitch",
             *(f"worker-0.log.part-{offset}" for offset in range(0, 6000))]
    plant(open_folder, victim, names)
    path = folder.create_task_log("worker-0", 1)
    log = BoundedLog(path, max_size=1024)
    lines = [f"line {n:04d}\n".encode() for n in range(500)]
    for line in lines:
        log.write(line)
    log.close()
    assert victim.read_text() == PRECIOUS
    text = Path(path).read_text()
    assert text.startswith("line 0000\n") and text.endswith("line 0499\n"), text
    assert "bytes (" in text and "left out here" in text  # stitched: head, marker, tail
    assert not Path(path).is_symlink()


@pytest.mark.slow
def test_a_planted_link_at_a_task_log_is_not_appended_through(open_folder, victim):
    plant(open_folder, victim, ["worker-0.log"])
    path = RunFolder(open_folder).create_task_log("worker-0", 1)
    log = BoundedLog(path, LOG_MAX_SIZE)
    log.write(b"hello\n")
    log.close()
    assert victim.read_text() == PRECIOUS
    info = os.lstat(path)
    assert stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid()
    assert Path(path).read_bytes() == b"hello\n"


@pytest.mark.slow
def test_a_run_folder_in_an_open_log_directory_is_writable_by_its_user_alone(tmp_path, folder_for_others):
    """tflaunch run under umask 0 in a log directory every user can write: no folder it makes there
    lets another user add a name."""
    log_dir = folder_for_others(0o1777)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(["sh", "-c", 'umask 000 && exec "$@"', "sh", sys.executable, "-m", "launcher",
                           "--local", "1", "--log-dir", str(log_dir), "--", "python", TASK, "print:hi"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    (run_dir,) = log_dir.iterdir()
    folders = [run_dir, *(p for p in run_dir.rglob("*") if p.is_dir() and not p.is_symlink())]
    for path in folders:
        assert stat.S_IMODE(path.stat().st_mode) & 0o022 == 0, f"{path}: {oct(path.stat().st_mode)}"
    refused = nobody_did("import os, sys\ntry:\n    os.symlink('/etc/passwd', os.path.join(sys.argv[1], 'x'))\n"
                         "except PermissionError:\n    print('refused')\n", str(run_dir))
    assert refused.strip() == "refused"


# A stranger's control socket: answers any request with stacks that carry terminal escapes.
FAKE_SERVER = r'''
import json, os, socket, sys
folder = sys.argv[1]
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(os.path.join(folder, "control.sock"))
os.chmod(os.path.join(folder, "control.sock"), 0o777)
server.listen(1)
import threading
def serve():
    while True:
        conn, _ = server.accept()
        conn.recv(4096)
        answer = {"ok": True, "run_id": "r", "tasks": [{"name": "w", "stacks": "\x1b]0;owned\x07"}]}
        conn.sendall(json.dumps(answer).encode() + b"\n")
        conn.close()
threading.Thread(target=serve, daemon=True).start()
'''


@pytest.mark.slow
def test_stacks_refuses_a_control_socket_another_user_serves(open_folder):
    attacker = Attacker(FAKE_SERVER, str(open_folder))
    try:
        with pytest.raises(ControlError) as caught:
            ask(open_folder, "r", {"op": "stacks"}, timeout=10)
    finally:
        attacker.stop()
    message = str(caught.value)
    assert "served by uid 65534, not by you" in message, message
    assert "\n" not in message and "\x1b" not in message


def _request(path: Path, data: bytes) -> dict:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.settimeout(20)
    client.connect(str(path))
    client.sendall(data)
    answer = b""
    while chunk := client.recv(1 << 16):
        answer += chunk
    client.close()
    return json.loads(answer) if answer else {}


@pytest.mark.slow
def test_a_deeply_nested_request_is_one_error_and_the_server_goes_on(tmp_path, capfd):
    server = ControlServer(RunFolder(tmp_path), lambda: None).start()
    try:
        nested = _request(server.path, b'{"op": ' + b"[" * 4000 + b"\n")
        assert nested == {"ok": False, "error": "not a request (expected one JSON object on one line)"}
        time.sleep(0.2)
        assert "Traceback" not in capfd.readouterr().err
        later = _request(server.path, b'{"op": "stacks"}\n')
        assert later["ok"] is False and "no running task" in later["error"]
    finally:
        server.close()
