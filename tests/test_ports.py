"""Port reservation for 'auto' tasks and the free-port check, with real sockets and real locks."""

from __future__ import annotations

import errno
import os
import socket
import stat
from contextlib import closing

import pytest

from launcher.cluster import ports as ports_module
from launcher.cluster.ports import PortReservation, port_is_free, reserve_ports


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


def hold(lock_dir, port: int) -> int | None:
    """Lock ``port`` as another tflaunch would: a descriptor of its own on the shared lock file."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_dir / "ports.lock", os.O_RDWR | os.O_CREAT, 0o666)
    if ports_module._lock_byte(fd, port):
        return fd
    os.close(fd)
    return None


def lock_is_held(lock_dir, port: int) -> bool:
    fd = hold(lock_dir, port)
    if fd is None:
        return True
    os.close(fd)
    return False


def offer(monkeypatch, *candidates: int) -> list[int]:
    """Make the port picker offer ``candidates`` in order (then pick freely); returns what it offered."""
    offered: list[int] = []
    queue = list(candidates)
    real = ports_module._ephemeral_port

    def pick() -> int:
        port = queue.pop(0) if queue else real()
        offered.append(port)
        return port

    monkeypatch.setattr(ports_module, "_ephemeral_port", pick)
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


# ---------------------------------------------------------------------------------------------
# reserve_ports


def test_reserve_gives_distinct_free_locked_ports(tmp_path):
    names = [f"worker-{i}" for i in range(6)]
    with reserve_ports(names, lock_dir=tmp_path) as reservation:
        assert isinstance(reservation, PortReservation)
        assert list(reservation.ports) == names
        ports = list(reservation.ports.values())
        assert len(set(ports)) == len(ports)
        for port in ports:
            assert 1 <= port <= 65535
            assert port_is_free(port)
            assert lock_is_held(tmp_path, port)


def test_reserve_nothing(tmp_path):
    with reserve_ports([], lock_dir=tmp_path) as reservation:
        assert reservation.ports == {}


def test_reserve_creates_the_lock_dir(tmp_path):
    lock_dir = tmp_path / "a" / "b"
    with reserve_ports(["w"], lock_dir=lock_dir) as reservation:
        assert (lock_dir / "ports.lock").exists() and lock_is_held(lock_dir, reservation.ports["w"])


def test_two_held_reservations_never_overlap(tmp_path):
    held = []
    try:
        for _ in range(4):
            held.append(reserve_ports([f"t{i}" for i in range(8)], lock_dir=tmp_path))
        every = [port for reservation in held for port in reservation.ports.values()]
        assert len(every) == len(set(every)) == 32
    finally:
        for reservation in held:
            reservation.release()


def test_a_held_port_is_skipped_even_when_offered_again(tmp_path, monkeypatch):
    port = free_port()
    offered = offer(monkeypatch, port, port, port)
    with reserve_ports(["first"], lock_dir=tmp_path) as first:
        assert first.ports == {"first": port}
        with reserve_ports(["second"], lock_dir=tmp_path) as second:
            assert second.ports["second"] != port
        assert offered[:3] == [port, port, port]


def test_one_reservation_never_gives_the_same_port_twice(tmp_path, monkeypatch):
    port = free_port()
    offer(monkeypatch, port, port, port)
    with reserve_ports(["a", "b"], lock_dir=tmp_path) as reservation:
        assert reservation.ports["a"] == port
        assert reservation.ports["b"] != port


def test_a_busy_port_is_skipped_and_its_lock_let_go(tmp_path, monkeypatch):
    with closing(listening()) as busy:
        busy_port = busy.getsockname()[1]
        offer(monkeypatch, busy_port)
        with reserve_ports(["w"], lock_dir=tmp_path) as reservation:
            assert reservation.ports["w"] != busy_port
            assert not lock_is_held(tmp_path, busy_port)


def test_released_locks_can_be_reacquired(tmp_path, monkeypatch):
    reservation = reserve_ports(["a", "b"], lock_dir=tmp_path)
    ports = list(reservation.ports.values())
    assert all(lock_is_held(tmp_path, port) for port in ports)
    reservation.release()
    assert not any(lock_is_held(tmp_path, port) for port in ports)
    reservation.release()  # twice is harmless
    offer(monkeypatch, *ports)
    with reserve_ports(["c", "d"], lock_dir=tmp_path) as again:
        assert list(again.ports.values()) == ports


def test_context_manager_releases(tmp_path):
    with reserve_ports(["a"], lock_dir=tmp_path) as reservation:
        port = reservation.ports["a"]
        assert lock_is_held(tmp_path, port)
    assert not lock_is_held(tmp_path, port)


def test_giving_up_names_the_task_and_releases_what_it_held(tmp_path, monkeypatch):
    taken = free_port()
    blocker = hold(tmp_path, taken)  # as another tflaunch would
    try:
        first = free_port()
        offer(monkeypatch, first, taken, taken, taken)
        with pytest.raises(OSError) as info:
            reserve_ports(["ok", "stuck"], lock_dir=tmp_path, attempts=3)
        assert info.value.errno == errno.EADDRINUSE
        assert "no free port found for stuck after 3 tries" in str(info.value)
        assert not lock_is_held(tmp_path, first)
    finally:
        os.close(blocker)


def test_a_reservation_of_many_ports_holds_one_descriptor(tmp_path):
    before = len(os.listdir("/proc/self/fd"))
    with reserve_ports([f"t{i}" for i in range(300)], lock_dir=tmp_path) as reservation:
        assert len(set(reservation.ports.values())) == 300
        assert len(os.listdir("/proc/self/fd")) == before + 1
        assert all(lock_is_held(tmp_path, port) for port in reservation.ports.values())
    assert len(os.listdir("/proc/self/fd")) == before


def test_shared_lock_dir_is_writable_by_everyone(tmp_path):
    old = os.umask(0o022)
    try:
        lock_dir = tmp_path / "tflaunch-ports"
        reserve_ports(["w"], lock_dir=lock_dir).release()
    finally:
        os.umask(old)
    assert stat.S_IMODE(lock_dir.stat().st_mode) == 0o1777
