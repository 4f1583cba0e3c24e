"""Tests of scripts/testhosts: its pure parts directly, the rest with real namespaces, sshds and ssh."""

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

try:  # tests/ on sys.path (no package) or the repository root (tests/ as a package)
    import testhosts_fixture
    from conftest import MACHINE_FILES
    from polling import wait_for
except ImportError:
    from tests import testhosts_fixture
    from tests.conftest import MACHINE_FILES
    from tests.polling import wait_for

SCRIPT = testhosts_fixture.SCRIPT
require_testhosts = testhosts_fixture.require_testhosts
run_script = testhosts_fixture.run_script
start_testhosts = testhosts_fixture.start_testhosts
testhosts = testhosts_fixture.testhosts  # the conftest may provide it too; both share one set of hosts

def load_script():
    loader = importlib.machinery.SourceFileLoader("testhosts_script", str(SCRIPT))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


th = load_script()


# ---- pure parts: no root, no processes ----

@pytest.mark.parametrize("original", [
    "",
    "127.0.0.1 localhost\n",
    "127.0.0.1 localhost",                       # no trailing newline
    "Host *\r\n    User x\r\n",                  # CRLF
    "a\x0cb\x1cc\u2028d\n",                      # characters str.splitlines would break on
    "# BEGIN tflaunch testhosts prefix=tx (x)\n1.2.3.4 node1\n# END tflaunch testhosts prefix=tx\nrest\n",
])
def test_add_then_remove_block_gives_back_the_same_text(original):
    added = th.add_block(original, "t", ["10.1.2.11\tnode1"])
    assert added.startswith(th.block_markers("t")[0] + "\n")
    assert th.remove_block(added, "t") == original
    assert th.add_block(added, "t", ["10.1.2.11\tnode1"]) == added  # adding twice keeps one block


def test_remove_block_leaves_other_prefixes_alone():
    text = th.add_block(th.add_block("x\n", "ta", ["A"]), "tb", ["B"])
    assert th.remove_block(text, "ta") == th.add_block("x\n", "tb", ["B"])
    assert th.other_blocks(text, "ta") == ["tb"]


def test_unterminated_block_is_an_error_naming_the_file():
    begin, _ = th.block_markers("t")
    with pytest.raises(th.TestHostsError, match=r"/etc/hosts: .*no end marker"):
        th.remove_block(f"{begin}\n10.1.1.1 node1\n", "t", "/etc/hosts")


def test_plan_hosts_addresses_and_names_within_interface_limit():
    hosts = th.plan_hosts("abcdefghij", th.validate_subnet("10.123.0"), th.MAX_HOSTS)
    assert hosts[0] == th.Host("node1", "10.123.0.11", "abcdefghij-node1", "abcdefghij-v1")
    assert hosts[-1].address == "10.123.0.254"
    assert max(len(h.veth) for h in hosts) <= 15 and len(th.bridge_name("abcdefghij")) <= 15


@pytest.mark.parametrize("subnet", ["10.123", "10.123.0.0", "10.300.0", "8.8.8", "127.0.0", "192.0.2"])
def test_bad_subnets_are_rejected(subnet):
    with pytest.raises(th.TestHostsError, match="--subnet"):
        th.validate_subnet(subnet)


@pytest.mark.parametrize("prefix", ["", "T1", "1t", "t-x", "abcdefghijk"])
def test_bad_prefixes_are_rejected(prefix):
    with pytest.raises(th.TestHostsError, match="--prefix"):
        th.validate_prefix(prefix)


def test_missing_sshd_reason_names_the_install_command(monkeypatch):
    monkeypatch.setattr(testhosts_fixture.os, "geteuid", lambda: 0)
    monkeypatch.setattr(testhosts_fixture, "SSHD", "/nonexistent/sshd")
    reason = testhosts_fixture.unavailable_reason()
    assert reason is not None and "apt-get install -y openssh-server" in reason


