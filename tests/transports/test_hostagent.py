"""The host agent as a real process, driven through tflaunch's real end of it (hostlink): many tasks
under one agent, each with its own status, signals, leftovers, stacks and log; EOF, heartbeats,
floods, binary output, restarts in place, and the agent shipped as bytecode or source."""

from __future__ import annotations

import os
import random
import resource
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import marked
from launcher.agent.protocol import encode_fields
from launcher.transports.base import ExitStatus
from launcher.transports.hostlink import AgentLink
from launcher.transports.linkhub import HUB
from launcher.transports.proxies import AgentTask, LogWriter
from launcher.transports.shipping import agent_payload, remote_agent_argv, stdin_agent_argv
from launcher.transports.local import AGENT_BOOT, LocalCarrier
from polling import wait_for

SLEEPER = "import time; time.sleep(600)"
ESCAPE = str(Path(__file__).resolve().parents[1] / "helpers" / "escape.py")


class Host:
    """A real host agent (a child of the test) and tflaunch's link to it."""

    def __init__(self, tmp_path: Path, *, eof_grace: float = 1.0, agent_keepalive: float | None = None,
                 sample: float = 0.5, boot: list[str] | None = None, keepalive: float = 30, preamble: bytes = b""):
        """``boot``: the agent's command line without its spec (by default, the local transport's),
        ``preamble`` what its stdin carries first; ``keepalive``: how long tflaunch's end waits
        for a frame; ``agent_keepalive``: the agent's."""
        self.tmp_path = tmp_path
        spec = encode_fields({"keepalive": agent_keepalive, "eof_grace": eof_grace, "sample": sample})
        said, stderr = os.pipe()
        boot = boot or [sys.executable, "-I", "-S", "-c", AGENT_BOOT]
        self.proc = subprocess.Popen([*boot, spec], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=stderr, start_new_session=True)
        os.close(stderr)
        os.set_blocking(said, False)
        read_fd, write_fd = os.dup(self.proc.stdout.fileno()), os.dup(self.proc.stdin.fileno())
        self.proc.stdout.close()
        self.proc.stdin.close()
        os.set_blocking(read_fd, False)
        os.set_blocking(write_fd, False)
        self.link = AgentLink("testhost", LocalCarrier(self.proc, said), read_fd, write_fd, keepalive=keepalive,
                              hub=HUB, preamble=preamble)
        self.logs = LogWriter()

    def start(self, argv: list[str], *, name: str | None = None, grace: float = 2.0, relay: bool = False,
              env: dict | None = None, cwd: str | None = None) -> AgentTask:
        name = name or f"task-{uuid.uuid4().hex[:6]}"
        log = str(self.tmp_path / f"{name}.log")
        Path(log).touch()
        task = AgentTask(self.link, name, log if relay else None, self.logs)
        task.log_file = log
        self.link.start(task, {"name": name, "argv": argv, "env": env or {}, "cwd": cwd, "grace": grace,
                               "output": None if relay else log})
        return task

    def close(self) -> None:
        self.link.close(wait=5)
        self.logs.close()


@pytest.fixture
def host(tmp_path):
    hosts: list[Host] = []

    def make(**kwargs) -> Host:
        hosts.append(Host(tmp_path, **kwargs))
        return hosts[-1]

    yield make
    for h in hosts:
        h.close()


def state_of(task: AgentTask) -> str:
    """What the link, the agent and the task looked like when a wait ran out."""
    link = task.link
    agent, said = link.carrier.popen, ""
    try:
        link.carrier.drain()
        said = "\n".join(link.carrier.said.lines())[-500:]
    except (OSError, ValueError):
        pass
    under_agent = subprocess.run(["ps", "-o", "pid,stat,args", "--ppid", str(agent.pid)], capture_output=True,
                                 text=True).stdout.strip().replace("\n", "; ")
    return (f"(synced {link.frames.synced}, lost {link.lost_reason!r}, agent exit {agent.poll()}, task pid {task.pid}, "
            f"status {task.poll()}, under the agent: {under_agent!r}, agent stderr: {said!r})")


def ended(task: AgentTask, timeout: float = 15) -> ExitStatus:
    wait_for(lambda: task.poll() is not None, timeout=timeout, message=lambda: f"{task.name} to end {state_of(task)}")
    return task.poll()


def ready(task: AgentTask, timeout: float = 10) -> None:
    wait_for(lambda: "ready" in log_text(task), timeout=timeout,
             message=lambda: f"{task.name} to be ready {state_of(task)}")


