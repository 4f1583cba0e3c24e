"""The suite's own rules (tests/tiers.py and pyproject.toml's pytest settings), on a real pytest run of
small test files in a folder of their own, as a developer's mistake would meet them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CONFTEST = '''
import pytest

pytest_plugins = ["tiers"]


@pytest.fixture
def tflaunch():
    return "a stand-in: only the fixture's name matters to the unit rule"
'''


def pytest_run(folder: Path, body: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run pytest on ``body`` (a test file) with the project's settings, as its own process."""
    (folder / "conftest.py").write_text(CONFTEST)
    (folder / "test_sample.py").write_text(textwrap.dedent(body))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests")}
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir",
                           str(folder), "-p", "no:cacheprovider", "-q", "-rA", str(folder / "test_sample.py"),
                           *args], cwd=folder, env=env, capture_output=True, text=True, timeout=120)


def outcomes(done: subprocess.CompletedProcess[str]) -> dict[str, str]:
    """Each test's outcome by name, read from pytest's -rA summary (an error wins over a pass)."""
    found: dict[str, str] = {}
    for line in done.stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word in ("PASSED", "FAILED", "ERROR") and "::" in rest:
            name = rest.split("::", 1)[1].split(" ", 1)[0]
            if found.get(name) != "ERROR":
                found[name] = word
    return found


def test_a_unit_test_that_is_also_slow_or_runs_tflaunch_errors_unrun_and_the_others_run(tmp_path):
    ran = tmp_path / "ran"
    ran.mkdir()
    body = f'''
        import pytest
        from pathlib import Path

        pytestmark = pytest.mark.unit

        def test_pure():
            Path({str(ran)!r}, "pure").touch()

        @pytest.mark.slow
        @pytest.mark.ssh
        def test_marked_slow():
            Path({str(ran)!r}, "slow").touch()

        def test_with_tflaunch(tflaunch):
            Path({str(ran)!r}, "tflaunch").touch()
        '''
    done = pytest_run(tmp_path, body)
    assert outcomes(done) == {"test_pure": "PASSED", "test_marked_slow": "ERROR", "test_with_tflaunch": "ERROR"}, \
        done.stdout
    assert sorted(p.name for p in ran.iterdir()) == ["pure"]
    assert "test_sample.py::test_marked_slow is marked unit (pure logic, no TensorFlow, ssh, Slurm or tflaunch " \
           "run) but is also marked slow, marked ssh: drop the unit mark or move the test" in done.stdout
    assert "test_with_tflaunch is marked unit" in done.stdout and "also uses the tflaunch fixture" in done.stdout
    # Deselected with -m unit: a slow test cannot slip into the fast tier unseen.
    assert "1 passed, 2 errors" in pytest_run(tmp_path, body, "-m", "unit").stdout


def test_a_test_that_leaves_env_cwd_or_a_signal_handler_changed_errors_and_the_next_starts_clean(tmp_path):
    done = pytest_run(tmp_path, f'''
        import os, signal

        def test_1_leaves_env():
            os.environ["TFLAUNCH_TEST_LEFTOVER"] = "1"

        def test_2_sees_no_leftover_env():
            assert "TFLAUNCH_TEST_LEFTOVER" not in os.environ

        def test_3_leaves_cwd():
            os.chdir("/")

        def test_4_starts_where_the_others_did():
            assert os.getcwd() == {str(tmp_path)!r}

        def test_5_leaves_a_handler():
            signal.signal(signal.SIGTERM, lambda *_: None)

        def test_6_has_the_default_handler():
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL

        def test_7_undoes_its_handler_with_the_fixture(signal_handlers):
            signal.signal(signal.SIGTERM, lambda *_: None)

        def test_8_undoes_its_env_with_monkeypatch(monkeypatch):
            monkeypatch.setenv("TFLAUNCH_TEST_LEFTOVER", "2")
            monkeypatch.chdir("/")
        ''', "-p", "no:randomly")
    assert outcomes(done) == {
        "test_1_leaves_env": "ERROR", "test_2_sees_no_leftover_env": "PASSED", "test_3_leaves_cwd": "ERROR",
        "test_4_starts_where_the_others_did": "PASSED", "test_5_leaves_a_handler": "ERROR",
        "test_6_has_the_default_handler": "PASSED", "test_7_undoes_its_handler_with_the_fixture": "PASSED",
        "test_8_undoes_its_env_with_monkeypatch": "PASSED"}, done.stdout
    assert "the test changed os.environ (added TFLAUNCH_TEST_LEFTOVER) and did not undo it" in done.stdout
    assert f"the test changed the working directory (/ instead of {tmp_path})" in done.stdout
    assert "the test changed the handlers of SIGTERM and did not undo it" in done.stdout


@pytest.mark.slow
def test_a_hanging_test_fails_at_its_timeout_and_the_run_goes_on(tmp_path):
    # The project's settings (timeout method and all) with the default shortened to 5 s.
    done = pytest_run(tmp_path, '''
        import threading

        def test_hangs():
            threading.Event().wait()

        def test_after_the_hang():
            pass
        ''', "-o", "timeout=5")
    assert outcomes(done) == {"test_hangs": "FAILED", "test_after_the_hang": "PASSED"}, done.stdout
    assert "Timeout (>5.0s) from pytest-timeout" in done.stdout, done.stdout


