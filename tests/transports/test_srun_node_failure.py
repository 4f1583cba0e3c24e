"""srun's ``Node failure on`` line blames the nodes it names, each as a whole name: a failure of
``n10`` is not one of ``n1``, whether srun names it alone or in a hostlist with ranges."""

from __future__ import annotations

import pytest

from launcher.transports.srun import failed_on, in_hostlist

pytestmark = pytest.mark.unit

# The lines as srun 22.05 writes them ("srun: error: Node failure on %s", the step's node list).
N10 = "srun: error: Node failure on n10"
RANGES = "srun: error: Node failure on n[1,10-12]"
PADDED = "srun: error: Node failure on gpu[007-009],login1"


@pytest.mark.parametrize("line, node, failed", [
    (N10, "n10", True),
    (N10, "n1", False),
    (N10, "n100", False),
    (N10, "xn10", False),
    (RANGES, "n1", True),
    (RANGES, "n11", True),
    (RANGES, "n12", True),
    (RANGES, "n2", False),
    (RANGES, "n13", False),
    (RANGES, "n010", False),
    (PADDED, "gpu008", True),
    (PADDED, "gpu8", False),
    (PADDED, "gpu010", False),
    (PADDED, "login1", True),
    (PADDED, "login", False),
    ("srun: error: Task launch for StepId=12.0 failed on node n10: Socket timed out", "n10", False),
])
def test_a_node_failure_line_names_whole_nodes(line, node, failed):
    assert failed_on(line, node) is failed


def test_a_hostlist_with_several_bracket_groups_names_each_combination():
    assert in_hostlist("r2n05", "r[1-2]n[04-06]")
    assert not in_hostlist("r3n05", "r[1-2]n[04-06]")
    assert not in_hostlist("r2n5", "r[1-2]n[04-06]")
