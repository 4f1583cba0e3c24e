"""The console of real runs: a closed pipe, a real terminal in tmux, Keras progress bars and the
default TensorFlow job, each through the real ``tflaunch`` command."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from conftest import DEFAULT_LOCAL_TWO, ROOT, TASK
from console_names import tasks_saying
from polling import wait_for

STATUS = re.compile(r"tflaunch \d+:\d\d \| [^\r\n]*?attempt \d+")


def test_a_closed_console_leaves_the_run_whole(tflaunch, tmp_path):
    # `| head -1`: head exits after the first line; tflaunch's stdout is then a closed pipe.
    writer = "for i in range(200000): print('line', i)"
    command = shlex.join([*tflaunch.argv("--local", "1", "--log-dir", str(tflaunch.log_dir),
                                         "--", "python", "-c", writer)])
    script = f"{command} | head -1; echo \"tflaunch exit ${{PIPESTATUS[0]}}\" >&2"
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=tflaunch.env(), capture_output=True,
                          text=True, timeout=180)
    assert done.stdout == "worker-0 | line 0\n"
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1] == "tflaunch exit 0", done.stderr  # the run's own exit code
    run_dir = tflaunch.latest_run()
    merged = (run_dir / "merged.log").read_bytes()
    assert len(re.findall(rb"\] worker-0 \| line \d+\n", merged)) == 200_000
    manifest = json.loads((run_dir / "run.json").read_text())
    assert manifest["status"] == "succeeded" and manifest["exit_code"] == 0
    assert manifest["tasks"][0]["state"] == "succeeded"


@pytest.mark.slow
def test_a_terminal_nobody_reads_cannot_stall_the_run(tflaunch, tmp_path):
    # A real terminal (a pty) whose other side is never read: like a hung terminal, every write
    # to it blocks once its buffer is full.
    import pty

    master, slave = pty.openpty()
    try:
        started = time.monotonic()
        proc = subprocess.Popen(tflaunch.argv("--local", "2", "--log-dir", str(tflaunch.log_dir), "--",
                                              "python", TASK, "flood:100000"),
                                cwd=tmp_path, env=tflaunch.env(), stdin=subprocess.DEVNULL, stdout=slave,
                                stderr=slave, start_new_session=True)
        try:
            code = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        took = time.monotonic() - started
    finally:
        os.close(slave)
        os.close(master)
    assert code == 0
    assert took < 60, f"tflaunch took {took:.1f} s with a stalled terminal"
    run_dir = tflaunch.latest_run()
    merged = (run_dir / "merged.log").read_bytes()
    assert len(re.findall(rb"\] worker-\d \| worker-\d line \d+", merged)) == 200_000
    assert json.loads((run_dir / "run.json").read_text())["status"] == "succeeded"


PRINTS_TWICE = ("--local", "2", "--", "python", TASK, "print:first", "sleep:2.5", "print:second")


def on_a_pty(tflaunch, tmp_path, columns: int, env: dict | None = None,
             args: tuple[str, ...] = PRINTS_TWICE) -> tuple[int, bytes]:
    """tflaunch's exit code and every byte it wrote to a real terminal (a pty) of ``columns`` columns."""
    import fcntl
    import pty
    import select
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    proc = subprocess.Popen(tflaunch.argv("--log-dir", str(tflaunch.log_dir), *args),
                            cwd=tmp_path, env=tflaunch.env(env), stdin=slave, stdout=slave, stderr=slave,
                            start_new_session=True)
    os.close(slave)
    out = b""
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: every writer of the terminal has closed it
                    break
                if not data:
                    break
                out += data
            elif proc.poll() is not None:
                break
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    return proc.wait(10), out


@pytest.mark.slow
def test_a_terminal_of_no_columns_gets_the_lines_and_no_status_line(tflaunch, tmp_path):
    # A pty of 0 columns (its size unknown, as some consoles and CI runners report): the status
    # line is left out rather than cut to nothing; the task lines and the summary come whole.
    code, out = on_a_pty(tflaunch, tmp_path, 0)
    text = out.decode("utf-8", "replace")
    assert code == 0, text
    assert "Traceback" not in text and "\x1b[7m" not in text and "\x1b[K" not in text, text
    assert re.search(r"worker-\[0,1\]\S* \| first\r\n", text) and re.search(r"\| second\r\n", text), text
    assert re.search(r"succeeded in \d+\.\d s \(2 tasks\)\r\n", text), text
    # COLUMNS=0 is no size at all: the terminal's own 100 columns hold the status line.
    code, out = on_a_pty(tflaunch, tmp_path, 100, env={"COLUMNS": "0"})
    assert code == 0 and STATUS.search(out.decode("utf-8", "replace")), out[-2000:]


