"""Port reservation for 'auto' tasks and the free-port check, with real sockets and real locks."""

from __future__ import annotations

import errno
import os
import socket
import stat
import tempfile
from contextlib import closing
from pathlib import Path

import pytest

from launcher.agent.ports import KEY_BYTES, claim_key
from launcher.cluster import ports as ports_module
from launcher.cluster.ports import HELD_AT_MOST, PortReservation, lock_folders, port_is_free, reserve_ports

pytestmark = pytest.mark.unit


def listening(family: int = socket.AF_INET, address: str = "127.0.0.1", port: int = 0,
              v6only: bool | None = None) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    if v6only is not None:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, int(v6only))
    sock.bind((address, port))
    sock.listen()
    return sock


def ipv6_works() -> bool:
    try:
        with closing(socket.socket(socket.AF_INET6, socket.SOCK_STREAM)) as sock:
            sock.bind(("::1", 0))
        return True
    except OSError:
        return False


needs_ipv6 = pytest.mark.skipif(not ipv6_works(), reason="no IPv6 loopback on this machine")


def lock_file(folder) -> str:
    return os.path.join(folder, f"ports-{os.uname().nodename}.lock")


def hold(folder, port: int) -> int | None:
    """Lock ``port`` as another run of this user's would: a descriptor of its own on the lock file."""
    os.makedirs(folder, mode=0o700, exist_ok=True)
    fd = os.open(lock_file(folder), os.O_RDWR | os.O_CREAT, 0o600)
    if ports_module._lock_byte(fd, claim_key(fd), port):
        return fd
    os.close(fd)
    return None


def lock_is_held(folder, port: int) -> bool:
    fd = hold(folder, port)
    if fd is None:
        return True
    os.close(fd)
    return False


def bound_by_someone(port: int) -> bool:
    """Whether a plain server socket of this user's (SO_REUSEADDR, as TensorFlow's) cannot bind ``port``."""
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError as exc:
            assert exc.errno == errno.EADDRINUSE
            return True
    return False


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


AGAIN = -1  # an offer of the port offered just before


def offer(monkeypatch, *candidates: int) -> list[int]:
    """Make the port picker try ``candidates`` in order (0: let the kernel pick, as it does after
    them); returns the ports it tried. Ports the kernel picks cannot be taken by a test running
    beside this one in the moment between a test choosing a port and tflaunch binding it."""
    offered: list[int] = []
    queue = list(candidates)
    real = ports_module._hold

    def pick(port: int = 0):
        port = queue.pop(0) if queue else 0
        holder = real(offered[-1] if port == AGAIN else port)
        offered.append(offered[-1] if port == AGAIN else port or (holder.getsockname()[1] if holder else 0))
        return holder

    monkeypatch.setattr(ports_module, "_hold", pick)
    return offered


def free_port() -> int:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---------------------------------------------------------------------------------------------
# port_is_free


def test_a_listening_port_is_not_free():
    sock = listening()
    port = sock.getsockname()[1]
    try:
        assert port_is_free(port) is False
    finally:
        sock.close()
    assert port_is_free(port) is True


def test_a_port_listening_on_every_address_is_not_free():
    with closing(listening(address="0.0.0.0")) as sock:
        assert port_is_free(sock.getsockname()[1]) is False


def test_a_bound_but_not_listening_port_is_not_free():
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        assert port_is_free(sock.getsockname()[1]) is False


@needs_ipv6
def test_a_port_listening_on_ipv6_only_is_not_free():
    with closing(listening(socket.AF_INET6, "::1", v6only=True)) as sock:
        assert port_is_free(sock.getsockname()[1]) is False


@needs_ipv6
def test_a_dual_stack_listener_is_not_free():
    with closing(listening(socket.AF_INET6, "::", v6only=False)) as sock:
        assert port_is_free(sock.getsockname()[1]) is False


def test_a_closed_connection_in_time_wait_leaves_the_port_free():
    # A server that set SO_REUSEADDR, as gRPC (TensorFlow's server) does, leaves its accepted
    # connections in TIME_WAIT with the flag too; a restarted task can bind again at once.
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    accepted.close()  # the server side closes first: its end of the port goes to TIME_WAIT
    client.close()
    server.close()
    assert port_is_free(port) is True


def test_port_is_free_leaves_the_port_free():
    port = free_port()
    assert port_is_free(port) and port_is_free(port)
    with closing(listening(port=port)):
        pass



