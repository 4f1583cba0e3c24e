"""Options that leave a host out, given to a run whose every task is on this machine (never left
out), are refused in one line naming the option and why, from the command line and from launch();
the same options on a run over ssh are accepted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from launcher import launch
from launcher.errors import OptionsError

ROOT = Path(__file__).resolve().parents[2]
WHY = "every task runs on this machine, which a run never leaves out"


def tflaunch(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "launcher", *args, "--dry-run", "--log-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env={"PYTHONPATH": str(ROOT), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"})


@pytest.mark.parametrize("args, named", [
    (["--local", "2", "--min-workers", "1"], "--min-workers 1"),
    (["--local", "2", "--on-straggler", "exclude"], "--on-straggler exclude"),
    (["-H", "localhost:3", "--chief", "--on-straggler", "exclude"], "--on-straggler exclude"),
])
def test_a_local_run_refuses_what_could_never_act(tmp_path, args, named):
    done = tflaunch(tmp_path, *args)
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"tflaunch: error: {named}: {WHY}, so "), line


def test_launch_refuses_them_in_its_own_words(tmp_path):
    with pytest.raises(OptionsError, match=rf"^min_workers=1: {WHY}, so no host is lost"):
        launch(local=2, min_workers=1, log_dir=tmp_path)
    with pytest.raises(OptionsError, match=rf"^on_straggler='exclude': {WHY}, so a straggler's host cannot"):
        launch(local=2, on_straggler="exclude", log_dir=tmp_path)
    assert not any(tmp_path.iterdir())  # refused before any run folder


def test_a_run_over_ssh_takes_them(tmp_path):
    done = tflaunch(tmp_path, "-H", "nodeX:2", "--spares", "nodeY", "--min-workers", "1", "--on-straggler", "exclude")
    assert done.returncode == 0, done.stderr
    assert "min_workers: 1" in done.stdout
