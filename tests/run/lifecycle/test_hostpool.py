"""The hosts a run leaves out across its attempts, the lines that say so, and hosts that rejoin."""

from __future__ import annotations

import pytest

from launcher.cluster.reader import parse_cluster
from launcher.run.lifecycle.hostpool import HostPool

pytestmark = pytest.mark.unit

THREE = "worker:\n  - {host: n0, port: 1}\n  - {host: n1, port: 2}\n  - {host: n2, port: 3}\n"


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def pool(extra: str = "", clock=None) -> HostPool:
    return HostPool(parse_cluster(THREE + extra, "c.yaml", frozenset()), clock=clock or Clock())


def placed(p: HostPool) -> dict[str, str]:
    return {t.name: t.host for t in p.placement.spec.tasks}


def test_a_lost_host_moves_its_task_to_a_spare_in_one_line():
    p = pool("spares: [{host: s0, port: 9}]\n")
    assert p.to_check() == ["n0", "n1", "n2", "s0"]
    decision = p.decide(2, {"n2": "no answer in 5 s"})
    assert decision.lines == ("n2 lost (no answer in 5 s); attempt 2 runs worker-2 on spare s0",)
    assert placed(p) == {"worker-0": "n0", "worker-1": "n1", "worker-2": "s0"} and not decision.ends_run


def test_with_no_spare_the_cluster_shrinks_and_below_the_floor_the_run_ends():
    p = pool("min_workers: 2\n")
    decision = p.decide(2, {"n1": "no answer in 5 s"})
    assert decision.lines == ("n1 lost (no answer in 5 s); attempt 2 runs without worker-1 (2 training tasks, min_workers 2)",
                              "attempt 2 runs worker-2 as worker-1 on n2")
    decision = p.decide(3, {"n2": "no answer in 5 s"})
    assert decision.ends_run
    assert decision.lines == ("n2 lost (no answer in 5 s): attempt 3 cannot run: 1 of 3 training tasks left without "
                              "worker-1, worker-2, below min_workers 2; not restarting",)


def test_a_lost_host_rejoins_after_its_cooldown_when_it_answers_and_the_spare_is_free_again():
    clock = Clock()
    p = pool("spares: [{host: s0, port: 9}]\ncooldown: 60\n", clock)
    p.decide(2, {"n2": "no answer in 5 s"})
    clock.now = 30.0
    assert "n2" not in p.to_check()  # still cooling down
    p.decide(3, {})
    assert placed(p)["worker-2"] == "s0"
    clock.now = 61.0
    assert "n2" in p.to_check()
    p.decide(4, {"n2": "no answer in 5 s"})  # still gone: its cooldown starts again
    assert placed(p)["worker-2"] == "s0"
    clock.now = 100.0
    assert "n2" not in p.to_check()
    clock.now = 122.0
    decision = p.decide(5, {})
    assert decision.rejoined == ("n2",)
    assert decision.lines == ("n2 answers again after its 60 s cooldown: attempt 5 runs worker-2 on it again",)
    assert placed(p)["worker-2"] == "n2"


def test_a_machine_fault_or_a_repeated_culprit_leaves_a_host_out_only_where_the_cluster_can_do_without_it():
    p = pool()
    decision = p.decide(2, {}, machine={"n1": "worker-1 failed the machine's way (gpu-hardware)"})
    assert decision.left_out == () and placed(p)["worker-1"] == "n1"  # no spare, no floor: back to n1
    p = pool("spares: [{host: s0, port: 9}]\n")
    decision = p.decide(2, {}, culprits=["n0"])
    assert decision.lines == ("n0 named as the culprit of two failures in a row; attempt 2 runs worker-0 on spare s0",)
    assert [o.lost for o in decision.left_out] == [False]


def test_spares_the_preflight_refused_are_never_used():
    p = pool("spares: [{host: s0, port: 9}, {host: s1, port: 9}]\nmin_workers: 1\n")
    assert p.refuse_spares({"s0": "s0 versions: tensorflow 2.15.0 (others 2.20.0)"}) == [
        "spare s0 not used: s0 versions: tensorflow 2.15.0 (others 2.20.0)"]
    p.decide(2, {"n0": "no answer in 5 s"})
    assert placed(p)["worker-0"] == "s1"
    p.clock.now = 10_000.0
    assert "s0" not in p.to_check()
