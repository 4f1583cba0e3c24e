"""The options that choose a cluster are written once (launcher/cli/options.py): run, check and export
show them with the same names and values, and the same help where they mean the same (export's
--local and -H say what they become in a manifest), and name the same cluster with them."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

from launcher.cli.group import cli

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ("run", "check", "export")
SHARED = ("--local", "--hosts", "--hostfile", "--chief", "--ps", "--evaluator")
EXPORT_WORDS = ("--local", "--hosts")  # what export's --local and -H make: pods, not tasks on this machine
WITH_GPUS = ("run", "check")  # GPU indices of the hosts; export's --gpus is a count per pod


def help_text(command: str) -> str:
    done = subprocess.run([sys.executable, "-m", "launcher", command, "--help"], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return done.stdout


def option_entries(text: str) -> dict[str, str]:
    """Each option's entry of a --help text, by its long name, unwrapped: the lines joined by one space
    (directly after a line that ends in a hyphen, where click broke a word such as round-robin)."""
    section = text.split("\nOptions:\n", 1)[1]
    entries: list[list[str]] = []
    for line in section.splitlines():
        if re.match(r"^  -", line):
            entries.append([line.strip()])
        elif line.startswith("   ") and entries:
            entries[-1].append(line.strip())
    found = {}
    for lines in entries:
        joined = lines[0]
        for line in lines[1:]:
            joined += line if joined.endswith("-") and not joined.endswith(" -") else " " + line
        long_name = re.search(r"--[\w-]+", joined).group(0)
        found[long_name] = " ".join(joined.split())
    return found


def test_run_check_and_export_show_the_cluster_options_identically():
    texts = {command: help_text(command) for command in COMMANDS}
    entries = {command: option_entries(text) for command, text in texts.items()}
    for option in SHARED:
        shown = {command: entries[command].get(option) for command in COMMANDS}
        assert None not in shown.values(), shown
        assert len(set(shown.values())) == (2 if option in EXPORT_WORDS else 1), shown
        if option in EXPORT_WORDS:
            assert shown["run"] == shown["check"] and "pod" in shown["export"], shown
    gpus = {command: entries[command].get("--gpus") for command in WITH_GPUS}
    assert None not in gpus.values() and len(set(gpus.values())) == 1, gpus
    # export's --gpus is a count, as pods ask for GPUs, not this machine's GPU indices.
    assert entries["export"]["--gpus"].startswith("--gpus N N GPUs for each chief and worker task: nvidia.com/gpu N "
                                                  "per pod"), entries["export"]["--gpus"]
    assert texts["check"].startswith("Usage: tflaunch check [OPTIONS] (CLUSTER.yaml | --local N | -H HOSTS)\n")
    # Only run has --slurm, so only run's help speaks of it.
    for command in COMMANDS:
        assert ("--slurm" in texts[command]) == (command == "run"), command
    assert entries["check"]["--spares"] == entries["export"]["--spares"]
    assert entries["run"]["--spares"].startswith(entries["check"]["--spares"].replace(",...", ",...|K", 1))
    for command in ("run", "export"):  # the commands that take a task command
        usage = texts[command].splitlines()[0]
        assert usage == f"Usage: tflaunch {command} [OPTIONS] (CLUSTER.yaml | --local N | -H HOSTS) [-- CMD...]"


@pytest.mark.unit
def test_the_cluster_options_are_one_set_of_click_parameters():
    # The same records click prints, compared exactly (no wrapping in between): names, metavar, help.
    def records(command: str) -> dict[str, tuple]:
        cmd = cli.get_command(click.Context(cli), command)
        ctx = click.Context(cmd, info_name=command)
        return {p.name: (tuple(p.opts), p.get_help_record(ctx) if isinstance(p, click.Option) else p.metavar)
                for p in cmd.params}

    found = {command: records(command) for command in COMMANDS}
    names = ("cluster", "local", "hosts", "hostfile", "chief", "ps", "evaluator")
    for name in names:
        assert found["run"][name] == found["check"][name], name
        assert (found["export"][name] == found["run"][name]) == (f"--{name}" not in EXPORT_WORDS), name
    assert found["run"]["gpus"] == found["check"]["gpus"]
    # The cluster options come first, in one order, in every command.
    for command in COMMANDS:
        assert list(found[command])[:len(names)] == list(names), command


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_names_the_same_cluster_with_the_shared_options(tmp_path, command):
    args = {"run": ["run", "--dry-run", "--log-dir", str(tmp_path)], "check": ["check", "--json"],
            "export": ["export", "--format", "sh"]}[command]
    done = subprocess.run([sys.executable, "-m", "launcher", *args, "-H", "localhost:3", "--chief", "--evaluator"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={"PYTHONPATH": str(ROOT), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"})
    if command == "check":
        assert done.returncode in (0, 1), done.stderr  # 1: a check failed on this machine, which is not the point
        ports = [item["detail"] for item in json.loads(done.stdout)["items"] if item["check"].startswith("port ")]
        assert sorted(ports) == ["free (chief-0)", "free (evaluator-0)", "free (worker-0)"], done.stdout
        return
    assert done.returncode == 0, done.stderr
    for task in ("chief-0", "worker-0", "evaluator-0"):
        assert task in done.stdout, done.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_checks_the_counts_in_the_words_launch_uses(tmp_path, command):
    # One check (launcher/sources/choose.py) for every front end: the flags only parse the number.
    from launcher import launch
    from launcher.errors import OptionsError

    extra = {"run": ["--dry-run", "--log-dir", str(tmp_path)], "check": [], "export": ["--format", "sh"]}[command]
    for given, kwargs, expected in ((["--local", "0"], {"local": 0}, "local: expected a whole number >= 1, got 0"),
                                    (["--local", "2", "--ps", "-1"], {"local": 2, "ps": -1},
                                     "ps: expected a whole number >= 0, got -1")):
        done = subprocess.run([sys.executable, "-m", "launcher", command, *given, *extra], capture_output=True,
                              text=True, timeout=60, cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
        assert done.returncode == 2 and done.stderr.splitlines() == [f"tflaunch: error: --{expected}"], done.stderr
        with pytest.raises(OptionsError) as error:
            launch(**kwargs, log_dir=tmp_path)
        assert str(error.value) == expected


def test_the_start_timeout_says_what_counts_as_progress_in_help_and_docs():
    # A script of one's own is judged by what the rule counts; --help and the docs must name all of it.
    from launcher.run.faults.watchdog import CPU_SHARE

    share = f"{CPU_SHARE:.0%}"
    entry = option_entries(help_text("run"))["--start-timeout"]
    assert all(part in entry for part in ("metric line", "Keras", f"{share} of a core", "S/2")), entry
    docs = " ".join((ROOT / "docs" / "fault-tolerance.md").read_text().split())
    rule = docs.split("- `--start-timeout S`:", 1)[1].split("- `--hang-timeout S`", 1)[0]
    assert all(part in rule for part in ("TFLAUNCH_METRIC", "Keras", f"{share[:-1]} % of one core", "S/2")), rule
