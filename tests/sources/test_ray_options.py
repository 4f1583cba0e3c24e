"""``--ray`` given wrongly: one line naming what is wrong, exit 2, before Ray is asked anything; and
the core install, which never imports Ray."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import ROOT


@pytest.mark.parametrize("args, said", [
    (["--ray", "auto", "--local", "2"], "--ray takes its hosts from the Ray cluster; drop the cluster file, --local"),
    (["--ray", "auto"], "--ray needs --nnodes N (or MIN:MAX)"),
    (["--ray", "auto", "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:29455"], "--ray places every node itself"),
    (["--ray", "auto", "--nnodes", "2", "--gpus", "0"], "give --gpus-per-task G, not --gpus"),
    (["--ray", "head-node", "--nnodes", "2"], "--ray: expected auto, HOST:PORT or ray://HOST:PORT (PORT 1-65535), "
                                              "got 'head-node'"),
    (["--ray", "127.0.0.1:1", "--nnodes", "2"], "--ray 127.0.0.1:1: no Ray cluster answers there"),
    (["--local", "2", "--gpus-per-task", "1"], "--gpus-per-task goes with --ray"),
])
def test_bad_ray_options_are_one_line_and_exit_2(tflaunch, args, said):
    done = tflaunch.run(*args, "--", "true", timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tflaunch: error: ") and said in lines[0], done.stderr
    assert done.run_dir is None


def test_a_command_without_dashes_after_ray_is_named_with_them(tflaunch):
    done = tflaunch.run("--ray", "auto", "--nnodes", "2", "python", "train.py", timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith("tflaunch: error: the task command goes after '--': tflaunch --ray auto "
                                  "--nnodes 2 -- python train.py")  # the fixture adds --log-dir after it
    assert len(done.stderr.splitlines()) == 1


def test_the_launcher_imports_ray_only_when_a_run_names_it():
    code = ("import sys, launcher.cli.run, launcher.sources.ray, launcher.transports.ray, launcher.api; "
            "print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("section, said", [
    ("ray:\n  nnodes: two\n", "ray.nnodes: expected N or MIN:MAX"),
    ("ray:\n  address: head\n  nnodes: 2\n", "ray.address: expected auto, HOST:PORT or ray://HOST:PORT"),
    ("ray:\n  nnodes: 2\n  gpu_per_task: 1\n", "ray.gpu_per_task: unknown key; did you mean 'gpus_per_task'?"),
    ("ray:\n  tasks_per_node: 2\n", "ray.nnodes: expected the Ray nodes to run on"),
    ("ray:\n  nnodes: 2\nworker: [localhost:auto]\n", "ray: this file's tasks are placed on the Ray cluster's nodes"),
])
def test_a_bad_ray_section_is_one_line_naming_the_key(tflaunch, tmp_path, section, said):
    path = tmp_path / "ray.yaml"
    path.write_text(section)
    done = tflaunch.run(str(path), timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tflaunch: error: {path}: {said}"), done.stderr


@pytest.mark.parametrize("command", ["check", "export"])
def test_check_and_export_take_no_ray_section(tflaunch, tmp_path, command):
    path = tmp_path / "ray.yaml"
    path.write_text("ray:\n  address: 127.0.0.1:1\n  nnodes: 2\n")
    done = subprocess.run(tflaunch.argv(command, str(path)), cwd=tmp_path, env=tflaunch.env(), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr == (f"tflaunch: error: {path}: ray: a Ray cluster's nodes are placed only when the file runs "
                           f"('tflaunch {path}'); check and export take no ray: section\n")


def test_slurm_takes_no_ray_section(tflaunch, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("ray:\n  address: 127.0.0.1:1\n  nnodes: 2\n")
    done = tflaunch.run("--slurm", str(path))
    assert done.returncode == 2
    assert done.stderr == (f"tflaunch: error: {path}: ray: with --slurm the nodes are the allocation's; remove the "
                           "'ray:' section, or run the file without --slurm to place it on Ray\n")
