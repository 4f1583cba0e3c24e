"""What ``tflaunch compare`` says about how its runs' commands differ."""

from __future__ import annotations

import pytest

from launcher.inspect.compare import Comparison, differences

pytestmark = pytest.mark.unit


def row(run_id: str, *argv: str) -> Comparison:
    return Comparison(run_id, "--local 2", "succeeded", 2, 64, 3, [2, 3], 1.0, None, None, None, None, argv=list(argv))


def test_the_options_that_differ_are_named_with_each_runs_value():
    rows = [row("a", "python", "train.py", "--lr", "0.1", "--epochs", "3"),
            row("b", "python", "train.py", "--lr=0.01", "--epochs", "3", "--fast")]
    assert differences(rows) == ["arguments that differ: a: --lr 0.1 (--fast not given); b: --lr 0.01 --fast"]
    same = [row("a", "python", "-m", "trainer", "--lr", "0.1"), row("b", "python", "-m", "trainer", "--lr", "0.1")]
    assert differences(same) == ["arguments: the same in every run"]


def test_runs_of_different_programs_are_said_to_compare_different_models():
    rows = [row("a", "python", "mnist.py", "--lr", "0.1"), row("b", "python", "cifar.py", "--lr", "0.1")]
    assert differences(rows) == ["note: these runs ran different programs, so their figures may compare different "
                                 "models: a: python mnist.py; b: python cifar.py"]
    assert differences([row("a", "python", "-m", "trainer"), row("b", "python", "-m", "other")])[0].startswith("note: ")
    assert differences([row("a")]) == []