def test_ssh_config_matches_names_and_addresses():
    hosts = th.plan_hosts("t", th.validate_subnet("10.9.8"), 2)
    text = th.ssh_config_text("t", hosts, "/s/id_ed25519")
    assert "Host node1 10.9.8.11\n    HostName 10.9.8.11\n    User root\n" in text
    assert "Host node2 10.9.8.12\n" in text and "IdentityFile /s/id_ed25519" in text


# ---- real hosts ----

def leftovers(prefix):
    """Namespaces and links of a prefix that still exist."""
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    links = [link["ifname"] for link in json.loads(subprocess.run(
        ["ip", "-j", "link", "show"], capture_output=True, text=True, check=True).stdout)]
    return [n for n in names + links if n.startswith(prefix + "-")]


def running(pid):
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # this machine's init does not reap orphans; a zombie holds nothing


@pytest.mark.slow
@pytest.mark.ssh
def test_the_hosts_have_their_own_hostnames(testhosts):
    assert [h.name for h in testhosts.hosts] == ["node1", "node2", "node3", "node4"]
    assert len({h.address for h in testhosts.hosts}) == 4
    for h in testhosts.hosts:
        for target in (h.name, h.address):  # the ssh_config matches both
            done = testhosts.run(target, "hostname")
            assert (done.returncode, done.stdout.strip()) == (0, h.name), done.stderr


@pytest.mark.slow
@pytest.mark.ssh
def test_each_host_reaches_the_other(testhosts):
    node1, node2 = testhosts.hosts[:2]
    for src, dst in ((node1, node2), (node2, node1)):
        done = testhosts.run(src.name, f'timeout 5 bash -c "echo > /dev/tcp/{dst.address}/22" && echo ok')
        assert done.stdout.strip() == "ok", done.stderr


@pytest.mark.slow
@pytest.mark.ssh
def test_process_started_over_ssh_is_listed_by_pids(testhosts):
    done = testhosts.run("node1", "setsid sleep 120 </dev/null >/dev/null 2>&1 & echo $!")
    pid = int(done.stdout.strip())
    try:
        assert pid in testhosts.pids("node1")
        assert pid not in testhosts.pids("node2")
        # As the script lists them: its sshd listener left out (it is in the namespace).
        listed = [int(p) for p in testhosts._script("pids", "node1").split()]
        assert pid in listed
        listener = testhosts_fixture.sshd_pid(os.path.join(testhosts.state_dir, "node1"))
        assert listener is not None and listener in testhosts_fixture.netns_pids(testhosts.host("node1").netns)
        assert listener not in testhosts.pids("node1") and listener not in listed
    finally:
        testhosts.run("node1", f"kill {pid}")
    wait_for(lambda: pid not in testhosts.pids("node1"), timeout=5, message=f"process {pid} on node1 to end")


@pytest.mark.slow
@pytest.mark.ssh
def test_cut_fails_new_connections_and_restore_brings_them_back(testhosts):
    testhosts.cut("node2")
    try:
        start = time.monotonic()
        done = testhosts.run("node2", "true", "-o", "ConnectTimeout=2", timeout=20)
        elapsed = time.monotonic() - start
        # ConnectTimeout ends it: without it, the kernel gives up on the SYN only after about 2 minutes.
        assert done.returncode == 255 and elapsed < 15, (done.returncode, elapsed, done.stderr)
        assert testhosts.run("node1", "hostname").stdout.strip() == "node1"  # only node2 is cut off
    finally:
        testhosts.restore("node2")
    done = testhosts.run("node2", "hostname", "-o", "ConnectTimeout=5")
    assert (done.returncode, done.stdout.strip()) == (0, "node2"), done.stderr


@pytest.mark.slow
@pytest.mark.ssh
def test_shared_hosts_keep_sshds_stock_limits(testhosts):
    for host in testhosts.hosts:
        config = (Path(testhosts.state_dir) / host.name / "sshd_config").read_text()
        assert "MaxStartups" not in config and "MaxSessions" not in config  # OpenSSH's defaults: 10:30:100, 10


