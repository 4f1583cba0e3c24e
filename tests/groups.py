"""pytest-xdist's groups as this pytest needs them, loaded by conftest.py as a pytest plugin."""

from __future__ import annotations

import pytest


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a pytest-xdist worker under ``--dist loadgroup``: name each test's ``xdist_group`` in its id
    (``<id>@<group>``), which is how the scheduler keeps a group's tests in one worker. pytest-xdist
    does so by setting ``item._nodeid``, which pytest 9 no longer reads (its ids are ``item._id``), so
    every group was spread over the workers and each worker made the group's shared run again."""
    if not getattr(config.option, "loadgroup", False):
        return
    from _pytest.nodeid import coerce_node_id

    for item in items:
        names = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                        for mark in item.iter_markers("xdist_group")})
        suffix = "@" + "_".join(names)
        if names and not item.nodeid.endswith(suffix):
            item._id = coerce_node_id(item.nodeid + suffix)
