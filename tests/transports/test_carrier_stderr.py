"""A carrier's stderr (an ssh client's, the local agent's) is held within a bound, as a task's log
is: its start, a marker counting what was left out, its latest lines. The link hub reads it with
the agent's channel, so a carrier that prints without end is neither blocked nor kept whole."""

from __future__ import annotations

import sys

import pytest

from launcher.transports.carriers import STDERR_HEAD, STDERR_TAIL, ProcessCarrier, spawn_carrier
from launcher.transports.hostlink import AgentLink
from launcher.transports.linkhub import HUB
from polling import wait_for

FLOOD = ("import sys\n"
         "w = sys.stderr.write\n"
         "w('first words\\n')\n"
         "for i in range(100000):\n"
         "    w('ssh: chatter %d ' % i + 'x' * 90 + '\\n')\n"
         "w('last words\\n')\n"
         "sys.stderr.flush()\n"
         "sys.stdin.read()\n")


@pytest.fixture
def link():
    made = []

    def make(argv):
        popen, stderr, read_fd, write_fd = spawn_carrier(argv)
        made.append(AgentLink("floodhost", ProcessCarrier("floodhost", popen, stderr), read_fd, write_fd,
                              keepalive=60, hub=HUB))
        return made[-1]

    yield make
    for each in made:
        each.close(wait=5)


def test_a_carrier_printing_10_mb_on_stderr_is_held_as_its_start_and_its_end(link):
    carrier = link([sys.executable, "-c", FLOOD]).carrier
    wait_for(lambda: carrier.said.lines()[-1:] == ["last words"], timeout=60,
             message="the carrier's last words, read by the hub as they come")
    lines = carrier.said.lines()
    assert lines[0] == "first words"
    marker = next(line for line in lines if line.startswith("[... "))
    assert int(marker.split()[1].replace(",", "")) > 9_000_000
    assert sum(len(line) + 1 for line in lines) <= STDERR_HEAD + STDERR_TAIL + 100
    assert carrier.detail() == "last words"
    assert carrier.ended() is None  # it was never blocked on a full pipe, and waits for its EOF


def test_a_carrier_that_ended_is_read_to_its_last_line_and_its_pipe_closed(link):
    each = link([sys.executable, "-c", "import sys; sys.stderr.write('ssh: connect to host x port 22: "
                                       "Connection refused\\n')"])
    wait_for(lambda: each.carrier.ended() is not None, timeout=30, message="the carrier to end")
    assert each.carrier.detail() == "ssh: connect to host x port 22: Connection refused"
    each.close(wait=5)
    wait_for(lambda: each.carrier.stderr_fd is None, timeout=10, message="its stderr pipe to be closed")
