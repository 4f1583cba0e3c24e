"""The planner hands a run one finished plan: every port chosen, the agents' launches, the spares it
left out, and each attempt's plan; where it refuses, nothing it reserved stays reserved.

Real sockets and real port locks, as a run takes them; every cluster here is on this machine, so no
agent is reached.
"""

from __future__ import annotations

import socket
from contextlib import closing
from dataclasses import replace

import pytest

from launcher.cluster.local import local_cluster
from launcher.cluster.plan import RunContext
from launcher.cluster.reader import parse_cluster
from launcher.cluster.spec import AUTO
from launcher.errors import PortInUseError
from launcher.options import RunOptions
from launcher.run.lifecycle.planner import LaunchRequest, Planner
from launcher.transports import TransportSet

pytestmark = pytest.mark.unit

HERE = frozenset({"localhost"})


def planner_for(spec, **options) -> Planner:
    return Planner(LaunchRequest(lambda hosts: spec, RunOptions(**options)), local_hosts=HERE)


def plan_of(planner: Planner, **how):
    transports = TransportSet(planner.options)
    try:
        return planner.plan_run(transports, **how)
    finally:
        transports.close()


def taken_port() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def bindable(port: int) -> bool:
    with closing(socket.socket()) as sock:
        try:
            sock.bind(("", port))
            return True
        except OSError:
            return False


def test_a_local_run_gets_every_port_chosen_and_one_agent_launch():
    spec = local_cluster(3, ps=1)
    plan = plan_of(planner_for(spec, no_seal=True))
    try:
        assert all(task.port != AUTO for task in plan.spec.slots)
        ports = [int(task.port) for task in plan.spec.tasks]
        assert len(set(ports)) == len(spec.tasks) and sorted(plan.fixed_ports) == sorted(ports)
        assert plan.reservation.ports == {task.name: int(task.port) for task in plan.spec.tasks}
        # One host: one launch brings up its agent; no preflight for a run on this machine alone.
        assert [launch.host for launch in plan.agent_launches] == ["localhost"]
        assert plan.preflight is False and plan.refused == {}
        assert not plan.mesh_probe  # this machine holds picked ports: no probe may listen on them
    finally:
        plan.release()


def test_each_attempt_is_planned_with_the_chosen_ports_and_lets_go_of_the_held_sockets(tmp_path):
    plan = plan_of(planner_for(local_cluster(2), no_seal=True))
    try:
        chosen = {task.name: int(task.port) for task in plan.spec.tasks}
        assert not any(bindable(port) for port in chosen.values())  # held as sockets until the start
        attempt = plan.attempt(RunContext(run_id="r1", run_dir=str(tmp_path / "r1")), plan.spec)
        assert {launch.name: int(launch.address.rsplit(":", 1)[1]) for launch in attempt.launches} == chosen
        assert all(bindable(port) for port in chosen.values())  # the tasks bind them now
        assert plan.reservation.ports == chosen  # still locked against other runs
    finally:
        plan.release()


def test_a_fixed_port_in_use_is_refused_and_nothing_stays_reserved():
    with closing(taken_port()) as sock:
        busy = sock.getsockname()[1]
        text = f"worker:\n  - {{host: localhost, port: {busy}}}\n  - {{host: localhost, port: auto}}\n"
        spec = parse_cluster(text, "busy.yaml", HERE)
        planner = planner_for(spec, no_seal=True)
        with pytest.raises(PortInUseError, match=rf"busy.yaml: worker\[0\]\.port: localhost:{busy} is already in use"):
            plan_of(planner)
        # The auto port it had picked went back: a second plan may take the same, and is refused alike.
        with pytest.raises(PortInUseError):
            plan_of(planner)
        # 'tflaunch check' plans the same cluster: the probes report the taken port.
        checking = plan_of(planner, checking=True)
        try:
            assert checking.preflight and len(checking.agent_launches) == 2
        finally:
            checking.release()


def test_a_sealed_run_does_not_care_about_the_machines_ports_until_it_cannot_be_sealed():
    with closing(taken_port()) as sock:
        busy = sock.getsockname()[1]
        spec = parse_cluster(f"worker:\n  - {{host: localhost, port: {busy}}}\n", "sealed.yaml", HERE)
        plan = plan_of(planner_for(spec))  # sealed: its own namespace has the port free
        try:
            assert plan.fixed_ports == [busy]
            with pytest.raises(PortInUseError, match=f"localhost:{busy} is already in use"):
                plan.check_local_ports()  # the namespace could not be made: the machine's port matters
        finally:
            plan.release()


def test_spares_that_fail_the_preflight_are_left_out_of_the_plan():
    text = ("worker:\n  - {host: localhost, port: auto}\n"
            "spares:\n  - {host: spare1, port: 7001}\n  - {host: spare2, port: 7002}\n")
    spec = parse_cluster(text, "spares.yaml", HERE)
    plan = plan_of(planner_for(spec, no_seal=True), checking=True)
    try:
        assert {slot.host for slot in plan.spec.spares} == {"spare1", "spare2"}
        left = plan.without({"spare1": "ssh: cannot connect"})
        assert {slot.host for slot in left.spec.spares} == {"spare2"}
        assert left.refused == {"spare1": "ssh: cannot connect"}
        assert plan.without({}) is plan
    finally:
        plan.release()


def test_the_plan_takes_the_run_options_over_the_cluster_file():
    spec = replace(local_cluster(2), command=("python", "train.py"))
    planner = planner_for(spec, command=("python", "other.py"), no_seal=True)
    assert planner.spec.command == ("python", "other.py")
    plan = plan_of(planner)
    try:
        assert plan.spec.command == ("python", "other.py")
    finally:
        plan.release()