def test_the_project_settings_name_the_unit_marker_a_timeout_and_keep_the_default_order(tmp_path):
    done = pytest_run(tmp_path, '''
        def test_config(pytestconfig):
            import json
            print("CONFIG", json.dumps({"timeout": pytestconfig.getini("timeout"),
                                        "method": pytestconfig.getini("timeout_method"),
                                        "markers": [m.split(":")[0] for m in pytestconfig.getini("markers")]}))
        ''', "-s")
    line = next(line for line in done.stdout.splitlines() if line.startswith("CONFIG "))
    config = json.loads(line[7:])
    assert float(config["timeout"]) >= 120 and config["method"] == "signal"
    assert {"unit", "slow", "tensorflow", "ssh", "slurm", "gpu"} <= set(config["markers"])
    assert "randomly-seed" not in done.stdout  # random order only when asked for (-p randomly)


def test_test_files_are_grouped_as_the_code_is_and_named_once():
    tests = ROOT / "tests"
    packages = {p.parent.name for p in (ROOT / "launcher").glob("*/__init__.py")}
    groups = packages | {"api", "trainer", "security", "project"}
    # A layer's sub-package (launcher/run/console/) has its own folder under the layer's (tests/run/console/).
    subpackages = {p.parent.relative_to(ROOT / "launcher").parts for p in (ROOT / "launcher").glob("*/*/__init__.py")}
    files = sorted(tests.rglob("test_*.py"))
    folders = [f.parent.relative_to(tests).parts for f in files]
    misplaced = [str(f.relative_to(tests)) for f, folder in zip(files, folders)
                 if not (len(folder) == 1 and folder[0] in groups or len(folder) == 2 and folder in subpackages)]
    assert misplaced == [], f"test files outside tests/<layer>/ ({sorted(groups)}) or tests/<layer>/<package>/: {misplaced}"
    names = [f.name for f in files]
    assert sorted({n for n in names if names.count(n) > 1}) == [], "two test files share a name"
    # Every layer of the launcher, and every package of a layer, has its folder of tests.
    assert packages - {folder[0] for folder in folders} == set()
    assert subpackages - set(folders) == set()


def test_a_unit_or_fast_test_that_imports_tensorflow_errors_and_a_tensorflow_test_may(tmp_path):
    # Modules named as TensorFlow's, in the sample's folder: what a light test must not import. (Each
    # test imports its own: the first test to import one is the one that errors.)
    for name in ("tensorflow", "tf_keras", "keras"):
        (tmp_path / f"{name}.py").write_text("")
    body = '''
        import pytest

        @pytest.mark.unit
        def test_pure_imports_it():
            import tensorflow

        def test_fast_imports_it():
            import tf_keras

        def test_fast_does_not():
            pass

        @pytest.mark.slow
        @pytest.mark.tensorflow
        def test_marked_tensorflow_imports_it():
            import keras
    '''
    done = pytest_run(tmp_path, body)
    assert outcomes(done) == {"test_pure_imports_it": "ERROR", "test_fast_imports_it": "ERROR",
                              "test_fast_does_not": "PASSED",
                              "test_marked_tensorflow_imports_it": "PASSED"}, done.stdout
    assert "test_sample.py::test_fast_imports_it is a unit or fast test but imported tf_keras" in done.stdout


def test_only_the_tasks_of_a_test_marked_tensorflow_may_run_it_whatever_its_tier(tmp_path):
    body = '''
        import pytest
        from tiers import tensorflow_free

        def test_fast(request):
            assert tensorflow_free(request.node)

        @pytest.mark.slow
        def test_processes(request):
            assert tensorflow_free(request.node)

        @pytest.mark.slow
        @pytest.mark.ssh
        def test_ssh(request):
            assert tensorflow_free(request.node)

        @pytest.mark.slow
        @pytest.mark.tensorflow
        def test_tensorflow(request):
            assert not tensorflow_free(request.node)
    '''
    done = pytest_run(tmp_path, body)
    assert outcomes(done) == dict.fromkeys(("test_fast", "test_processes", "test_ssh", "test_tensorflow"), "PASSED"), \
        done.stdout
    # The tflaunch fixture asks it for every test, not only the light ones.
    fixture = (ROOT / "tests" / "conftest.py").read_text()
    assert "Tflaunch(tmp_path / \"logs\", tmp_path, no_tensorflow=tensorflow_free(request.node))" in fixture


def test_the_tasks_of_a_fast_test_cannot_import_tensorflow_and_those_of_a_tensorflow_test_can(tmp_path):
    from conftest import Tflaunch
    from tiers import NO_TENSORFLOW

    code = "import tensorflow"
    light = Tflaunch(tmp_path, tmp_path, no_tensorflow=True).env()
    assert light["PYTHONPATH"].split(os.pathsep) == [str(NO_TENSORFLOW), str(ROOT)]
    for module in ("tensorflow", "tf_keras", "keras"):
        refused = subprocess.run([sys.executable, "-c", f"import {module}"], env=light, capture_output=True,
                                 text=True, timeout=60)
        assert refused.returncode == 1 and (f"ImportError: {module} in a test not marked tensorflow: TensorFlow runs only in "
                                            "tests marked tensorflow") in refused.stderr, refused.stderr
    # The trainer's modules that train import TensorFlow: they cannot be imported there either.
    trainer = subprocess.run([sys.executable, "-c", "import trainer.strategy"], env=light, capture_output=True,
                             text=True, timeout=120, cwd=ROOT)
    assert trainer.returncode != 0 and "TensorFlow runs only in tests marked tensorflow" in trainer.stderr
    heavy = Tflaunch(tmp_path, tmp_path).env()
    assert heavy["PYTHONPATH"] == str(ROOT)
    where = "import importlib.util as u; print(u.find_spec('tensorflow').origin)"
    found = subprocess.run([sys.executable, "-c", where],
                           env=heavy, capture_output=True, text=True, timeout=60)
    assert "no_tensorflow" not in found.stdout and found.stdout.strip().endswith("__init__.py"), found.stdout
