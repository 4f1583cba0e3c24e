"""A host's resource readings as tflaunch takes them: each agent's frame checked whole where it comes
in, on the links' thread, and parsed once, for all of that host's tasks, by whichever reader asks
first (the resource sampler, the straggler rule): the links' thread wakes once per host and frame,
and parsing there, line by line, cost a run more than everything else that thread does.

Pure logic: the frames are made by the agent's own code (``launcher.agent.sampling.readings`` and
``ThreadWatch.totals``, over this test's own process) and handed to a link as its reads."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from launcher.agent import protocol, sampling
from launcher.agent.protocol import Frame
from launcher.agent.threads import ThreadWatch
from launcher.transports import carriers, hostlink, linkhub, proxies
from launcher.transports.base import ThreadTimes
from launcher.transports.framing import ProtocolError

pytestmark = pytest.mark.unit


def watch(**totals) -> ThreadWatch:
    """A thread watch holding ``totals``, whose line the agent's own ``totals`` writes."""
    found = ThreadWatch.__new__(ThreadWatch)
    for name in ("looks", "stalled", "cpu_looks", "cpu_lost", "gpu_looks", "gpu_slowdown", "gpu_stale"):
        setattr(found, name, totals.get(name, 0))
    return found


@pytest.fixture
def link(tmp_path):
    made = hostlink.AgentLink("readings", carriers.Carrier("readings"), None, None, keepalive=30,
                              hub=linkhub.LinkHub(), attach_within=600)
    made.frames.feed(memoryview(protocol.SYNC))
    yield made
    made.hub.remove(made)


def started(link: hostlink.AgentLink, count: int) -> list[proxies.AgentTask]:
    tasks = []
    for i in range(count):
        task = proxies.AgentTask(link, f"task-{i}", None, proxies.LogWriter())
        link.start(task, {"name": task.name, "argv": ["true"], "env": {}})
        link.frames.feed(memoryview(b"".join(protocol.frame(Frame.STATUS, task.id, f"started {os.getpid()}".encode()))))
        tasks.append(task)
    return tasks


def feed(link: hostlink.AgentLink, payload: bytes) -> None:
    link.frames.feed(memoryview(b"".join(protocol.frame(Frame.READINGS, 0, payload))))


def test_a_hosts_readings_are_parsed_once_for_all_its_tasks_by_the_first_reader(link, monkeypatch):
    tasks = started(link, 3)
    threads = [None, watch(looks=7, stalled=3.5, cpu_looks=6, cpu_lost=0.25),
               watch(looks=9, stalled=1.0, cpu_looks=8, cpu_lost=0.5, gpu_looks=8, gpu_slowdown=0.125, gpu_stale=2)]
    processes = [SimpleNamespace(id=task.id, pid=os.getpid(), status=None, fields={}, threads=watched, tree=None,
                                 waiting=None)
                 for task, watched in zip(tasks, threads)]
    parsed = []
    parse = hostlink.parse_readings
    monkeypatch.setattr(hostlink, "parse_readings",
                        lambda payload, at, processes: parsed.append(payload) or parse(payload, at, processes))
    feed(link, sampling.readings(processes))
    assert parsed == []  # the links' thread only checked it
    readings = [task.reading() for task in tasks]
    assert len(parsed) == 1 and [task.reading() for task in tasks] == readings and len(parsed) == 1
    assert {r.pid for r in readings} == {os.getpid()} and all(r.rss_bytes > 0 and r.processes >= 1 for r in readings)
    assert readings[0].threads is None
    assert readings[1].threads == ThreadTimes(7, 3.5, 6, 0.25)
    assert readings[2].threads == ThreadTimes(9, 1.0, 8, 0.5, 8, 0.125, gpu_stale=2)
    feed(link, sampling.readings(processes[:1]))  # a newer frame: parsed again, once, when asked
    assert tasks[0].reading().at >= readings[0].at and len(parsed) == 2
    assert tasks[1].reading() is None  # not in the newest frame


def test_a_task_that_ended_has_no_reading_though_its_hosts_frame_held_one(link):
    ending, going = started(link, 2)
    feed(link, f"{ending.id} 4096 1.500 1 0.000\n{going.id} 8192 0.250 2 3.125".encode())
    assert ending.reading().cpu_seconds == 1.5 and going.reading().rss_bytes == 8192
    assert going.reading().waited_seconds == 3.125
    link.frames.feed(memoryview(b"".join(protocol.frame(Frame.STATUS, ending.id, b"exit code=0"))))
    assert ending.reading() is None and going.reading().processes == 2


@pytest.mark.parametrize("payload", [b"1 2 x 4 0.0", b"1 2 3.0", b"1 2 3.0 4", b"1 2 3.0 4 5", b"1 2 3.0 4 0.0\n\n", b"1 2 3.0 4 0.0 5 6.0 7 8.0 9"])
def test_readings_that_are_none_of_the_agents_end_the_link_where_they_come_in(link, payload):
    # The link's read turns the error into the link's end, with this line (see the wire protocol's tests).
    task, = started(link, 1)
    with pytest.raises(ProtocolError, match="^read the readings '.*', which are none of the agent's$"):
        feed(link, payload.replace(b"1 ", f"{task.id} ".encode(), 1))
    assert task.reading() is None


def test_agents_take_their_samples_at_the_same_moments_of_the_wall_clock():
    # Every agent of a run samples at the multiples of its period on the wall clock, whenever it
    # started: tflaunch's links' thread then reads the run's readings in a few wakes, not one per host.
    for every in (2.0, 0.5):
        for started in (1000.0, 1000.3, 1001.7):
            first = started + sampling.until_sample(every, started)
            assert first % every == pytest.approx(0.0, abs=1e-9) or first % every == pytest.approx(every)
            assert 0 < first - started <= every
    # Right after a sample taken a moment early (the wall clock slewed), the next waits a whole period.
    assert sampling.until_sample(2.0, 1001.99, sampled=True) == pytest.approx(2.01)
    assert sampling.until_sample(2.0, 1002.01, sampled=True) == pytest.approx(1.99)


def test_a_tasks_waiting_for_a_cpu_is_a_running_total_that_keeps_what_ended_processes_waited():
    # The kernel's count goes with a process; the task's total keeps what each had waited when last read.
    waiting = sampling.Waiting()
    assert waiting.total({10: 1.0, 11: 0.5}) == 1.5
    assert waiting.total({10: 1.25, 12: 0.25}) == 1.5 + 0.5  # 11 ended having waited 0.5 s
    assert waiting.total({}) == 1.25 + 0.5 + 0.25  # all ended: the total stays
    assert waiting.total({13: 2.0}) == 4.0

