"""Waiting in tests for something to become true, instead of sleeping a fixed time and hoping.

A fixed sleep is either too short on a busy machine (the test fails for no reason) or too long
everywhere else (the suite crawls). ``wait_for`` asks again every ``interval`` seconds and returns
as soon as the answer is yes, and fails the test with a message saying what never happened.
"""

from __future__ import annotations

import time
from typing import Callable, TypeVar

import pytest

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float = 30.0, interval: float = 0.05,
             message: str | Callable[[], str] = "the condition") -> T:
    """The first truthy value ``predicate`` returns; fails the test after ``timeout`` seconds.

    The predicate is always asked once more at the deadline, so a slow poll never loses a late
    success. ``message`` names what was awaited; a callable is asked only on failure, so it can
    describe the state at that moment (e.g. the last lines of a log). Exceptions the predicate
    raises propagate: a predicate can end the wait early when waiting longer is pointless.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            what = message() if callable(message) else message
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}", pytrace=False)
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
