"""Which task commands the Keras note concerns: what they run, and what a Python program imports."""

from __future__ import annotations

import pytest

from launcher.cluster.commands import LEGACY_KERAS_NOTE, may_import_tensorflow, runs_python
from launcher.cluster.plan import RunContext, plan_cluster
from launcher.cluster.reader import parse_cluster

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("argv, python", [
    (("python", "-m", "trainer"), False), (("/venv/bin/python3.11", "train.py"), True),
    (("./train.py", "--epochs", "3"), True), (("env", "A=1", "python3", "-c", "import keras"), True),
    (("python", "-c", "print(1)"), False), (("python", "-m", "mytrainer"), True),
    (("python", "-c", "import os, sys; print(sys.argv)"), False), (("python", "-c", "import numpy"), True),
    (("python",), True), (("python", "-c"), True),
    (("bash", "-c", "cd src && python train.py"), True), (("/opt/interp", "-m", "trainer"), False),
    (("sleep", "30"), False), (("true",), False), (("sh", "-c", "echo $TFLAUNCH_TASK"), False),
    (("./a.out",), False), (("env",), False)])
def test_which_commands_can_run_tensorflow(argv, python):
    assert runs_python(argv, "/opt/interp") is python


@pytest.mark.parametrize("source, may", [
    ("print('hi')", False),
    ("import json, os.path\nfrom collections import deque\n", False),
    ("import tensorflow as tf", True), ("from keras import layers", True), ("import tf_keras", True),
    ("import numpy", True),  # outside the standard library: it may import TensorFlow itself
    ("from . import model", True), ("from .model import build", True),  # the script's own package
    ("def main():\n    import mymodel\n", True),  # imports anywhere, not only at the top
    ("exec(open('train2.py').read())", True), ("__import__('tensorflow')", True),
    ("import importlib\nimportlib.import_module('tensorflow')", True),
    ("import runpy\nrunpy.run_path('train.py')", True),
    ("def broken(:\n", True),  # cannot tell: counted as one that may
])
def test_what_python_source_may_import(source, may):
    assert may_import_tensorflow(source) is may


def test_a_script_is_read_where_the_task_runs_it():
    read = []

    def text(path):
        read.append(path)
        return {"/w/plain.py": "import sys\n", "/w/train.py": "import tensorflow\n"}.get(path)

    assert runs_python(("python", "plain.py"), "", "/w", text) is False
    assert runs_python(("python", "train.py"), "", "/w", text) is True
    assert runs_python(("/opt/plain.py",), "", "/w", text) is True  # not readable: counted as one that may
    assert runs_python(("./plain.py", "--x"), "", "/w", text) is False
    assert read == ["/w/plain.py", "/w/train.py", "/opt/plain.py", "/w/plain.py"]


@pytest.mark.parametrize("command, script, noted", [
    (None, None, False), (("python", "-c", "pass"), None, False), (("python", "-c", "import tensorflow"), None, True),
    (("train.py",), None, True), (("train.py",), "print(1)\n", False), (("train.py",), "import tf_keras\n", True),
    (("sleep", "1"), None, False)])
def test_the_keras_note_follows_the_command(command, script, noted):
    spec = parse_cluster("worker: [localhost:1, localhost:2]\n", "c.yaml", frozenset({"localhost"}))
    plan = plan_cluster(spec, RunContext(run_id="r", run_dir="/logs/r"), local_hosts=frozenset({"localhost"}),
                        cores_by_host={}, default_python="/venv/bin/python", default_workdir="/w", command=command,
                        script_text=lambda path: script if path == "/w/train.py" else None)
    assert {launch.env["TF_USE_LEGACY_KERAS"] for launch in plan.launches} == {"1"}  # set either way
    assert (LEGACY_KERAS_NOTE in plan.notes) is noted


def test_a_script_on_another_host_is_never_read():
    spec = parse_cluster("worker: [h1:1, h2:2]\n", "c.yaml", frozenset({"localhost"}))
    read = []
    plan = plan_cluster(spec, RunContext(run_id="r", run_dir="/logs/r"), local_hosts=frozenset({"localhost"}),
                        cores_by_host={}, default_python="python3", default_workdir="/w", command=("train.py",),
                        script_text=lambda path: read.append(path) or "print(1)\n")
    assert read == [] and LEGACY_KERAS_NOTE in plan.notes  # what runs there is not known here
