"""Every backend is one carrier of the agent's channel: the shared base class and what it declares."""

from __future__ import annotations

import importlib
import inspect

import pytest

from launcher.options import RunOptions
from launcher.transports import TRANSPORTS, TransportSet
from launcher.transports.backend import AgentBackend

pytestmark = pytest.mark.unit


def backend_class(name: str) -> type:
    module_name, class_name = TRANSPORTS[name]
    return getattr(importlib.import_module(module_name, "launcher.transports"), class_name)


@pytest.mark.parametrize("name", sorted(TRANSPORTS))
def test_every_transport_is_an_agent_backend_declaring_changes_and_leave_out(name):
    cls = backend_class(name)
    assert issubclass(cls, AgentBackend)
    assert not inspect.isabstract(cls)
    for declared in ("changes", "leave_out", "connect", "start", "close", "link_for", "prepare"):
        assert hasattr(cls, declared)


def test_a_backend_writes_connect_or_cannot_be_made():
    class Nothing(AgentBackend):
        pass

    with pytest.raises(TypeError):
        Nothing(RunOptions())


def test_leave_out_reaches_each_backend_and_only_srun_keeps_the_nodes_out():
    transports = TransportSet(RunOptions())
    local, srun = transports.get("local"), transports.get("srun")
    transports.leave_out({"n3", "n4"})
    transports.leave_out((), back={"n4"})
    assert srun.left_out == {"n3"}
    assert local.links == {}  # the default leave_out changes nothing
    transports.close()


def test_a_task_whose_agent_cannot_start_is_a_failed_start_worded_by_its_backend(monkeypatch):
    from launcher.cluster.plan import TaskLaunch

    launch = TaskLaunch(name="worker-0", role="worker", index=0, host="nowhere", address="nowhere:1", local=False,
                        argv=("true",), env={}, workdir="/", transport="ssh")
    ssh = backend_class("ssh")(RunOptions())
    monkeypatch.setenv("PATH", "/nonexistent")
    process = ssh.start(launch, "/dev/null")
    assert process.poll().error == "cannot start: the ssh client is not installed"
    ssh.close()
