"""The agent protocol: the agent as a real process (commands on stdin, EOF, heartbeat, status
lines, leftovers), the spec it reads, and the pure parsers of its status lines (local and ssh)."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from launcher.transports.agentclient import (AGENT_PATH, AGENT_SOURCE, AgentReport, agent_spec,
                                             parse_agent_output, strip_stacks)
from launcher.transports.base import ExitStatus
from launcher.transports.ssh import ssh_exit_status
from conftest import marked
from polling import wait_for

MARK = "TFLAUNCH_AGENT"


def load_agent_module():
    namespace: dict = {"__name__": "agent_under_test"}
    exec(compile(AGENT_SOURCE, str(AGENT_PATH), "exec"), namespace)
    return namespace


class Agent:
    """A real agent process with a task, its stdin under the test's control."""

    def __init__(self, tmp_path: Path, argv: list[str], *, grace: float = 2.0, eof_grace: float = 1.0,
                 timeout: float | None = None, env: dict | None = None, cwd: str | None = None):
        self.out_path = tmp_path / f"out-{uuid.uuid4().hex[:6]}"
        self.err_path = tmp_path / f"err-{uuid.uuid4().hex[:6]}"
        spec = agent_spec(argv, env or {}, grace=grace, eof_grace=eof_grace, timeout=timeout, cwd=cwd)
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen([sys.executable, "-I", "-S", str(AGENT_PATH), spec], stdin=subprocess.PIPE,
                                         stdout=out, stderr=err, start_new_session=True)

    def send(self, text: str) -> None:
        self.proc.stdin.write(text.encode())
        self.proc.stdin.flush()

    @property
    def status_text(self) -> str:
        return self.err_path.read_text()

    @property
    def output(self) -> str:
        return self.out_path.read_text()

    @property
    def report(self) -> AgentReport:
        return parse_agent_output(self.status_text)

    def task_pid(self) -> int:
        wait_for(lambda: self.report.started is not None or self.proc.poll() is not None, timeout=10,
                 message="the agent to report the task's pid")
        assert self.report.started is not None, self.status_text
        return self.report.started

    def wait(self, timeout: float = 15) -> int:
        return self.proc.wait(timeout=timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()


@pytest.fixture
def agents(tmp_path):
    started: list[Agent] = []

    def start(argv, **kwargs) -> Agent:
        agent = Agent(tmp_path, argv, **kwargs)
        started.append(agent)
        return agent

    yield start
    for agent in started:
        agent.close()


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False



SLEEPER = "import time; time.sleep(600)"
ESCAPE = str(Path(__file__).parent / "helpers" / "escape.py")


def escaping_task(marker: str, *then: str) -> list[str]:
    """A task that leaves one process in a session of its own and one double-forked, then does ``then``."""
    return [sys.executable, ESCAPE, marker, "escape", *then]


# -- the spec ----------------------------------------------------------------------------------

def test_spec_round_trips_awkward_values():
    read_spec = load_agent_module()["read_spec"]
    argv = ["python", "-c", "print('a b')", "", "ü ñ \n tab\t", "--x=$(rm -rf /)"]
    env = {"EMPTY": "", "SPACES": "  two  ", "NEWLINE": "a\nb", "EQUALS": "a=b=c"}
    spec = read_spec(agent_spec(argv, env, grace=2.5, eof_grace=1, timeout=None, cwd="/tmp/a dir"))
    assert spec == {"argv": argv, "env": env, "grace": 2.5, "eof_grace": 1.0, "timeout": None, "cwd": "/tmp/a dir"}
    assert read_spec(agent_spec(["true"], {}, grace=5, eof_grace=3, timeout=15))["timeout"] == 15.0


def test_spec_refuses_a_nul_character():
    with pytest.raises(ValueError, match="NUL"):
        agent_spec(["echo", "a\0b"], {}, grace=1, eof_grace=1, timeout=None)


def test_agent_source_is_python_3_6_syntax():
    ast.parse(AGENT_SOURCE, feature_version=(3, 6))


def test_agent_imports_only_what_a_fast_start_needs(tmp_path):
    spec = agent_spec(["true"], {}, grace=1, eof_grace=1, timeout=None)
    with open(tmp_path / "stderr", "wb") as err:
        agent = subprocess.Popen([sys.executable, "-I", "-S", "-X", "importtime", str(AGENT_PATH), spec],
                                 stdin=subprocess.PIPE, stderr=err)
    agent.wait(timeout=30)  # with stdin open: EOF would stop the task
    agent.stdin.close()
    stderr = (tmp_path / "stderr").read_text()
    imported = {line.split("|")[-1].strip() for line in stderr.splitlines() if line.startswith("import time:")}
    assert {"json", "re", "enum", "subprocess", "threading"}.isdisjoint(imported), sorted(imported)
    assert f"{MARK} exit code=0" in stderr


# -- status lines --------------------------------------------------------------------------------

def test_parse_status_lines():
    text = (f"{MARK} started 4242\nsome ssh warning\n{MARK} leftover 4711 sleep\n{MARK} leftover 4712 my daemon\n"
            f"{MARK} exit code=3\n")
    report = parse_agent_output(text)
    assert report == AgentReport(started=4242, exit=ExitStatus(code=3), error=None,
                                 leftovers=("sleep (pid 4711)", "my daemon (pid 4712)"), other=("some ssh warning",))
    assert parse_agent_output(f"{MARK} started 1\n{MARK} exit signal=9\n").exit == ExitStatus(signal=9)
    failed = parse_agent_output(f"{MARK} error cannot start: program 'nope' not found\n")
    assert failed.error == "cannot start: program 'nope' not found" and failed.started is None


def test_parse_ignores_stack_dumps_and_unknown_marks():
    text = (f"{MARK} started 7\n{MARK} stacks-begin\nThread 1\n{MARK} exit code=9\n{MARK} stacks-end\n"
            f"{MARK} something new\n{MARK} exit code=0\n")
    report = parse_agent_output(text)
    assert report.exit == ExitStatus(code=0)
    assert report.other == (f"{MARK} something new",)
    assert strip_stacks(f"a\n{MARK} stacks-begin\nx\n{MARK} stacks-end\nb\n") == "a\nb\n"


def test_parse_truncated_output_has_no_exit():
    report = parse_agent_output(f"{MARK} started 12\n{MARK} exit co")
    assert report.started == 12 and report.exit is None


def _lost(detail):
    return ExitStatus(error=f"lost ({detail})")


def _not_started(code, detail):
    return ExitStatus(error=f"not started {code} ({detail})")


@pytest.mark.parametrize("text, returncode, expected", [
    (f"{MARK} started 5\n{MARK} exit code=4\n", 4, ExitStatus(code=4)),
    (f"{MARK} started 5\n{MARK} exit signal=15\n", 143, ExitStatus(signal=15)),
    (f"{MARK} error cannot start: program 'x' not found\n", 127,
     ExitStatus(error="cannot start: program 'x' not found on node1", error_code=127)),
    (f"{MARK} started 5\n", 255, ExitStatus(error="lost (None)")),
    (f"{MARK} started 5\nclient_loop: send disconnect: Broken pipe\n", 255,
     ExitStatus(error="lost (client_loop: send disconnect: Broken pipe)")),
    ("ssh: connect to host node1 port 22: Connection refused\n", 255,
     ExitStatus(error="not started 255 (ssh: connect to host node1 port 22: Connection refused)")),
    ("", 1, ExitStatus(error="not started 1 (ssh exited with 1)")),
])
def test_ssh_exit_status(text, returncode, expected):
    report = parse_agent_output(text)
    assert ssh_exit_status(report, returncode, "node1", "ssh", _lost, _not_started) == expected


# -- the agent as a process ------------------------------------------------------------------------

def test_exit_code_output_and_env_reach_through(agents, tmp_path):
    agent = agents([sys.executable, "-c", "import os, sys; print(os.getcwd(), os.environ['USER_X']); "
                                          "print('err', file=sys.stderr); sys.exit(7)"],
                   env={"USER_X": "x y"}, cwd=str(tmp_path))
    assert agent.wait() == 7
    assert agent.output.splitlines() == [f"{tmp_path} x y", "err"]  # stderr joins stdout, in order
    report = agent.report
    assert report.exit == ExitStatus(code=7) and report.started and report.leftovers == ()


def test_missing_program_and_workdir_are_reported(agents, tmp_path):
    agent = agents(["no-such-program-xyz"])
    assert agent.wait() == 127
    assert agent.report.error == "cannot start: program 'no-such-program-xyz' not found"
    agent = agents(["true"], cwd=str(tmp_path / "missing"))
    assert agent.wait() == 127
    assert agent.report.error == f"cannot start: working directory '{tmp_path / 'missing'}' not found"


def test_term_command_stops_the_group_and_signal_death_is_reported(agents):
    agent = agents(["sleep", "60"])
    agent.task_pid()
    agent.send("TERM\n")
    assert agent.wait() == 128 + signal.SIGTERM
    assert agent.report.exit == ExitStatus(signal=signal.SIGTERM)


def test_sig_command_reaches_the_main_process_only(agents):
    code = ("import signal, sys, time; signal.signal(signal.SIGUSR1, lambda *a: (print('usr1', flush=True), "
            "sys.exit(3))); print('ready', flush=True); time.sleep(60)")
    agent = agents([sys.executable, "-c", code])
    wait_for(lambda: "ready" in agent.output, timeout=10, message="the task to be ready")
    agent.send(f"SIG {int(signal.SIGUSR1)}\n")
    assert agent.wait() == 3
    assert "usr1" in agent.output


def test_kill_command_kills_a_task_that_ignores_term(agents):
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    agent = agents([sys.executable, "-c", code], grace=30)
    wait_for(lambda: "ready" in agent.output, timeout=10, message="the task to be ready")
    agent.send("TERM\n")
    time.sleep(0.3)  # the task has had its chance to die of TERM; it must still be there
    assert agent.proc.poll() is None
    start = time.monotonic()
    agent.send("KILL\n")
    assert agent.wait() == 128 + signal.SIGKILL
    assert time.monotonic() - start < 2


def test_eof_stops_the_whole_tree_within_eof_grace(agents):
    marker = f"m-{uuid.uuid4().hex}"
    agent = agents([*escaping_task(marker, "forever"), marker], eof_grace=1.0)
    wait_for(lambda: len(marked(marker)) == 3, timeout=10, message="the task and its two escapees")
    start = time.monotonic()
    agent.proc.stdin.close()
    agent.wait()
    wait_for(lambda: not marked(marker), timeout=3, message="every process of the tree to end")
    assert time.monotonic() - start < 2.5
    assert agent.report.exit == ExitStatus(signal=signal.SIGTERM)


def test_eof_grace_ends_in_sigkill_for_a_task_ignoring_term(agents):
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    agent = agents([sys.executable, "-c", code], eof_grace=0.5)
    wait_for(lambda: "ready" in agent.output, timeout=10, message="the task to be ready")
    agent.proc.stdin.close()
    assert agent.wait() == 128 + signal.SIGKILL


def test_missed_heartbeat_stops_the_task_and_heartbeats_keep_it(agents):
    kept = agents(["sleep", "60"], timeout=1.0)
    dropped = agents(["sleep", "60"], timeout=1.0)
    kept.task_pid()
    dropped.task_pid()
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:
        kept.send("\n")
        time.sleep(0.3)
    assert dropped.wait(timeout=5) == 128 + signal.SIGTERM
    assert kept.proc.poll() is None
    kept.send("TERM\n")
    assert kept.wait() == 128 + signal.SIGTERM


def test_leftovers_of_a_finished_task_are_stopped_and_named(agents):
    marker = f"m-{uuid.uuid4().hex}"
    agent = agents(escaping_task(marker, "exit:0"))
    assert agent.wait() == 0
    assert marked(marker) == []
    leftovers = agent.report.leftovers
    assert len(leftovers) == 2 and all(name.startswith("python") and "(pid " in name for name in leftovers), leftovers


def test_a_leftover_ignoring_term_is_killed_after_grace(agents):
    marker = f"m-{uuid.uuid4().hex}"
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    agent = agents(["bash", "-c", f"setsid {sys.executable} -c '{stubborn}' {marker} & sleep 0.5; exit 4"], grace=0.5)
    assert agent.wait() == 4
    assert marked(marker) == []
    assert len(agent.report.leftovers) == 1


def test_a_task_without_leftovers_reports_none(agents):
    agent = agents(["bash", "-c", "sleep 0.1 & wait; exit 0"])
    assert agent.wait() == 0
    assert agent.report.leftovers == ()


def test_dump_returns_the_tasks_python_stacks(agents):
    code = "import time\ndef waiting_here():\n    time.sleep(60)\nprint('ready', flush=True)\nwaiting_here()"
    agent = agents([sys.executable, "-c", code])
    wait_for(lambda: "ready" in agent.output, timeout=10, message="the task to be ready")
    agent.send("DUMP\n")
    wait_for(lambda: f"{MARK} stacks-end" in agent.status_text, timeout=20, message="the stack dump")
    assert "waiting_here" in agent.status_text
    agent.send("TERM\n")
    agent.wait()
    assert agent.report.leftovers == ()  # py-spy was the agent's helper, not the task's


# -- tflaunch's side: the client over a real carrier process ----------------------------------------

def test_carrier_messages_reach_the_task_log_and_decide_the_status(tmp_path):
    from launcher.cluster.plan import TaskLaunch
    from launcher.transports.agentclient import status_file
    from launcher.transports.ssh import SshProcess

    launch = TaskLaunch(name="worker-0", role="worker", index=0, host="node1", address="node1:2222", local=False,
                        argv=("true",), env={}, workdir=str(tmp_path))
    log = tmp_path / "worker-0.log"
    output = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    status = status_file()
    # A stand-in for the ssh client that cannot connect: its own message on stderr, exit 255.
    carrier = subprocess.Popen(["sh", "-c", "echo 'ssh: connect to host node1 port 22: Connection refused' >&2; "
                                            "exit 255"], stdin=subprocess.PIPE, stdout=output, stderr=status)
    process = SshProcess(launch, carrier, status, os.dup(output))
    os.close(output)
    result = wait_for(process.poll, timeout=10, message="the carrier to end")
    process.cleanup()
    assert result == ExitStatus(error="cannot reach node1 over ssh (ssh: connect to host node1 port 22: "
                                      "Connection refused)")
    assert log.read_text() == "[ssh node1] ssh: connect to host node1 port 22: Connection refused\n"
    assert process.leftovers == ()


def test_the_task_gets_the_default_sigpipe(agents):
    # Python ignores SIGPIPE for itself; a task must not inherit that (`yes | head` would never end).
    agent = agents(["bash", "-c", "yes | head -1; echo ${PIPESTATUS[0]}"])
    assert agent.wait() == 0
    assert agent.output.splitlines() == ["y", str(128 + signal.SIGPIPE)]


def test_heartbeats_flow_while_the_supervisor_is_busy_elsewhere(tmp_path, monkeypatch):
    import launcher.transports.local as local
    from launcher.cluster.plan import TaskLaunch

    monkeypatch.setattr(local, "HEARTBEAT_TIMEOUT", 1.5)
    launch = TaskLaunch(name="worker-0", role="worker", index=0, host="localhost", address="localhost:1", local=True,
                        argv=("sleep", "60"), env={}, workdir=str(tmp_path))
    output = os.open(tmp_path / "worker-0.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    process = local.LocalTransport(grace=1.0).start(launch, output)
    os.close(output)
    try:
        assert process.pid is not None
        time.sleep(4)  # no poll() at all, as while the watchdog collects the stacks of many tasks
        assert process.poll() is None and alive(process.pid)
    finally:
        process.terminate()
        status = wait_for(process.poll, timeout=10, message="the task to stop")
        process.cleanup()
    assert status == ExitStatus(signal=signal.SIGTERM)
