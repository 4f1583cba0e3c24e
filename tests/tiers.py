"""Rules of the test tiers and of test isolation, loaded by conftest.py as a pytest plugin.

- A test marked ``unit`` (the pure tier: ``pytest -m unit``) or ``project`` (a check of the source
  tree) may not also be marked slow, tensorflow, ssh, slurm or gpu, nor use a fixture that starts
  tflaunch, test hosts or a Slurm cluster; such a test errors at setup, naming what it is marked or
  uses, and is not run.
- A test of the unit or fast tier (:func:`light`) may not import TensorFlow (or tf_keras, or Keras):
  one that does errors at teardown, naming the modules. The tasks that any test not marked
  ``tensorflow`` starts through the ``tflaunch`` fixture (:func:`tensorflow_free`) find
  :data:`NO_TENSORFLOW` first on their path, whose ``tensorflow`` fails to import, so neither the
  trainer nor any TensorFlow program runs there: a test that lost its mark fails at once instead of
  running TensorFlow in a tier that runs beside others or is not counted as TensorFlow's.
- Every test leaves the process as it found it: the working directory, os.environ and the handlers of
  the signals tflaunch handles. A test that changes one of them without undoing it (monkeypatch
  undoes its own changes; the fixture ``signal_handlers`` puts the handlers back) errors at teardown,
  naming the change, which is undone so that the tests after it, in whatever order they run, start
  from the same state.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

NOT_UNIT_MARKERS = ("slow", "tensorflow", "ssh", "slurm", "ray", "gpu")
HEAVY_MARKERS = ("slow", "ssh", "slurm", "ray", "tensorflow")  # the fast tier is the tests with none of these
TENSORFLOW_MODULES = ("tensorflow", "tf_keras", "keras")
# Packages named as TensorFlow's that fail to import: first on the path of a light test's tasks.
NO_TENSORFLOW = Path(__file__).resolve().parent / "no_tensorflow"
PROCESS_FIXTURES = ("tflaunch", "testhosts", "testslurm", "raycluster")
# Variables set by others than the test: pytest (for every phase of every test) and scikit-learn (with
# os.environ.setdefault, the first time it is imported, whichever test that is).
NOT_THE_TESTS = ("PYTEST_CURRENT_TEST", "KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK")
WATCHED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
                   signal.SIGCHLD, signal.SIGPIPE)


def unit_conflicts(item: pytest.Item) -> list[str]:
    """Why ``item`` cannot be a unit test (or a project check, as light): the markers and fixtures that
    make it more than pure logic."""
    if item.get_closest_marker("unit") is None and item.get_closest_marker("project") is None:
        return []
    found = [f"marked {name}" for name in NOT_UNIT_MARKERS if item.get_closest_marker(name) is not None]
    found += [f"uses the {name} fixture" for name in PROCESS_FIXTURES if name in getattr(item, "fixturenames", ())]
    return found


def light(item: pytest.Item) -> bool:
    """Whether ``item`` is a test of the unit, project or fast tier: TensorFlow has no place there."""
    return item.get_closest_marker("unit") is not None or \
        all(item.get_closest_marker(name) is None for name in HEAVY_MARKERS)


def tensorflow_free(item: pytest.Item) -> bool:
    """Whether the tasks ``item`` starts may not run TensorFlow: every test not marked tensorflow."""
    return item.get_closest_marker("tensorflow") is None


def tensorflow_loaded() -> set[str]:
    return {name for name in TENSORFLOW_MODULES if name in sys.modules}


@pytest.fixture(autouse=True)
def _no_tensorflow_in_light_tests(request: pytest.FixtureRequest):
    if not light(request.node):
        yield
        return
    before = tensorflow_loaded()
    yield
    imported = sorted(tensorflow_loaded() - before)
    if imported:
        pytest.fail(f"{request.node.nodeid} is a unit or fast test but imported {', '.join(imported)}: TensorFlow "
                    f"runs only in tests marked tensorflow (mark it, or use the stand-in worker "
                    f"tests/workers/lockstep.py)", pytrace=False)


def pytest_runtest_setup(item: pytest.Item) -> None:
    conflicts = unit_conflicts(item)
    if conflicts:
        mark = "unit" if item.get_closest_marker("unit") is not None else "project"
        pytest.fail(f"{item.nodeid} is marked {mark} (pure logic, no TensorFlow, ssh, Slurm or tflaunch run) but is "
                    f"also {', '.join(conflicts)}: drop the {mark} mark or move the test", pytrace=False)


def _handlers() -> dict[str, object]:
    return {signal.Signals(number).name: signal.getsignal(number) for number in WATCHED_SIGNALS}


def _environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in NOT_THE_TESTS}


def _changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    changed = sorted(k for k in set(before) & set(after) if before[k] != after[k])
    return ([f"added {', '.join(added)}"] if added else []) + ([f"removed {', '.join(removed)}"] if removed else []) \
        + ([f"changed {', '.join(changed)}"] if changed else [])


@pytest.fixture
def signal_handlers():
    """For a test that installs tflaunch's signal handlers in this process: they are put back after it."""
    handlers = _handlers()
    yield
    for name, handler in handlers.items():
        signal.signal(signal.Signals[name], handler)


@pytest.fixture(autouse=True)
def _leaves_the_process_as_it_found_it():
    """Set up before the test's other fixtures and so torn down after them (monkeypatch's undo included)."""
    cwd, environ, handlers = os.getcwd(), _environ(), _handlers()
    yield
    problems = []
    if os.getcwd() != cwd:
        problems.append(f"the working directory ({os.getcwd()} instead of {cwd})")
        os.chdir(cwd)
    env_changes = _changes(environ, _environ())
    if env_changes:
        problems.append(f"os.environ ({'; '.join(env_changes)})")
        for key in set(_environ()) - set(environ):
            del os.environ[key]
        os.environ.update(environ)
    now = _handlers()
    moved = sorted(name for name in handlers if now[name] != handlers[name])
    if moved:
        problems.append(f"the handlers of {', '.join(moved)}")
        for name in moved:
            signal.signal(signal.Signals[name], handlers[name])
    if problems:
        pytest.fail(f"the test changed {' and '.join(problems)} and did not undo it; undone now, so the next "
                    f"tests start as this one did", pytrace=False)