@pytest.mark.slow
def test_the_status_line_names_the_attempt_a_restarted_run_is_in(tflaunch, tmp_path):
    # Attempt 1 fails at once; attempt 2 runs for a few seconds, long enough for the status line to
    # be drawn while it runs: it must say "attempt 2", as `tflaunch status` does.
    task = ("import os, sys, time; attempt = os.environ['TFLAUNCH_ATTEMPT']; print('in attempt', attempt, flush=True); "
            "time.sleep(0.2 if attempt == '1' else 3); sys.exit(attempt == '1')")
    code, out = on_a_pty(tflaunch, tmp_path, 120, args=("--local", "2", "--max-restarts", "1", "--restart-delay", "0",
                                                        "--", "python", "-c", task))
    text = out.decode("utf-8", "replace")
    assert code == 0, text
    second = text.index("in attempt 2")
    drawn = [match.group(0) for match in STATUS.finditer(text[second:])]
    assert drawn and all(line.endswith("attempt 2") for line in drawn), drawn
    assert "restarts" not in text, text


def test_a_pipe_gets_plain_text_without_a_status_line(tflaunch):
    done = tflaunch.run("--local", "2", "--", "python", TASK, "print:hello", "sleep:1.5", "print:bye")
    assert done.returncode == 0, done.stderr
    # Each task's line is there once, under its own name or folded with the other's.
    for line in ("hello", "bye"):
        assert sorted(tasks_saying(done.stdout, line)) == ["worker-0", "worker-1"], done.stdout
    both = done.stdout + done.stderr
    assert "\x1b" not in both and "\r" not in both
    assert not STATUS.search(both)


# ---------------------------------------------------------------------------------------------
# A real terminal: tmux on a private socket


class Tmux:
    """One detached tmux session on its own server socket, removed when the test ends."""

    def __init__(self, cwd: Path):
        self.socket = f"tflaunch-test-{uuid.uuid4().hex[:8]}"
        self.cwd = cwd

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=10,
                              check=True).stdout

    def start(self, command: str, env: dict[str, str]) -> None:
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        # The shell stays after tflaunch ends, so the pane can be read and the exit code seen.
        self.tmux("new-session", "-d", "-x", "120", "-y", "40", "-c", str(self.cwd),
                  f"env {exports} {command}; echo TFLAUNCH-EXIT=$?; sleep 600")

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-J")

    def wait_for_screen(self, wanted, what: str, timeout: float = 60) -> str:
        """The screen once ``wanted(screen)`` holds."""
        def ready() -> str:
            screen = self.screen()
            return screen if wanted(screen) else ""
        return wait_for(ready, timeout=timeout, message=lambda: f"{what}; the screen:\n{self.screen()}")

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=10)


@pytest.fixture
def terminal(tmp_path):
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    made = Tmux(tmp_path)
    yield made
    made.close()


@pytest.mark.slow
def test_status_line_on_a_terminal_and_ctrl_c_stops_the_run_at_once(tflaunch, terminal):
    argv = tflaunch.argv("--local", "2", "--grace", "3", "--log-dir", str(tflaunch.log_dir),
                         "--", "python", TASK, "print:started", "forever")
    terminal.start(shlex.join(argv), {"PYTHONPATH": str(ROOT), "TERM": "xterm-256color"})
    screen = terminal.wait_for_screen(
        lambda s: STATUS.search(s) and "worker-1 running" in s and len(tasks_saying(s, "started")) == 2,
        "both tasks' first line and a status line on the terminal")
    status_line = STATUS.search(screen).group(0)
    assert "worker-0 running" in status_line and "attempt 1" in status_line
    assert sorted(tasks_saying(screen, "started")) == ["worker-0", "worker-1"]
    # The status line is the bottom line of the output, under the task lines.
    lines = [line for line in screen.splitlines() if line.strip()]
    assert STATUS.search(lines[-1]), screen
    # ... and it never reaches the run's files.
    merged = (tflaunch.latest_run() / "merged.log").read_text()
    assert not STATUS.search(merged) and "\x1b" not in merged

    pressed = time.monotonic()
    terminal.tmux("send-keys", "C-c")
    screen = terminal.wait_for_screen(lambda s: "TFLAUNCH-EXIT=" in s, "tflaunch to end after Ctrl-C", timeout=30)
    took = time.monotonic() - pressed
    assert "TFLAUNCH-EXIT=130" in screen, screen
    assert took < 8, f"Ctrl-C took {took:.1f} s to end the run"
    assert not STATUS.search(screen), f"the status line was left behind:\n{screen}"
    manifest = json.loads((tflaunch.latest_run() / "run.json").read_text())
    assert manifest["status"] == "stopped"


# ---------------------------------------------------------------------------------------------
# Real TensorFlow

