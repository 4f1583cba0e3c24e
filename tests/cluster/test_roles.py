"""The one slot -> role rule (launcher/cluster/roles.py), as -H/--hostfile and Slurm allocations use it."""

from __future__ import annotations

import pytest

from launcher.cluster.roles import carve_roles, deal_gpus, number_slots
from launcher.errors import ConfigError
from launcher.slurm.allocation import Allocation
from launcher.slurm.allocation import carve_roles as allocation_roles
from launcher.sources.hosts import HostSlots, place

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("kw", [{}, {"chief": True}, {"ps": 2}, {"evaluator": True, "chief": True},
                                {"ps": 1, "evaluator": True}])
def test_hosts_and_a_slurm_allocation_with_the_same_slots_get_the_same_roles(kw):
    hosts = (HostSlots("n1", 2, "-H"), HostSlots("n2", 3, "-H"))
    from_hosts = [(t.name, t.host) for t in place(hosts, **kw)]
    allocation = Allocation("7", ("n1", "n2"), (2, 3))
    from_slurm = [(r.name, r.slot.node) for r in allocation_roles(allocation, **kw)]
    assert from_hosts == from_slurm


def test_slots_are_numbered_host_by_host():
    slots = number_slots([("a", 2), ("b", 1)])
    assert [(s.node, s.local_index, s.rank) for s in slots] == [("a", 0, 0), ("a", 1, 1), ("b", 0, 2)]


def test_too_few_slots_name_the_option_and_end_in_the_callers_words():
    with pytest.raises(ConfigError) as error:
        carve_roles(number_slots([("a", 2)]), ps=1, source="x", room="seats; ask for more")
    assert str(error.value) == "x: --ps: a chief, 1 ps task and at least one worker need 3 seats; ask for more"


def test_gpus_go_round_robin_to_each_hosts_chief_and_workers():
    roles = carve_roles(number_slots([("a", 3), ("b", 2)]), ps=1, evaluator=True, source="x", room="slots")
    assert deal_gpus(roles, 2) == {"chief-0": (0,), "ps-0": (), "worker-0": (1,), "worker-1": (0,),
                                   "evaluator-0": ()}
    assert set(deal_gpus(roles, 0).values()) == {()}
