"""The command group: every command is found by its name, --help lists them all, and a run loads
only the module of the command it uses."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

from launcher.cli.group import COMMAND_MODULES, cli

ROOT = Path(__file__).resolve().parents[2]


def test_the_command_table_names_exactly_the_commands_the_modules_define():
    for module in set(COMMAND_MODULES.values()):
        importlib.import_module(f"launcher.cli.{module}")
    assert set(cli.commands) == set(COMMAND_MODULES)
    for name, module in COMMAND_MODULES.items():
        assert cli.commands[name].callback.__module__ == f"launcher.cli.{module}", name


def test_help_lists_every_command():
    done = subprocess.run([sys.executable, "-m", "launcher", "--help"], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    listed = done.stdout.split("Commands:", 1)[1].split()
    assert set(COMMAND_MODULES) <= set(listed)


def test_a_run_loads_only_the_run_commands_module(tmp_path):
    code = ("import sys\n"
            "from launcher.cli import main\n"
            "try:\n"
            "    main(['--local', '2', '--dry-run'])\n"
            "except SystemExit as done:\n"
            "    assert done.code == 0, done.code\n"
            "print('LOADED', sorted(m for m in sys.modules if m.startswith('launcher.cli.')))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("LOADED ")]
    assert line == "LOADED ['launcher.cli.group', 'launcher.cli.joining', 'launcher.cli.options', 'launcher.cli.run']"


def test_a_command_given_by_name_still_runs_from_its_own_module(tmp_path):
    done = subprocess.run([sys.executable, "-m", "launcher", "runs", "--log-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "no runs" in (done.stdout + done.stderr).lower()


def test_runs_where_no_run_ever_wrote_a_log_directory_says_no_runs_yet(tmp_path):
    """A fresh clone has no logs/: listing its runs finds none, which is no error."""
    for args, stdout in ((["runs"], ""), (["runs", "--json"], "[]\n")):
        done = subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True, text=True, timeout=60,
                              cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
        assert (done.returncode, done.stdout) == (0, stdout), done.stderr
        assert done.stderr == ("no runs in logs/ yet\n" if not stdout else ""), done.stderr
    assert not (tmp_path / "logs").exists()


def test_version_exits_0_and_output_into_a_closed_pipe_exits_1_without_a_traceback(tmp_path):
    version = subprocess.run([sys.executable, "-m", "launcher", "--version"], capture_output=True, text=True,
                             timeout=60, cwd=ROOT)
    assert version.returncode == 0 and version.stdout.startswith("tflaunch, version "), version.stderr
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody reads: the first write fails with EPIPE (Python ignores SIGPIPE)
    try:
        done = subprocess.run([sys.executable, "-m", "launcher", "--local", "2", "--dry-run", "--log-dir",
                               str(tmp_path)], stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60,
                              cwd=ROOT)
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (1, "")
