"""TensorBoard: the trainer's scalars served by a real TensorBoard, beside a run and on a finished one."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import textwrap
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from conftest import ROOT, descendants_alive
from polling import wait_for

# One worker runs them all: each beside-run server takes the first free port from 6006 up, and the
# port test below must find the port its own server chose still free.
pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("tensorboard")]

BLOCK_TENSORBOARD = textwrap.dedent("""\
    import sys

    class _NoTensorBoard:
        def find_spec(self, name, path=None, target=None):
            if name == "tensorboard" or name.startswith("tensorboard."):
                raise ModuleNotFoundError(f"No module named {name!r}")
            return None

    sys.meta_path.insert(0, _NoTensorBoard())
    """)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def get_json(url: str):
    """The JSON an HTTP GET returns, or None while the server does not answer (yet)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.loads(response.read())
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def servers_under(path: Path) -> list[psutil.Process]:
    """TensorBoard servers (and the data servers they start) reading a folder under ``path``."""
    return [p for p in descendants_alive(str(path)) if any(arg.startswith("--logdir") for arg in p.info["cmdline"])]


def wait_for_line(path: Path, text: str, proc: subprocess.Popen, timeout: float = 120) -> str:
    """The first line of ``path`` holding ``text``; fails early when ``proc`` ends first."""
    def seen():
        lines = [line for line in path.read_text(errors="replace").splitlines() if text in line]
        if not lines and proc.poll() is not None:
            pytest.fail(f"tflaunch ended ({proc.returncode}) before printing {text!r}:\n{path.read_text()[-3000:]}")
        return lines[0] if lines else None
    return wait_for(seen, timeout=timeout, interval=0.2, message=lambda: f"{text!r} in:\n{path.read_text()[-3000:]}")


def test_without_tensorboard_one_line_says_how_to_install_it(tflaunch, tmp_path):
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(BLOCK_TENSORBOARD)
    env = {"PYTHONPATH": f"{blocker}:{ROOT}"}
    for args in (["tensorboard"], ["--local", "1", "--tensorboard", "--", "python", "-c", "pass"]):
        done = tflaunch.run(*args, env=env)
        assert done.returncode == 2, done.stderr
        python = done.stderr.split("TensorBoard is not installed for ", 1)[-1].split(";")[0]
        assert Path(python).is_file(), done.stderr  # the interpreter that lacks it, and the command that works anywhere
        assert done.stderr.splitlines() == [f"tflaunch: error: TensorBoard is not installed for {python}; install it: "
                                            f"{python} -m pip install tensorboard"]
    assert done.run_dir is None  # refused before any run folder or task existed


@pytest.mark.slow
@pytest.mark.tensorflow
def test_tensorboard_serves_the_trainers_epoch_loss(tflaunch, tmp_path):
    done = tflaunch.run("--local", "1", "--", "python", "-m", "trainer", "--epochs", "2", timeout=240)
    assert done.returncode == 0, done.stderr
    losses = [m["loss"] for m in map(json.loads, (done.run_dir / "metrics.jsonl").read_text().splitlines())
              if m.get("task") == "worker-0" and "epoch" in m and "loss" in m]
    assert len(losses) == 2

    port = free_port()
    out = tmp_path / "tensorboard.out"
    with out.open("w") as sink:
        proc = subprocess.Popen(tflaunch.argv("tensorboard", done.run_dir.name, "--port", str(port),
                                              "--log-dir", str(tflaunch.log_dir)),
                                cwd=tflaunch.cwd, env=tflaunch.env(), stdout=sink, stderr=subprocess.STDOUT)
    try:
        line = wait_for_line(out, "Ctrl-C stops it", proc)
        assert line == f"TensorBoard for run {done.run_dir.name} at http://127.0.0.1:{port}/ (Ctrl-C stops it)"
        # Bound to loopback only.
        listening = [c.laddr for s in servers_under(done.run_dir) for c in s.net_connections("inet")
                     if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
        assert [address.ip for address in listening] == ["127.0.0.1"]
        url = f"http://127.0.0.1:{port}/data/plugin/scalars/scalars?run=train&tag=epoch_loss"
        points = wait_for(lambda: (get_json(url) or None) if len(get_json(url) or []) == 2 else None, timeout=60,
                          message="TensorBoard's scalars endpoint to return both epochs' loss")
        assert [step for _, step, _ in points] == [1, 2]
        assert [value for _, _, value in points] == pytest.approx(losses, rel=1e-5)
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
    assert code == 130
    assert servers_under(done.run_dir) == []


def _waiting_task(flag: Path) -> list[str]:
    """A task command that runs until ``flag`` exists."""
    code = f"import os, time\nwhile not os.path.exists({str(flag)!r}):\n    time.sleep(0.05)\n"
    return ["python", "-c", code]


@pytest.mark.slow
def test_tensorboard_beside_a_run_serves_it_and_stops_with_it(tflaunch, tmp_path):
    flag = tmp_path / "finish"
    out = tmp_path / "tflaunch.out"
    with out.open("w") as sink:
        proc = subprocess.Popen(tflaunch.argv("--local", "1", "--tensorboard", "--log-dir", str(tflaunch.log_dir),
                                              "--", *_waiting_task(flag)),
                                cwd=tflaunch.cwd, env=tflaunch.env(), stdout=sink, stderr=subprocess.STDOUT)
    try:
        line = wait_for_line(out, "TensorBoard at", proc)
        url = line.split("TensorBoard at ", 1)[1].split()[0]
        assert url.startswith("http://127.0.0.1:")
        run_dir = tflaunch.latest_run()
        assert get_json(url + "data/environment")["data_location"] == str(run_dir.resolve() / "tensorboard")
        servers = servers_under(tmp_path)
        assert servers
        flag.touch()
        assert proc.wait(timeout=60) == 0
    finally:
        flag.touch()
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=30)
    assert servers_under(tmp_path) == []  # gone when tflaunch returns: no waiting
    assert "TensorBoard caught SIGTERM" in (run_dir / "tensorboard.log").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGKILL])
