"""Where an attempt's tasks run once hosts are left out: spares, shrinking to min_workers, the chief's duty."""

from __future__ import annotations

import pytest

from launcher.cluster.placement import checked_spec, place
from launcher.cluster.reader import parse_cluster

pytestmark = pytest.mark.unit


def cluster(text: str):
    return parse_cluster(text, "c.yaml", frozenset())


FOUR = """
chief: [{host: n0, port: 1000}]
worker:
  - {host: n1, port: 1001}
  - {host: n2, port: 1002}
  - {host: n3, port: 1003}
"""


def hosts(placement):
    return {t.name: t.host for t in placement.spec.tasks}


def test_nothing_left_out_runs_the_file_as_it_is():
    spec = cluster(FOUR + "spares: [{host: s0, port: 2000}]\n")
    placement = place(spec, ())
    assert placement.spec.tasks == spec.tasks and not placement.changed and placement.shortfall is None


def test_a_task_on_a_host_left_out_moves_to_the_first_free_spare_with_its_port_gpus_and_env():
    spec = cluster(FOUR + "spares:\n  - {host: s0, port: 2000, gpus: [3], env: {A: spare}}\n  - {host: s1, port: 2001}\n")
    placement = place(spec, {"n2"})
    assert hosts(placement) == {"chief-0": "n0", "worker-0": "n1", "worker-1": "s0", "worker-2": "n3"}
    moved = next(t for t in placement.spec.tasks if t.name == "worker-1")
    assert (moved.port, moved.gpus, dict(moved.env)) == (2000, (3,), {"A": "spare"})
    assert [m.text for m in placement.moves] == ["worker-1 on spare s0"]
    # The first spare's host is gone too: the next one stands in.
    assert hosts(place(spec, {"n2", "s0"}))["worker-1"] == "s1"


def test_with_no_spare_left_the_workers_shrink_to_min_workers_and_are_numbered_again():
    spec = cluster(FOUR + "min_workers: 3\n")
    placement = place(spec, {"n2"})
    assert hosts(placement) == {"chief-0": "n0", "worker-0": "n1", "worker-1": "n3"}
    assert placement.dropped == ("worker-1",)
    assert [m.text for m in placement.moves] == ["worker-2 as worker-1 on n3"]
    renamed = next(t for t in placement.spec.tasks if t.host == "n3")
    assert renamed.port == 1003  # its own port: only its index changed


def test_below_min_workers_no_attempt_runs_and_the_shortfall_says_why():
    spec = cluster(FOUR + "min_workers: 3\n")
    placement = place(spec, {"n2", "n3"})
    assert placement.shortfall == "2 of 4 training tasks left without worker-1, worker-2, below min_workers 3"
    assert placement.spec == spec


def test_without_min_workers_a_lost_worker_with_no_spare_ends_the_run():
    placement = place(cluster(FOUR), {"n1"})
    assert placement.shortfall == "no spare left for worker-0, and no min_workers to shrink to"


def test_the_chiefs_duty_moves_to_the_first_worker_left():
    spec = cluster(FOUR + "min_workers: 2\n")
    placement = place(spec, {"n0"})
    assert hosts(placement) == {"chief-0": "n1", "worker-0": "n2", "worker-1": "n3"}
    assert [m.text for m in placement.moves] == ["worker-0 as chief-0 on n1", "worker-1 as worker-0 on n2",
                                                 "worker-2 as worker-1 on n3"]


def test_a_ps_task_with_no_host_ends_the_run_and_an_evaluator_is_dropped():
    spec = cluster("chief: [{host: n0, port: 1}]\nworker: [{host: n1, port: 2}, {host: n2, port: 3}]\n"
                   "ps: [{host: p0, port: 4}]\nevaluator: [{host: e0, port: 5}]\nmin_workers: 1\n")
    assert "ps-0 has no host left" in place(spec, {"p0"}).shortfall
    placement = place(spec, {"e0"})
    assert placement.shortfall is None and placement.dropped == ("evaluator-0",)
    assert "evaluator-0" not in hosts(placement)


def test_a_host_with_several_tasks_takes_as_many_spare_slots():
    spec = cluster("worker:\n  - {host: n0, port: 1}\n  - {host: n1, port: 2}\n  - {host: n1, port: 3}\n"
                   "spares:\n  - {host: s0, port: 4}\n  - {host: s0, port: 5}\n")
    placement = place(spec, {"n1"})
    assert hosts(placement) == {"worker-0": "n0", "worker-1": "s0", "worker-2": "s0"}
    assert sorted(t.port for t in placement.spec.tasks) == [1, 4, 5]


def test_the_preflight_checks_the_spare_slots_as_tasks_of_their_own_role():
    spec = cluster(FOUR + "spares: [{host: s0, port: 2000}]\n")
    assert [t.name for t in checked_spec(spec).tasks][-1] == "spare-0"
    assert checked_spec(cluster(FOUR)) == cluster(FOUR)


@pytest.mark.parametrize("text, line", [
    (FOUR + "min_workers: 5\n", "c.yaml: min_workers: 5 is more than the cluster's 4 training tasks (chief and workers); "
                                "expected 1 to 4"),
    (FOUR + "min_workers: 0\n", "c.yaml: min_workers: expected an integer >= 1, got 0"),
    (FOUR + "spares: [{host: n1, port: 1001}]\n", "c.yaml: spares[0].port: n1:1001 is also used by worker[0]; "
                                                   "expected a distinct host:port"),
    (FOUR + "spares: [{hots: s0}]\n", "c.yaml: spares[0].hots: unknown key; did you mean 'host'?"),
    (FOUR + "cooldown: soon\n", "c.yaml: cooldown: expected a number of seconds >= 0, got 'soon'"),
])
def test_bad_spares_and_floors_are_one_line_naming_the_key(text, line):
    from launcher.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        cluster(text)
    assert line in str(caught.value).splitlines(), str(caught.value)