KERAS_FIT = """
import os
os.environ["TF_USE_LEGACY_KERAS"] = "0"
import numpy as np
import tensorflow as tf
x = np.random.rand(256, 4).astype("float32"); y = (x.sum(1) > 2).astype("float32")
model = tf.keras.Sequential([tf.keras.layers.Dense(8, activation="relu"), tf.keras.layers.Dense(1, activation="sigmoid")])
model.compile("adam", "binary_crossentropy", metrics=["accuracy"])
model.fit(x, y, epochs=2, batch_size=16, verbose=1)
print("fit done")
"""


SGR = re.compile(rb"\x1b\[[0-9;]*m")
# The last drawing of an epoch's progress bar, Keras 3's (tf_keras's, on the tutorial script's run:
# tests/run/test_keras_script.py).
BAR = rb"16/16 (?:\xe2\x94\x81){20} \d+s \d+(?:ms|us|s)/step - accuracy: [\d.]+ - loss: [\d.]+ *"


@pytest.mark.slow
@pytest.mark.tensorflow
def test_keras3_progress_bars_leave_no_backspaces_in_merged_log(tflaunch):
    done = tflaunch.run("--local", "1", "--", "python", "-c", KERAS_FIT, timeout=240)
    assert done.returncode == 0, done.stderr
    raw = (done.run_dir / "worker-0.log").read_bytes()
    assert raw.count(b"\x08") > 80 and b"\r" in raw  # the task really drew a bar in place
    merged = (done.run_dir / "merged.log").read_bytes()
    assert b"\x08" not in merged and b"\r" not in merged
    texts = [SGR.sub(b"", line.split(b" | ", 1)[1]) for line in merged.splitlines() if b"] worker-0 | " in line]
    assert b"" not in texts  # no empty line left where a bar was redrawn
    for epoch in (1, 2):
        at = texts.index(b"Epoch %d/2" % epoch)
        assert re.fullmatch(BAR, texts[at + 1]), texts[at + 1]
    console = [SGR.sub(b"", line.encode()) for line in done.stdout.splitlines() if line.startswith("worker-0 | ")]
    assert "\x08" not in done.stdout and "\r" not in done.stdout and b"worker-0 | Epoch 1/2" in console
    # The line that ends each epoch is shown as the epoch line it is read as (a script with no metric lines).
    epochs = [line for line in console
              if re.fullmatch(rb"worker-0 \| epoch [12]/2  loss [\d.]+  acc [\d.]+  [\d.]+ s  [\d,]+ ms/step", line)]
    assert len(epochs) == 2, console


@pytest.mark.slow
@pytest.mark.tensorflow
@pytest.mark.xdist_group(DEFAULT_LOCAL_TWO)
def test_the_default_job_console_is_for_people(default_local_two):
    done = default_local_two.done
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "TFLAUNCH_METRIC" not in out and "{" not in out
    for chatter in ("oneDNN", "cuda drivers", "cuInit", "absl::InitializeLog", "AsGraphDefInternal"):
        assert chatter not in out + done.stderr, chatter
    assert not re.search(r"\| [IWEF]\d{4} \d\d:", out)
    epochs = re.findall(r"^worker-0 \| epoch (\d+)(?:/\d+)?  loss [\d.]+  acc [\d.]+", out, re.MULTILINE)
    records = [json.loads(line) for line in (done.run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = sorted({r["epoch"] for r in records if r.get("kind") == "epoch"})
    assert len(trained) >= 2 and [int(e) for e in epochs] == trained  # exactly one line per epoch
    assert len(re.findall(r"\| epoch \d", out)) == len(trained)
    assert re.search(r"^worker-0 \| test  loss [\d.]+  acc [\d.]+", out, re.MULTILINE)
    # The files keep every byte the tasks wrote, TensorFlow's own log lines included (which ones it
    # prints depends on the machine: oneDNN's, for one, only on some CPUs).
    tf_lines = re.findall(r"^[IWEF]\d{4} \d\d:\d\d:[\d.]+ +\d+ [\w.]+:\d+\] .+$", done.task_output("worker-0"),
                          re.MULTILINE)
    assert tf_lines and not any(line in out for line in tf_lines), tf_lines[:3]
    assert "TFLAUNCH_METRIC" in done.task_output("worker-1")
    summary = done.stderr
    assert re.search(r"worker-1\s+localhost\s+succeeded\s+exit code 0\s+[\d,]+ MB", summary), summary
    assert re.search(r"training: \d+ epochs in (?:[\d.]+ s|\d+m\d\ds), median [\d,]+ samples/s; last epoch: loss", summary)
    assert re.search(r"test: acc [\d.]+  loss [\d.]+", summary)
    assert f"tflaunch report {done.run_dir.name}" in summary