@pytest.mark.slow
@pytest.mark.ssh
def test_raised_limits_accept_many_parallel_connections(tmp_path):
    require_testhosts()
    hosts = start_testhosts(tmp_path / "state", count=1, stock_limits=False)
    try:
        config = (Path(hosts.state_dir) / "node1" / "sshd_config").read_text()
        assert "MaxStartups 100:30:200" in config and "MaxSessions 100" in config
        with ThreadPoolExecutor(24) as pool:
            results = list(pool.map(lambda _: hosts.run("node1", "echo hi").returncode, range(24)))
        assert results == [0] * 24
    finally:
        hosts.down(keep_state=False)


@pytest.mark.slow
@pytest.mark.ssh
def test_up_again_is_a_no_op_and_status_reports_alive(testhosts):
    subnet = testhosts.doc["subnet"].rsplit(".", 1)[0]
    done = run_script("up", "--no-global", "--stock-limits", "--hosts", str(len(testhosts.hosts)),
                      "--prefix", testhosts.prefix, "--subnet", subnet, "--state-dir", testhosts.state_dir)
    assert done.returncode == 0 and "already up" in done.stderr
    assert json.loads(done.stdout) == testhosts.doc
    other = run_script("up", "--no-global", "--prefix", testhosts.prefix, "--hosts", "3", "--subnet", subnet,
                       "--state-dir", testhosts.state_dir)
    assert other.returncode == 1 and "already up" in other.stderr and len(other.stderr.splitlines()) == 1
    status = run_script("status", "--prefix", testhosts.prefix, "--state-dir", testhosts.state_dir)
    assert status.returncode == 0
    assert [h["sshd_alive"] for h in json.loads(status.stdout)["hosts"]] == [True] * len(testhosts.hosts)


@pytest.mark.slow
@pytest.mark.ssh
def test_expected_failures_are_one_line_errors(capsys):
    require_testhosts()
    as_nobody = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                                str(SCRIPT), "up", "--no-global"], capture_output=True, text=True)
    assert as_nobody.returncode == 1 and as_nobody.stderr == \
        "testhosts: error: must run as root (network namespaces need CAP_NET_ADMIN)\n"
    th.SSHD = "/nonexistent/sshd"
    try:
        assert th.main(["up", "--no-global", "--prefix", "tnosshd"]) == 1
    finally:
        th.SSHD = "/usr/sbin/sshd"
    assert capsys.readouterr().err == ("testhosts: error: /nonexistent/sshd not found; install it with: "
                                       "apt-get install -y openssh-server\n")
    for args in (["up", "--subnet", "8.8.8"], ["status", "--prefix", "tnotup"],
                 ["cut", "node1", "--prefix", "tnotup"]):
        done = run_script(*args)
        assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, (args, done.stderr)
        assert "Traceback" not in done.stderr


@pytest.mark.slow
@pytest.mark.ssh
def test_down_leaves_nothing_behind_and_is_idempotent(tmp_path):
    require_testhosts()
    hosts = start_testhosts(tmp_path / "state")
    state = Path(hosts.state_dir)
    sshds = [int((state / h.name / "sshd.pid").read_text()) for h in hosts.hosts]
    left = int(hosts.run("node1", "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!").stdout)
    assert all(running(p) for p in sshds + [left]) and leftovers(hosts.prefix)

    start = time.monotonic()
    done = run_script("down", "--prefix", hosts.prefix)  # finds the state dir through up's pointer
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - start < 10
    assert leftovers(hosts.prefix) == []
    assert not any(running(p) for p in sshds + [left])
    assert not state.exists()
    assert run_script("down", "--prefix", hosts.prefix).returncode == 0
    assert run_script("status", "--prefix", hosts.prefix).returncode == 1


