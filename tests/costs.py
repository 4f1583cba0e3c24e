"""Each test's CPU, as a property of its report (``cpu_seconds`` in the JUnit file), which
``tests/suite.py`` prints beside each slow test and ranks on its own: where the suite's CPU goes.

A test's CPU is what its pytest process used from the test's setup to its teardown, its own threads
and every process it waited for, with theirs (a tflaunch run and each task it reaped). A fixture
shared by several tests counts in the first test that asked for it; a daemon that left its parent
(a test host's sshd, a Ray node) is not counted."""

from __future__ import annotations

import resource

import pytest

PROPERTY = "cpu_seconds"


def cpu_now() -> float:
    """CPU seconds of this process and of the processes it waited for, so far."""
    mine, theirs = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return mine.ru_utime + mine.ru_stime + theirs.ru_utime + theirs.ru_stime


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[_started] = cpu_now()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    started = item.stash.get(_started, None)
    if call.when == "teardown" and started is not None:
        outcome.get_result().user_properties.append((PROPERTY, round(cpu_now() - started, 2)))


_started = pytest.StashKey[float]()