def held_the_tflaunch_way(port: int = 0) -> socket.socket:
    """Bound on every address without SO_REUSEADDR, SO_REUSEPORT set after the bind."""
    sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.bind(("::", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    return sock


@needs_ipv6
def test_a_port_this_user_holds_the_tflaunch_way_is_free_for_its_task():
    with closing(held_the_tflaunch_way()) as holder:
        port = holder.getsockname()[1]
        assert bound_by_someone(port)  # the task could not bind it yet ...
        assert port_is_free(port) is True  # ... but will once the hold ends, just before it starts


@needs_ipv6
def test_a_listener_beside_a_hold_makes_the_port_busy():
    with closing(held_the_tflaunch_way()) as holder:
        port = holder.getsockname()[1]
        beside = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        beside.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        beside.bind(("127.0.0.1", port))
        beside.listen()
        with closing(beside):
            assert port_is_free(port) is False


def test_a_reuseport_socket_bound_before_it_listens_is_busy_when_it_does():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("0.0.0.0", 0))
    port = sock.getsockname()[1]
    with closing(sock):
        assert port_is_free(port) is True  # only bound: the tflaunch way of holding
        sock.listen()
        assert port_is_free(port) is False


# ---------------------------------------------------------------------------------------------
# reserve_ports


@pytest.fixture
def folder(tmp_path) -> Path:
    return tmp_path / "locks"


def test_reserve_gives_distinct_free_held_locked_ports(folder):
    names = [f"worker-{i}" for i in range(6)]
    with reserve_ports(names, folders=[folder]) as reservation:
        assert isinstance(reservation, PortReservation)
        assert list(reservation.ports) == names
        ports = list(reservation.ports.values())
        assert len(set(ports)) == len(ports)
        for port in ports:
            assert 1 <= port <= 65535
            assert bound_by_someone(port)  # held: no server can bind it yet
            assert port_is_free(port)  # free for the task it is meant for
            assert lock_is_held(folder, port)


def test_reserve_nothing_makes_no_lock(folder):
    with reserve_ports([], folders=[folder]) as reservation:
        assert reservation.ports == {}
    assert not folder.exists()


def test_the_lock_folder_and_file_are_the_users_alone_whatever_the_umask(folder):
    old = os.umask(0)
    try:
        reserve_ports(["w"], folders=[folder / "deeper"]).release()
    finally:
        os.umask(old)
    assert stat.S_IMODE((folder / "deeper").stat().st_mode) == 0o700
    info = os.lstat(lock_file(folder / "deeper"))
    assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600


def test_a_lock_folder_of_the_users_own_left_open_is_closed(folder):
    folder.mkdir()
    folder.chmod(0o777)
    fd = os.open(lock_file(folder), os.O_RDWR | os.O_CREAT, 0o666)
    os.fchmod(fd, 0o666)
    os.close(fd)
    reserve_ports(["w"], folders=[folder]).release()
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(os.stat(lock_file(folder)).st_mode) == 0o600


@pytest.mark.parametrize("kind", ["symlink", "hardlink"])
def test_a_linked_lock_file_is_replaced_and_what_it_named_is_untouched(folder, tmp_path, kind):
    target = tmp_path / "precious"
    target.write_text("keep me\n")
    target.chmod(0o600)
    folder.mkdir(mode=0o700)
    if kind == "symlink":
        os.symlink(target, lock_file(folder))
    else:
        os.link(target, lock_file(folder))
    with reserve_ports(["w"], folders=[folder]) as reservation:
        assert lock_is_held(folder, reservation.ports["w"])
        # The target carries no lock: the lock file is a new file of its own.
        fd = os.open(target, os.O_RDWR)
        try:
            key = Path(lock_file(folder)).read_bytes()[:KEY_BYTES]
            assert ports_module._lock_byte(fd, key, reservation.ports["w"])
        finally:
            os.close(fd)
    info = os.lstat(lock_file(folder))
    assert stat.S_ISREG(info.st_mode) and info.st_nlink == 1 and info.st_ino != target.stat().st_ino
    assert target.read_text() == "keep me\n" and stat.S_IMODE(target.stat().st_mode) == 0o600


def test_a_lock_folder_that_is_a_link_is_passed_over(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    first, second = tmp_path / "first", tmp_path / "second"
    first.symlink_to(elsewhere)
    with reserve_ports(["w"], folders=[first, second]) as reservation:
        assert lock_is_held(second, reservation.ports["w"])
    assert list(elsewhere.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a folder to another user")
def test_with_no_folder_of_the_users_own_the_error_names_each(tmp_path):
    theirs, link = tmp_path / "theirs", tmp_path / "link"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)
    link.symlink_to(tmp_path)
    with pytest.raises(OSError) as info:
        reserve_ports(["w"], folders=[theirs, link])
    assert info.value.strerror == (f"no folder of this user's alone for the port lock: {theirs} belongs to user "
                                   f"65534; {link} is a link or not a folder")
    assert list(theirs.iterdir()) == []


def test_two_held_reservations_never_overlap(folder):
    held = []
    try:
        for _ in range(4):
            held.append(reserve_ports([f"t{i}" for i in range(8)], folders=[folder]))
        every = [port for reservation in held for port in reservation.ports.values()]
        assert len(every) == len(set(every)) == 32
    finally:
        for reservation in held:
            reservation.release()


def test_a_port_another_run_locked_is_skipped_after_its_hold_ends(folder, monkeypatch):
    with reserve_ports(["first"], folders=[folder]) as first:
        port = first.ports["first"]
        first.unhold()  # its task is starting: the port is not bound by anyone for a moment
        offered = offer(monkeypatch, port, port)
        with reserve_ports(["second"], folders=[folder]) as second:
            assert second.ports["second"] != port
        assert offered[:2] == [port, port]


@pytest.mark.parametrize("hold", [2, 0])
def test_one_reservation_never_gives_the_same_port_twice(folder, monkeypatch, hold):
    offered = offer(monkeypatch, 0, AGAIN, AGAIN)
    with reserve_ports(["a", "b"], folders=[folder], hold=hold) as reservation:
        assert reservation.ports["a"] == offered[0] == offered[1] == offered[2]
        assert reservation.ports["b"] != offered[0]


def test_unhold_closes_the_sockets_and_keeps_the_locks(folder):
    # (That the tasks then bind their ports is checked on a real run: test_shared_machine.py.)
    before = open_descriptors()
    with reserve_ports(["a", "b"], folders=[folder]) as reservation:
        assert open_descriptors() == before + 3
        reservation.unhold()
        assert open_descriptors() == before + 1
        assert all(lock_is_held(folder, port) for port in reservation.ports.values())
        reservation.unhold()  # twice is harmless
    assert not any(lock_is_held(folder, port) for port in reservation.ports.values())


def test_released_locks_can_be_reacquired(folder):
    before = open_descriptors()
    reservation = reserve_ports(["a", "b"], folders=[folder])
    ports = list(reservation.ports.values())
    assert all(lock_is_held(folder, port) for port in ports)
    reservation.release()
    assert not any(lock_is_held(folder, port) for port in ports)
    assert open_descriptors() == before  # the sockets that held them are closed too
    reservation.release()  # twice is harmless


def test_context_manager_releases(folder):
    before = open_descriptors()
    with reserve_ports(["a"], folders=[folder]) as reservation:
        port = reservation.ports["a"]
        assert lock_is_held(folder, port) and bound_by_someone(port)
    assert not lock_is_held(folder, port) and open_descriptors() == before


def test_giving_up_names_the_task_and_releases_what_it_held(folder, monkeypatch):
    taken = free_port()
    blocker = hold(folder, taken)  # as another run of this user's would
    try:
        before = open_descriptors()
        offered = offer(monkeypatch, 0, taken, taken, taken)
        with pytest.raises(OSError) as info:
            reserve_ports(["ok", "stuck"], folders=[folder], attempts=3)
        assert info.value.errno == errno.EADDRINUSE
        assert "no free port found for stuck after 3 tries" in str(info.value)
        assert not lock_is_held(folder, offered[0]) and open_descriptors() == before
    finally:
        os.close(blocker)


def test_a_reservation_holds_one_lock_descriptor_and_a_socket_per_held_port_until_unheld(folder):
    before = open_descriptors()
    with reserve_ports([f"t{i}" for i in range(300)], folders=[folder]) as reservation:
        assert len(set(reservation.ports.values())) == 300
        assert open_descriptors() == before + 1 + HELD_AT_MOST
        reservation.unhold()
        assert open_descriptors() == before + 1
        assert all(lock_is_held(folder, port) for port in reservation.ports.values())
    assert open_descriptors() == before


def test_past_what_it_may_hold_a_reservation_locks_distinct_ports_only(folder, monkeypatch):
    before = open_descriptors()
    offered = offer(monkeypatch, 0, 0, 0, AGAIN, AGAIN)  # an unheld port offered again is not given twice
    with reserve_ports([f"t{i}" for i in range(5)], folders=[folder], hold=2) as reservation:
        ports = list(reservation.ports.values())
        assert len(set(ports)) == 5 and ports[2] == offered[2] == offered[4]
        assert bound_by_someone(ports[0]) and bound_by_someone(ports[1])
        assert open_descriptors() == before + 1 + 2
        assert all(lock_is_held(folder, p) for p in ports)


def test_the_default_folders_are_the_users_runtime_dir_then_own_in_the_temp_dir_then_the_cache(monkeypatch,
                                                                                                tmp_path):
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir reads TMPDIR again
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert lock_folders() == [tmp_path / "tmp" / f"tflaunch-{os.geteuid()}", tmp_path / "home" / ".cache" / "tflaunch"]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert lock_folders()[1] == tmp_path / "cache" / "tflaunch"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")
    assert lock_folders()[1] == tmp_path / "home" / ".cache" / "tflaunch"
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))  # made for this user alone: first
    assert lock_folders()[:2] == [tmp_path / "run" / "tflaunch", tmp_path / "tmp" / f"tflaunch-{os.geteuid()}"]
    monkeypatch.setenv("XDG_RUNTIME_DIR", "relative")
    assert lock_folders()[0] == tmp_path / "tmp" / f"tflaunch-{os.geteuid()}"