@pytest.mark.slow
@pytest.mark.ssh
def test_down_after_a_partial_up_cleans_it(tmp_path):
    require_testhosts()
    prefix = "tp" + os.urandom(2).hex()
    subprocess.run(["ip", "netns", "add", f"{prefix}-node1"], check=True)
    subprocess.run(["ip", "link", "add", f"{prefix}-br0", "type", "bridge"], check=True)
    subprocess.run(["ip", "link", "add", f"{prefix}-v1", "type", "veth", "peer", "name", "eth0",
                    "netns", f"{prefix}-node1"], check=True)
    try:
        done = run_script("down", "--prefix", prefix, "--state-dir", str(tmp_path / "none"))
        assert done.returncode == 0, done.stderr
        assert leftovers(prefix) == []
    finally:
        run_script("down", "--prefix", prefix, "--state-dir", str(tmp_path / "none"))


def snapshot(path):
    """The file's bytes, or None if it does not exist."""
    return path.read_bytes() if path.exists() else None


def put_back(path, content):
    """Give path exactly the content snapshot() returned, writing in place (keeps mode, owner, mounts)."""
    if content is None:
        path.unlink(missing_ok=True)
    elif snapshot(path) != content:
        if not path.exists():
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            path.touch(mode=0o600)
        with open(path, "r+b") as f:
            f.write(content)
            f.truncate()


@pytest.mark.slow
@pytest.mark.ssh
@pytest.mark.xdist_group(MACHINE_FILES)  # both edit this machine's /etc/hosts and ~/.ssh/config: one at a time
@pytest.mark.parametrize("user_config", [None, b"Host *\n    ServerAliveInterval 7\n    User nobody"],
                         ids=["config-as-found", "config-with-host-star-no-newline"])
def test_global_up_edits_and_down_restores_files_exactly(tmp_path, user_config):
    require_testhosts()
    etc_hosts = Path("/etc/hosts")
    ssh_dir = Path(th.user_ssh_config()).parent
    ssh_config = ssh_dir / "config"
    had_dir = ssh_dir.exists()
    saved_hosts, saved_config = snapshot(etc_hosts), snapshot(ssh_config)
    prefix = "tg" + os.urandom(2).hex()
    try:
        if user_config is not None:
            ssh_dir.mkdir(mode=0o700, exist_ok=True)
            ssh_config.touch(mode=0o600)
            put_back(ssh_config, user_config)
        before_hosts, before_config = snapshot(etc_hosts), snapshot(ssh_config)
        up = run_script("up", "--prefix", prefix, "--subnet", f"10.125.{int(prefix[2:], 16) % 250 + 1}",
                        "--state-dir", str(tmp_path / "state"))
        assert up.returncode == 0, up.stderr
        doc = json.loads(up.stdout)
        begin = th.block_markers(prefix)[0]
        assert etc_hosts.read_text().startswith(begin + "\n")
        assert ssh_config.read_text().startswith(f"{begin}\nInclude {doc['ssh_config']}\n")
        node1, node2 = doc["hosts"]
        plain = subprocess.run(["ssh", "node1", "hostname"], capture_output=True, text=True, timeout=30,
                               stdin=subprocess.DEVNULL)  # no -F: through ~/.ssh/config and /etc/hosts
        assert plain.stdout.strip() == "node1", plain.stderr
        inside = subprocess.run(["ssh", "node1", "getent hosts node2"], capture_output=True, text=True,
                                timeout=30, stdin=subprocess.DEVNULL)
        assert inside.stdout.split() == [node2["address"], "node2"], inside.stderr

        down = run_script("down", "--prefix", prefix)
        assert down.returncode == 0, down.stderr
        assert snapshot(etc_hosts) == before_hosts
        assert snapshot(ssh_config) == before_config
        assert ssh_dir.exists() == (had_dir or user_config is not None)
    finally:
        run_script("down", "--prefix", prefix)
        put_back(etc_hosts, saved_hosts)
        put_back(ssh_config, saved_config)
        if not had_dir and ssh_dir.exists() and not any(ssh_dir.iterdir()):
            ssh_dir.rmdir()