def running(task: AgentTask, timeout: float = 10) -> int:
    wait_for(lambda: task.pid is not None or task.poll() is not None, timeout=timeout,
             message=lambda: f"{task.name} to start {state_of(task)}")
    assert task.pid is not None, task.poll()
    return task.pid


def log_text(task: AgentTask) -> str:
    return Path(task.log_file).read_text(errors="replace")


# -- the agent on another host ----------------------------------------------------------------

@pytest.mark.parametrize("which", ["bytecode", "source"])
def test_the_shipped_agent_runs_from_its_bytecode_or_else_its_source(host, which):
    # Each half of what is shipped is spoiled in turn: the agent still runs, so the other half ran.
    argv = remote_agent_argv(sys.executable)
    if which == "bytecode":  # this Python reads the bytecode: the source is never looked at
        argv[-1] = "spoiled"
    else:  # a Python of another bytecode version compiles the source; the bytecode is never read
        argv = remote_agent_argv(sys.executable, magic=b"\x00\x00\r\n")
        argv[-2] = "spoiled"
    h = host(boot=argv)
    task = h.start(["sh", "-c", "echo shipped; exit 4"])
    assert ended(task) == ExitStatus(code=4) and log_text(task) == "shipped\n"


@pytest.mark.parametrize("which", ["bytecode", "source"])
def test_the_agent_shipped_on_its_stdin_runs_from_its_bytecode_or_else_its_source(host, which):
    # As over ssh: a short command line, the agent first on the channel, the protocol right after it.
    payload = agent_payload()
    argv = stdin_agent_argv(sys.executable)
    code_size, source_size = int(argv[-2]), int(argv[-1])
    assert code_size + source_size == len(payload)
    if which == "bytecode":
        payload = payload[:code_size] + b"x" * source_size
    else:
        argv = stdin_agent_argv(sys.executable, magic=b"\x00\x00\r\n")
        payload = b"x" * code_size + payload[code_size:]
    h = host(boot=argv, preamble=payload)
    tasks = [h.start(["sh", "-c", f"echo shipped {i}; exit {i}"]) for i in range(3)]
    assert [ended(t) for t in tasks] == [ExitStatus(code=i) for i in range(3)]
    assert [log_text(t) for t in tasks] == [f"shipped {i}\n" for i in range(3)]