def test_tensorboard_beside_a_run_goes_when_tflaunch_is_interrupted_or_killed(tflaunch, tmp_path, signum):
    out = tmp_path / "tflaunch.out"
    with out.open("w") as sink:
        proc = subprocess.Popen(tflaunch.argv("--local", "1", "--tensorboard", "--log-dir", str(tflaunch.log_dir),
                                              "--", *_waiting_task(tmp_path / "never")),
                                cwd=tflaunch.cwd, env=tflaunch.env(), stdout=sink, stderr=subprocess.STDOUT)
    try:
        wait_for_line(out, "TensorBoard at", proc)
        assert servers_under(tmp_path)
        proc.send_signal(signum)
        assert proc.wait(timeout=60) == (130 if signum == signal.SIGINT else -signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # Interrupted, tflaunch stops it; killed, the kernel tells it its parent is gone.
    wait_for(lambda: servers_under(tmp_path) == [], timeout=15, message="TensorBoard to end with tflaunch")
    wait_for(lambda: descendants_alive(str(tmp_path / "never")) == [], timeout=15, message="the task to end")


@pytest.mark.slow
def test_tensorboard_beside_a_run_moves_to_the_next_port_when_another_takes_its_port_first(tflaunch, tmp_path):
    # Someone binds the port tflaunch chose before TensorBoard (seconds into its import) does: the
    # server is started again on the next free port, and still ends when tflaunch is killed.
    out = tmp_path / "tflaunch.out"
    with out.open("w") as sink:
        proc = subprocess.Popen(tflaunch.argv("--local", "1", "--tensorboard", "--log-dir", str(tflaunch.log_dir),
                                              "--", *_waiting_task(tmp_path / "never")),
                                cwd=tflaunch.cwd, env=tflaunch.env(), stdout=sink, stderr=subprocess.STDOUT)
    taker = socket.socket()
    try:
        first = wait_for(lambda: servers_under(tmp_path), timeout=60, interval=0.02, message="TensorBoard to start")[0]
        argv = first.info["cmdline"]
        taken = int(argv[argv.index("--port") + 1])
        # As a server binds (tflaunch's check and TensorBoard's both do): an earlier test's connections
        # to the same port may still be in TIME_WAIT, which is no clash for a server.
        taker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taker.bind(("127.0.0.1", taken))
        taker.listen()
        line = wait_for_line(out, "TensorBoard at", proc)
        url = line.split("TensorBoard at ", 1)[1].split()[0]
        assert url.startswith("http://127.0.0.1:") and not url.startswith(f"http://127.0.0.1:{taken}/"), line
        run_dir = tflaunch.latest_run()
        assert get_json(url + "data/environment")["data_location"] == str(run_dir.resolve() / "tensorboard")
        assert "could not bind" in (run_dir / "tensorboard.log").read_text()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        taker.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # The moved server's parent thread was tflaunch's: the kernel ends it with tflaunch.
    wait_for(lambda: servers_under(tmp_path) == [], timeout=15, message="TensorBoard to end with tflaunch")
    wait_for(lambda: descendants_alive(str(tmp_path / "never")) == [], timeout=15, message="the task to end")
