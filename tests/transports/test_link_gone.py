"""A link whose carrier ended is gone at once, before the links' thread has read the end: the check
before a restart dials such a host again instead of probing it through a dead job step or ssh."""

from __future__ import annotations

import subprocess

import pytest

from launcher.transports.carriers import Carrier
from launcher.transports.hostlink import AgentLink
from launcher.transports.linkhub import LinkHub

pytestmark = pytest.mark.unit


class EndedCarrier(Carrier):
    """A carrier process that has ended: a real one, waited for."""

    kind = "srun"

    def __init__(self, host: str):
        super().__init__(host)
        self.popen = subprocess.Popen(["sh", "-c", "kill -9 $$"])
        self.popen.wait()

    def ended(self) -> int | None:
        return self.popen.poll()


def test_a_link_whose_carrier_ended_is_gone_before_the_hub_reads_it():
    hub = LinkHub()  # its own thread looks at its links a second after it starts: not before this test asks
    carrier = EndedCarrier("n3")
    link = AgentLink("n3", carrier, None, None, keepalive=15.0, hub=hub, attach_within=300.0)
    assert link.lost_reason is None  # what the check before a restart looked at, and found alive
    assert link.gone
    hub.remove(link)


def test_a_link_whose_carrier_runs_is_not_gone():
    hub = LinkHub()
    carrier = Carrier("n1")  # the base carrier never ends: a connection with no process of its own
    link = AgentLink("n1", carrier, None, None, keepalive=15.0, hub=hub, attach_within=300.0)
    assert not link.gone
    link.lose("its agent went silent")
    assert link.gone
    hub.remove(link)
