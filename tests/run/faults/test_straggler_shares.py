"""Each task's share against the others' higher median, taken from one sort for all tasks, is what
the definition gives: the higher median of every other task's figure, task by task."""

from __future__ import annotations

import random
import statistics

import pytest

from launcher.run.faults.stragglers import CONFIRM_SHARE, END_SHARE, SHARE_DIGITS, Figures, shares

pytestmark = pytest.mark.unit


def by_definition(figures: dict[str, Figures]) -> dict[str, tuple[float, str]]:
    found = {}
    for name, mine in figures.items():
        others = [f for other, f in figures.items() if other != name]
        if others:
            share, cause = max((mine.stall - statistics.median_high(f.stall for f in others), "stall"),
                               (mine.gpu - statistics.median_high(f.gpu for f in others), "gpu"),
                               (mine.cpu - statistics.median_high(f.cpu for f in others), "cpu"))
            found[name] = (min(max(round(share, SHARE_DIGITS), 0.0), 1.0), cause)
    return found


@pytest.mark.parametrize("tasks", [1, 2, 3, 4, 5, 8, 17, 64])
def test_each_share_is_against_the_higher_median_of_the_others(tasks):
    pick = random.Random(tasks)
    for _ in range(200):  # ties (zeros, repeated figures) as often as not
        figures = {f"worker-{i}": Figures(pick.choice([0.0, 0.1, pick.random()]), pick.choice([0.0, pick.random()]),
                                          pick.choice([0.0, 0.5, pick.random()])) for i in range(tasks)}
        assert shares(figures) == by_definition(figures)


def test_a_share_that_equals_a_threshold_is_not_taken_below_it_by_floating_point():
    # Figures are fractions of looks: a task stalled in 3 looks of 5 against the others' 2 of 5 holds
    # them back by exactly 0.2, the share that stands out; 0.6 - 0.4 is 0.19999999999999996 in floats.
    assert 0.6 - 0.4 < CONFIRM_SHARE
    found = shares({"worker-0": Figures(0.4, 0.0, 0.0), "worker-1": Figures(0.4, 0.0, 0.0),
                    "worker-2": Figures(0.6, 0.0, 0.0)})
    assert found["worker-2"] == (CONFIRM_SHARE, "stall")
    # And one that has calmed to the end's threshold is not above it either (0.55 - 0.4).
    calmed = shares({"worker-0": Figures(0.4, 0.0, 0.0), "worker-1": Figures(0.4, 0.0, 0.0),
                     "worker-2": Figures(0.55, 0.0, 0.0)})
    assert calmed["worker-2"][0] <= END_SHARE
