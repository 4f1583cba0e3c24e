"""Every command that takes one RUN says which forms RUN may take, in the words of their one owner
(launcher/inspect/runs.py's RUN_FORMS), once."""

from __future__ import annotations

import click
import pytest

from launcher.cli.group import cli
from launcher.inspect.runs import RUN_FORMS

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("name", ["logs", "status", "report", "stacks", "tensorboard"])
def test_a_command_taking_one_run_names_every_run_form_once(name):
    with click.Context(cli, info_name="tflaunch") as ctx:
        command = cli.get_command(ctx, name)
        epilog = " ".join((command.epilog or "").split())
    assert epilog == f"RUN is {RUN_FORMS}.", f"tflaunch {name} --help ends with {epilog!r}"


def test_compare_names_the_run_forms_without_a_default():
    """compare needs two runs named: its help offers no default."""
    with click.Context(cli, info_name="tflaunch") as ctx:
        epilog = " ".join((cli.get_command(ctx, "compare").epilog or "").split())
    assert "default" not in epilog and "'latest'" in epilog, epilog
    assert epilog == f"Each RUN is {RUN_FORMS}.".replace(" (the default)", ""), epilog
