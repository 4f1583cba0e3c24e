"""tests/suite.py, the tiers CI runs: every test falls in exactly one tier, cheapest first."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from suite import TIERS, expressions, main  # noqa: E402

pytestmark = pytest.mark.unit
MARKERS = ("unit", "slow", "tensorflow", "ssh", "slurm", "gpu")


def tiers_of(markers: set[str]) -> list[str]:
    return [name for name, expression in expressions().items()
            if Expression.compile(expression).evaluate(lambda word, **_: word in markers)]


def test_every_mix_of_markers_runs_in_exactly_one_tier():
    for count in range(len(MARKERS) + 1):
        for markers in itertools.combinations(MARKERS, count):
            assert len(tiers_of(set(markers))) == 1, (markers, tiers_of(set(markers)))


def test_a_test_runs_in_the_first_tier_its_markers_name():
    assert tiers_of(set()) == ["fast"]
    assert tiers_of({"unit"}) == ["unit"]
    assert tiers_of({"slow"}) == ["processes"]
    assert tiers_of({"slow", "ssh"}) == ["ssh"]
    assert tiers_of({"slow", "ssh", "slurm"}) == ["slurm"]
    assert tiers_of({"slow", "ssh", "tensorflow"}) == ["tensorflow"]
    assert tiers_of({"gpu", "tensorflow", "slow"}) == ["tensorflow"]
    assert [name for name, _ in TIERS][-1] == "rest"


def test_an_unknown_tier_is_one_line_and_exit_code_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--tiers", "unit,fastest"])
    assert exit_.value.code == 2
    assert "--tiers: no tier fastest (tiers: unit, fast, processes, ssh, slurm, tensorflow, rest)" in capsys.readouterr().err
