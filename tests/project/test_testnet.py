"""Tests of scripts/_testnet.py, the library of scripts/testhosts and scripts/testslurm: its pure parts,
and its waiting and killing against real processes (no root needed)."""

import importlib.machinery
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))
import _testnet as testnet  # noqa: E402

try:  # tests/ on sys.path (no package) or the repository root (tests/ as a package)
    from polling import wait_for
except ImportError:
    from tests.polling import wait_for


def load_script(name):
    loader = importlib.machinery.SourceFileLoader(f"{name}_script", str(SCRIPTS / name))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


# ---- names ----

def test_both_scripts_use_the_library_error():
    for name in ("testhosts", "testslurm"):
        script = load_script(name)
        assert script.testnet.TestbedError is testnet.TestbedError
        with pytest.raises(testnet.TestbedError, match="--prefix"):
            script.validate_prefix("Bad")


@pytest.mark.parametrize("script, longest, too_long", [("testhosts", "a" * 10, "a" * 11),
                                                       ("testslurm", "a" * 8, "a" * 9)])
def test_each_script_keeps_its_prefix_length(script, longest, too_long):
    module = load_script(script)
    assert module.validate_prefix(longest) == longest
    with pytest.raises(testnet.TestbedError, match=rf"up to {len(longest) - 1} lowercase .* got '{too_long}'"):
        module.validate_prefix(too_long)


def test_testslurm_subnets_stay_inside_10_8_and_testhosts_take_any_private_range():
    slurm, hosts = load_script("testslurm"), load_script("testhosts")
    assert str(slurm.validate_subnet("10.126.7")) == "10.126.7.0/24"
    with pytest.raises(testnet.TestbedError, match=r"192.168.1.0/24 is not inside 10.0.0.0/8"):
        slurm.validate_subnet("192.168.1")
    assert str(hosts.validate_subnet("192.168.1")) == "192.168.1.0/24"
    with pytest.raises(testnet.TestbedError, match=r"like 10.126.0, got '10.126'"):
        slurm.validate_subnet("10.126")


def test_find_host_by_name_or_address_and_a_miss_names_the_others():
    hosts = [{"name": "n1", "address": "10.1.1.11"}, {"name": "n2", "address": "10.1.1.12"}]
    assert testnet.find_host(hosts, "10.1.1.12", "node", "p")["name"] == "n2"
    with pytest.raises(testnet.TestbedError, match=r"^no node 'n3' with prefix p \(nodes: n1, n2\)$"):
        testnet.find_host(hosts, "n3", "node", "p")


# ---- state directory ----

def test_state_dir_of_another_program_or_person_is_refused_and_never_removed(tmp_path):
    tool = testnet.Tool("testhosts", "hosts.json")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(testnet.TestbedError, match=r"not empty and was not made by testhosts"):
        tool.prepare_state_dir(str(foreign), 0o700)
    tool.remove_state("tq0", str(foreign), keep_state=False)
    assert (foreign / "notes.txt").read_text() == "mine"

    ours = tmp_path / "ours"
    tool.prepare_state_dir(str(ours), 0o755, ("log",))
    assert (ours / ".tflaunch-testhosts").exists() and oct((ours / "log").stat().st_mode & 0o777) == "0o755"
    tool.prepare_state_dir(str(ours), 0o755)  # its own directory may be prepared again
    tool.remove_state("tq0", str(ours), keep_state=False)
    assert not ours.exists()


def test_state_dir_with_characters_a_config_would_expand_is_refused(tmp_path):
    with pytest.raises(testnet.TestbedError, match=r"--state-dir: use only"):
        testnet.Tool("testslurm", "cluster.json").prepare_state_dir(str(tmp_path / "a b%h"), 0o755)


def test_a_failed_block_is_rolled_back_and_a_failed_rollback_is_reported(capsys):
    tool, undone = testnet.Tool("testslurm", "cluster.json"), []
    with pytest.raises(KeyError):
        with tool.rolled_back("tq1", lambda: undone.append(True)):
            raise KeyError("boom")
    assert undone == [True]

    def undo_fails():
        raise testnet.TestbedError("ip link del tq1-br: busy")
    with pytest.raises(KeyError):
        with tool.rolled_back("tq1", undo_fails):
            raise KeyError("boom")
    assert capsys.readouterr().err == ("testslurm: rollback incomplete (ip link del tq1-br: busy); "
                                       "run 'testslurm down --prefix tq1'\n")


# ---- real processes ----

def test_waiting_on_a_daemon_that_exits_says_so_with_its_last_log_line(tmp_path):
    log = tmp_path / "d.log"
    proc = testnet.spawn(["sh", "-c", "echo starting; echo 'bad config line 3' >&2; exit 3"], str(log))
    with pytest.raises(testnet.TestbedError, match=r"^mydaemon exited with 3 \(last log line: bad config line 3\)$"):
        testnet.wait_until("mydaemon", lambda: False, 60, proc, str(log))


def test_waiting_runs_out_with_the_timeout_named(tmp_path):
    proc = testnet.spawn(["sleep", "60"], str(tmp_path / "d.log"))
    try:
        with pytest.raises(testnet.TestbedError, match=r"^mydaemon did not come up within 0.3 s$"):
            testnet.wait_until("mydaemon", lambda: False, 0.3, proc, str(tmp_path / "d.log"))
    finally:
        proc.kill()
        proc.wait()


def test_waiting_ends_when_ready(tmp_path):
    flag = tmp_path / "ready"
    proc = testnet.spawn(["sh", "-c", f"sleep 0.2; touch {flag}; sleep 60"], str(tmp_path / "d.log"))
    try:
        testnet.wait_until("mydaemon", flag.exists, 60, proc)
    finally:
        proc.kill()
        proc.wait()


def test_kill_all_kills_what_ignores_sigterm(tmp_path):
    proc = subprocess.Popen(["sh", "-c", "trap '' TERM; echo armed; while :; do sleep 0.05; done"],
                            stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stdout.readline() == b"armed\n"  # the trap is set before the first signal
        testnet.kill_all(lambda: [p for p in (proc.pid,) if testnet.is_running(p)], "test", 0.2)
        assert proc.wait(timeout=30) == -9
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
        proc.wait()


def test_cmdline_and_process_state_of_a_real_process_and_of_none(tmp_path):
    proc = subprocess.Popen(["sleep", "60"])
    try:
        # Between fork and exec the child still has Python's command line.
        wait_for(lambda: testnet.cmdline(proc.pid) == "sleep 60 ", message="sleep's command line")
        assert testnet.is_running(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert testnet.cmdline(proc.pid) == "" and testnet.process_state(proc.pid) is None
