"""RUN as a run folder's path (what tab completion gives) in every command that takes RUN, next to
ids, prefixes and ``latest``: resolved once, in launcher.inspect.runs, for real runs."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from conftest import TASK
from launcher.errors import RunNotFoundError
from launcher.inspect.runs import resolve_run, resolve_runs

pytestmark = pytest.mark.timeout(180)


def finished_run(tflaunch, *actions: str) -> Path:
    done = tflaunch.run("--local", "1", "--", "python", TASK, *actions)
    assert done.returncode == 0, done.stderr[-3000:]
    run_id = re.search(r"^tflaunch: run (\S+): \d+ tasks? from ", done.stderr, re.M).group(1)
    return tflaunch.log_dir / run_id


def epoch(seconds: float) -> str:
    """A task.py action printing one epoch's metric line, for report and compare."""
    return "print:TFLAUNCH_METRIC " + json.dumps({"kind": "epoch", "epoch": 1, "loss": 0.5, "accuracy": 0.6,
                                                  "epoch_seconds": seconds, "samples_per_second": 64 / seconds,
                                                  "global_batch": 64, "replicas": 1})


@pytest.fixture
def two_runs(tflaunch) -> tuple[Path, Path]:
    return (finished_run(tflaunch, "print:first-run", epoch(2.0)),
            finished_run(tflaunch, "print:second-run", epoch(1.0)))


def test_every_form_of_run_names_the_same_folder(tflaunch, two_runs, monkeypatch):
    first, second = two_runs
    monkeypatch.chdir(tflaunch.cwd)
    relative = f"logs/{first.name}"
    assert resolve_run(tflaunch.log_dir, first.name).path == first
    for ref in (f"{relative}/", relative, f"./{relative}/", str(first), f"{first}/",
                f"{relative}/../{first.name}"):
        run = resolve_run("elsewhere", ref)  # a path is read where it points, whatever the log directory
        assert run.run_id == first.name and run.path.resolve() == first.resolve(), ref
    # A path's last part may be a prefix or 'latest' of the folder it is in, as an id is of the log directory.
    assert resolve_run("elsewhere", "logs/latest").run_id == second.name
    differ = next(i for i, (a, b) in enumerate(zip(first.name, second.name)) if a != b)
    assert resolve_run("elsewhere", f"logs/{first.name[:differ + 1]}").run_id == first.name
    monkeypatch.chdir(first)
    assert resolve_run("elsewhere", ".").run_id == first.name
    assert [r.run_id for r in resolve_runs(tflaunch.log_dir, [f"{second}/", first.name])] == [second.name, first.name]


def test_paths_that_name_no_run_are_one_line_errors(tflaunch, two_runs, tmp_path):
    first, _ = two_runs
    stray = tmp_path / "not-a-run"
    stray.mkdir()
    cases = {
        f"{stray}/": f"{stray}: no run.json; not a tflaunch run folder",
        f"{tmp_path}/nowhere/{first.name}": f"no run folder '{tmp_path}/nowhere/{first.name}': "
                                            f"{tmp_path}/nowhere does not exist",
        f"{tflaunch.log_dir}/19990101": f"no run '19990101' in {tflaunch.log_dir}/; the latest runs are: ",
    }
    for ref, message in cases.items():
        with pytest.raises(RunNotFoundError) as error:
            resolve_run(tflaunch.log_dir, ref)
        assert str(error.value).startswith(message), (ref, str(error.value))


def test_commands_take_a_run_folder_path_with_or_without_a_slash(tflaunch, two_runs):
    first, second = two_runs
    for ref in (f"logs/{first.name}/", f"logs/{first.name}", f"{first}/"):
        logs = tflaunch.run("logs", ref)
        assert logs.returncode == 0 and "Traceback" not in logs.stderr, (ref, logs.stderr)
        assert "first-run" in logs.stdout and "second-run" not in logs.stdout, ref
    status = tflaunch.run("status", f"logs/{second.name}/", "--json")
    assert status.returncode == 0 and f'"run_id": "{second.name}"' in status.stdout, status.stderr
    report = tflaunch.run("report", f"logs/{first.name}/")
    assert report.returncode == 0 and f"run {first.name} " in report.stdout, report.stderr
    compare = tflaunch.run("compare", f"logs/{first.name}/", f"{second}/", "--json")
    assert compare.returncode == 0, compare.stderr
    assert [row["run_id"] for row in json.loads(compare.stdout)["runs"]] == [first.name, second.name]
    # A run folder moved out of the log directory is still read where it is.
    moved = tflaunch.cwd / "kept" / first.name
    moved.parent.mkdir()
    shutil.move(first, moved)
    logs = tflaunch.run("logs", os.path.relpath(moved, tflaunch.cwd) + "/")
    assert logs.returncode == 0 and "first-run" in logs.stdout, logs.stderr


def test_a_path_that_is_not_a_run_folder_is_one_line_and_exit_2(tflaunch, two_runs):
    (tflaunch.cwd / "empty").mkdir()
    done = tflaunch.run("logs", "empty/")
    assert done.returncode == 2
    assert done.stderr.splitlines() == ["tflaunch: error: empty: no run.json; not a tflaunch run folder"]