@pytest.mark.parametrize("sent", [0, 1000, "all but one"])
def test_an_agent_whose_channel_closes_before_it_arrived_ends_quietly(sent):
    # tflaunch killed while the agent was on its way: no traceback on the host, nothing left running.
    payload = agent_payload()
    cut = len(payload) - 1 if sent == "all but one" else sent
    proc = subprocess.Popen([*stdin_agent_argv(sys.executable), encode_fields({"keepalive": 5.0})],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(payload[:cut], timeout=30)
    assert (proc.returncode, out, err) == (0, b"", b"")


def test_the_shipped_agent_fits_one_command_line_argument():
    # Linux refuses a single argument over 128 KiB (MAX_ARG_STRLEN). srun and Ray's actor hand the
    # words to execve as they are (a setup line's shell passes them on through "$@"), none joined.
    argv = remote_agent_argv("/usr/bin/python3")
    assert max(len(word) for word in argv) < 96 * 1024 and len(argv[-1]) < 32 * 1024  # the source
    assert sum(len(word) + 1 for word in argv) < 512 * 1024  # ARG_MAX: a quarter of an 8 MiB stack, with the environment
    # Over ssh the agent is not on the line at all: what ps shows on the host stays short.
    assert len(" ".join(stdin_agent_argv("/usr/bin/python3"))) < 2 * 1024


# -- many tasks under one agent ------------------------------------------------------------------

def test_one_agent_runs_many_tasks_each_with_its_own_env_log_and_exit(host):
    h = host()
    tasks = [h.start(["sh", "-c", f'echo "$WHO"; exit {i}'], env={"WHO": f"task {i}"}) for i in range(20)]
    assert [ended(t) for t in tasks] == [ExitStatus(code=i) for i in range(20)]
    assert [log_text(t) for t in tasks] == [f"task {i}\n" for i in range(20)]
    assert [p for p in _children(h.proc.pid)] == []  # nothing of theirs is left under the agent
    assert h.proc.poll() is None  # one agent, still serving


def test_links_closed_and_opened_in_quick_succession_keep_to_their_own_agents(tmp_path):
    # A closed link's descriptor numbers are soon handed to the next link's pipes: whatever the hub
    # still had registered for the old link must never read or write the new one's channel.
    for round_ in range(25):
        hosts = [Host(tmp_path) for _ in range(2)]
        tasks = [h.start(["sh", "-c", f"echo {round_}; exit 3"]) for h in hosts for _ in range(3)]
        assert [ended(t) for t in tasks] == [ExitStatus(code=3)] * 6
        assert [log_text(t) for t in tasks] == [f"{round_}\n"] * 6
        for h in hosts:
            h.close()
            assert h.proc.poll() is not None  # it saw EOF and ended


SESSION_REPORT = ("import os\n"
                  "try:\n    os.close(os.open('/dev/tty', os.O_RDONLY)); tty = 'tty'\n"
                  "except OSError:\n    tty = 'no-tty'\n"
                  "print(os.getsid(0), os.getpgid(0), os.getpid(), tty)\n")


def _session_report(task: AgentTask) -> tuple[int, int, int, str]:
    assert ended(task) == ExitStatus(code=0), log_text(task)
    sid, pgid, pid, tty = log_text(task).split()
    return int(sid), int(pgid), int(pid), tty


def test_tasks_share_the_agents_session_each_in_a_process_group_of_its_own(host, tmp_path):
    # One session for a host's tasks: one autogroup for the scheduler, not one per task (see
    # launcher.agent.trees.lead_session). Both ways of starting a task: posix_spawn, and fork when it has a cwd.
    h = host()
    spawned = [h.start([sys.executable, "-c", SESSION_REPORT]) for _ in range(3)]
    forked = h.start([sys.executable, "-c", SESSION_REPORT], cwd=str(tmp_path))
    for task in [*spawned, forked]:
        sid, pgid, pid, tty = _session_report(task)
        assert (sid, pgid, tty) == (h.proc.pid, pid, "no-tty")


def test_an_agent_that_cannot_lead_a_session_gives_each_task_one(host, tmp_path):
    # Started as the leader of a process group inside another session, the agent cannot make a
    # session of its own; its tasks then get one each, never a share of a stranger's session.
    wrapper = ("import os, sys\n"
               "pid = os.fork()\n"
               "if pid == 0:\n    os.setpgid(0, 0)\n    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n"
               "os._exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) & 255)\n")
    h = host(boot=[sys.executable, "-c", wrapper, "-I", "-S", "-c", AGENT_BOOT])
    spawned = h.start([sys.executable, "-c", SESSION_REPORT])
    forked = h.start([sys.executable, "-c", SESSION_REPORT], cwd=str(tmp_path))
    for task in (spawned, forked):
        sid, pgid, pid, tty = _session_report(task)
        assert (sid, pgid, tty) == (pid, pid, "no-tty")


def test_missing_program_and_workdir_are_reported(host, tmp_path):
    h = host()
    missing = h.start(["no-such-program-xyz"])
    nowhere = h.start(["true"], cwd=str(tmp_path / "absent"))
    assert ended(missing) == ExitStatus(error="cannot start: program 'no-such-program-xyz' not found", error_code=127)
    assert "working directory" in ended(nowhere).error and ended(nowhere).error_code == 127


def test_term_stops_one_task_and_leaves_its_neighbours_running(host):
    h = host()
    target, neighbour = h.start(["sleep", "60"]), h.start(["sleep", "60"])
    running(target), running(neighbour)
    target.terminate()
    assert ended(target) == ExitStatus(signal=signal.SIGTERM)
    assert neighbour.poll() is None and _alive(neighbour.pid)
    neighbour.terminate()
    assert ended(neighbour) == ExitStatus(signal=signal.SIGTERM)


@pytest.mark.parametrize("started", ["spawned", "forked"])
def test_term_reaches_every_process_of_the_tasks_group_however_it_was_started(host, tmp_path, started):
    # The TERM goes to the task's group while /proc shows the leader leading it (a forked task
    # makes its group only after the fork returned to the agent); its child, in the group, ends too.
    h = host()
    marker = f"grouped-{uuid.uuid4().hex[:8]}"
    task = h.start(["sh", "-c", f"{sys.executable} -c 'import time; time.sleep(600)' {marker} & wait"],
                   cwd=str(tmp_path) if started == "forked" else None)
    running(task)
    wait_for(lambda: len(marked(marker)) == 1, timeout=10, message="the task's child to start")
    task.terminate()
    assert ended(task) == ExitStatus(signal=signal.SIGTERM)
    wait_for(lambda: not marked(marker), timeout=10, message="the child, in the task's group, to end with it")


def test_an_exit_says_whether_the_term_ended_it(host):
    # "termed": the TERM is what ended it (the supervisor calls such a task stopped, and any other
    # that exits on its own failed or succeeded).
    h = host()
    killed = h.start(["sleep", "60"])
    catches = h.start([sys.executable, "-c", "import signal, sys, time\n"
                       "signal.signal(signal.SIGTERM, lambda *_: sys.exit(4))\nprint('ready', flush=True)\n"
                       "time.sleep(60)"], relay=True)
    # SIGTERM blocked: the TERM stays pending and the task ends by its own exit, as one whose exit
    # was on its way when the TERM came.
    own = h.start([sys.executable, "-c", "import signal, sys, time\n"
                   "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\nprint('ready', flush=True)\n"
                   "time.sleep(1)\nsys.exit(3)"], relay=True)
    running(killed), ready(catches), ready(own)
    for task in (killed, catches, own):
        task.terminate()
    assert (ended(killed), ended(killed).termed) == (ExitStatus(signal=signal.SIGTERM), True)
    assert (ended(catches), ended(catches).termed) == (ExitStatus(code=4), True)
    assert (ended(own), ended(own).termed) == (ExitStatus(code=3), False)
    alone = h.start(["sh", "-c", "exit 5"])
    assert (ended(alone), ended(alone).termed) == (ExitStatus(code=5), False)


def test_kill_ends_a_task_that_ignores_term(host):
    h = host()
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    task = h.start([sys.executable, "-c", code])
    ready(task)
    task.terminate()
    time.sleep(0.3)  # a TERM it ignores: still running afterwards
    assert task.poll() is None
    started = time.monotonic()
    task.kill()
    assert ended(task) == ExitStatus(signal=signal.SIGKILL)
    assert time.monotonic() - started < 5  # it would sleep 60 s


def test_leftovers_of_a_finished_task_are_stopped_and_named_and_others_untouched(host):
    h = host()
    marker = f"m-{uuid.uuid4().hex}"
    other = h.start(["sleep", "60"])
    task = h.start([sys.executable, ESCAPE, marker, "escape", "exit:0"])
    assert ended(task) == ExitStatus(code=0)
    assert marked(marker) == []
    assert len(task.leftovers) == 2 and all("(pid " in name for name in task.leftovers), task.leftovers
    assert other.poll() is None and _alive(other.pid)


def test_a_leftover_ignoring_term_is_killed_after_its_grace(host):
    h = host()
    marker = f"m-{uuid.uuid4().hex}"
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    task = h.start(["bash", "-c", f"setsid {sys.executable} -c '{stubborn}' {marker} & sleep 0.5; exit 4"], grace=0.5)
    assert ended(task) == ExitStatus(code=4)
    assert marked(marker) == []
    assert len(task.leftovers) == 1


def test_a_task_without_leftovers_reports_none(host):
    task = host().start(["bash", "-c", "sleep 0.1 & wait; exit 0"])
    assert ended(task) == ExitStatus(code=0) and task.leftovers == ()


def test_dump_returns_the_tasks_python_stacks(host):
    code = "import time\ndef waiting_here():\n    time.sleep(60)\nprint('ready', flush=True)\nwaiting_here()"
    h = host()
    task = h.start([sys.executable, "-c", code])
    ready(task)
    assert "waiting_here" in task.dump_stacks(timeout=30)
    task.terminate()
    ended(task)
    assert task.leftovers == ()  # py-spy was the agent's helper, not the task's


def test_agents_started_apart_send_their_readings_together(host):
    # Each agent samples at the multiples of its period on the wall clock: two started half a
    # period apart send their readings at the same moments (once apart by half a period).
    first = host(sample=1.0)
    time.sleep(0.5)
    second = host(sample=1.0)
    tasks = [h.start(["sleep", "600"]) for h in (first, second)]
    arrivals: list[list[float]] = [[], []]

    def two_each() -> bool:
        for i, task in enumerate(tasks):
            reading = task.reading()
            if reading is not None and reading.at not in arrivals[i]:
                arrivals[i].append(reading.at)
        return all(len(at) >= 3 for at in arrivals)

    wait_for(two_each, timeout=20, interval=0.02, message="three readings from each agent")
    phases = [sorted(at % 1.0 for at in times)[1] for times in arrivals]  # the median of three
    gap = abs(phases[0] - phases[1])
    assert min(gap, 1.0 - gap) < 0.25, arrivals
    for task in tasks:
        task.kill()
        ended(task)


def test_the_agent_samples_each_tasks_memory_and_cpu(host):
    h = host(sample=0.2)
    code = "x = bytearray(40 * 1024 * 1024)\nprint('ready', flush=True)\nwhile True: pass"
    task = h.start([sys.executable, "-c", code])
    wait_for(lambda: task.reading() is not None and task.reading().rss_bytes > 40 << 20, timeout=15,
             message="a reading of the task's 40 MB")
    first = task.reading()
    wait_for(lambda: task.reading().cpu_seconds > first.cpu_seconds + 0.2, timeout=15, message="CPU time to grow")
    assert task.reading().pid == task.pid and task.reading().processes == 1
    task.kill()
    ended(task)


# -- when tflaunch is gone -----------------------------------------------------------------------

def test_eof_stops_every_tree_within_eof_grace(host):
    h = host(eof_grace=1.0)
    marker = f"m-{uuid.uuid4().hex}"
    for _ in range(3):
        h.start([sys.executable, ESCAPE, marker, "escape", "forever"])
    wait_for(lambda: len(marked(marker)) == 9, timeout=15, message="three tasks and their six escapees")
    started = time.monotonic()
    h.link.close_channel()
    h.proc.wait(timeout=10)
    wait_for(lambda: not marked(marker), timeout=10, message="every process of every tree to end")
    assert time.monotonic() - started < 5  # they would sleep 600 s


def test_a_missed_heartbeat_stops_every_task(tmp_path):
    # The raw agent, so that no heartbeat is sent: tflaunch alive but wedged.
    spec = encode_fields({"keepalive": 1.0, "eof_grace": 0.5})
    proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", AGENT_BOOT, spec], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, start_new_session=True)
    marker = f"m-{uuid.uuid4().hex}"
    for i in range(2):
        line = f"START {i + 1} {encode_fields({'argv': [sys.executable, '-c', SLEEPER, marker], 'grace': 1})}\n"
        proc.stdin.write(line.encode())
    proc.stdin.flush()
    wait_for(lambda: len(marked(marker)) == 2, timeout=10, message="both tasks to start")
    assert proc.wait(timeout=10) == 0
    assert marked(marker) == []
    proc.stdin.close()


# -- the channel: relayed output -------------------------------------------------------------------

def test_relayed_output_keeps_binary_bytes_partial_lines_and_order(host):
    h = host()
    payload = bytes(range(256)) * 64 + b"no newline at the end"
    task = h.start([sys.executable, "-c", f"import sys; sys.stdout.buffer.write({payload!r}); sys.stdout.flush()"],
                   relay=True)
    assert ended(task) == ExitStatus(code=0)
    assert Path(task.log_file).read_bytes() == payload


def test_a_binary_flood_in_writes_of_every_size_arrives_byte_for_byte(host):
    # 24 MiB in writes of random sizes (1 byte to 200 KiB), read by the agent as far as its pipe
    # holds them, framed, relayed and written down: the log holds exactly what was written.
    h = host()
    writer = ("import os, random\n"
              "rng = random.Random(7)\n"
              "data = rng.randbytes(24 << 20)\n"
              "view, at = memoryview(data), 0\n"
              "while at < len(data):\n"
              "    size = rng.choice((1, 7, 9, 4096, 65527, 65536, 65545, 200000))\n"
              "    at += os.write(1, view[at:at + size])\n")
    task = h.start([sys.executable, "-c", writer], relay=True)
    assert ended(task, timeout=60) == ExitStatus(code=0)
    expected = random.Random(7).randbytes(24 << 20)
    written = Path(task.log_file).read_bytes()
    assert len(written) == len(expected) and written == expected


def test_an_agent_whose_descriptors_pass_1024_serves_its_tasks(host):
    # A host of a thousand tasks under a raised ``ulimit -n`` gives its agent descriptors past 1024,
    # which select() refuses: the agent waits with poll(). Here the agent inherits 1,100 descriptors
    # on /dev/null, so every pipe it makes for its tasks is numbered past them.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the hard limit on open files here is {hard}, under the 1,200 this needs")
    wrapper = ("import os, resource, sys\n"
               "_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
               "resource.setrlimit(resource.RLIMIT_NOFILE, (1200 if hard == resource.RLIM_INFINITY else min(hard, 4096), hard))\n"
               "for _ in range(1100):\n"
               "    os.set_inheritable(os.open(os.devnull, os.O_RDONLY), True)\n"
               "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n")
    h = host(boot=[sys.executable, "-c", wrapper, "-I", "-S", "-c", AGENT_BOOT])
    tasks = [h.start(["sh", "-c", f"echo task {i}; sleep 0.2; exit {i}"], relay=True) for i in range(5)]
    assert [ended(t) for t in tasks] == [ExitStatus(code=i) for i in range(5)]
    assert [log_text(t) for t in tasks] == [f"task {i}\n" for i in range(5)]
    assert max(int(fd) for fd in os.listdir(f"/proc/{h.proc.pid}/fd")) > 1100  # it is the agent that holds them


def test_a_chatty_tasks_lines_come_in_a_few_large_frames_not_one_per_write(host):
    # 2,000 lines, one write every 0.25 ms or so for about half a second: an agent that woke for each
    # would send about one frame per line; it reads each wide pipe at most every OUTPUT_TICK (5 ms).
    h = host()
    writer = ("import os, time\n"
              "for i in range(2000):\n"
              "    os.write(1, b'%d a line of a chatty task\\n' % i)\n"
              "    time.sleep(0.00025)\n")
    task = h.start([sys.executable, "-c", writer], relay=True)
    frames, relay = [], task.output
    task.output = lambda data: (frames.append(len(data)), relay(data))
    assert ended(task) == ExitStatus(code=0)
    assert log_text(task).splitlines() == [f"{i} a line of a chatty task" for i in range(2000)]
    assert 0 < len(frames) <= 400, f"{len(frames)} output frames for 2,000 lines"


def test_a_flooding_task_delays_neither_another_tasks_status_nor_a_stop(host):
    h = host()
    flood = h.start(["yes", "flooding the channel with a long line of output"], relay=True)
    wait_for(lambda: os.path.getsize(flood.log_file) > 5 << 20, timeout=30, message="5 MB of flood")
    started = time.monotonic()
    quick = h.start(["sh", "-c", "echo done; exit 3"], relay=True)
    assert ended(quick, timeout=5) == ExitStatus(code=3)
    assert time.monotonic() - started < 5, "the flood delayed another task's status"
    assert log_text(quick) == "done\n"
    sleeper = h.start(["sleep", "60"], relay=True)
    running(sleeper)
    started = time.monotonic()
    sleeper.terminate()
    assert ended(sleeper, timeout=5) == ExitStatus(signal=signal.SIGTERM)
    assert time.monotonic() - started < 5, "the flood delayed a stop"
    assert h.link.lost_reason is None  # heartbeats kept flowing
    flood.kill()
    assert ended(flood) == ExitStatus(signal=signal.SIGKILL)
    lines = Path(flood.log_file).read_bytes().split(b"\n")[:-1]
    assert lines and set(lines) == {b"flooding the channel with a long line of output"}  # nothing torn or mixed


def test_a_task_restarted_in_place_runs_beside_its_untouched_neighbours(host):
    h = host()
    neighbours = [h.start(["sleep", "60"], name=f"worker-{i}") for i in range(3)]
    pids = [running(t) for t in neighbours]
    first = h.start(["sh", "-c", "exit 9"], name="worker-3")
    assert ended(first) == ExitStatus(code=9)
    again = h.start(["sh", "-c", "echo again; exit 0"], name="worker-3")
    assert ended(again) == ExitStatus(code=0)
    assert [t.pid for t in neighbours] == pids and all(t.poll() is None and _alive(t.pid) for t in neighbours)
    for t in neighbours:
        t.terminate()
    assert {ended(t) for t in neighbours} == {ExitStatus(signal=signal.SIGTERM)}


def test_a_killed_agent_fails_its_tasks_with_one_reason_and_takes_them_along(host):
    h = host()
    tasks = [h.start(["sleep", "60"]) for _ in range(4)]
    pids = [running(t) for t in tasks]
    os.kill(h.proc.pid, signal.SIGKILL)
    statuses = {ended(t).error for t in tasks}
    assert len(statuses) == 1 and "killed by signal 9" in statuses.pop()
    wait_for(lambda: not any(_alive(pid) for pid in pids), timeout=5, message="the tasks to go with their agent")


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
