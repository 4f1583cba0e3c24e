"""The one thread that serves every host agent's link (:mod:`.hostlink`): reading, writing,
heartbeats and noticing silence, so a run costs one thread, whatever its size.

What it costs grows with what the agents say, not with how many there are: the channels stay
registered with one epoll (changed only when a link comes, goes, or has output waiting), a turn
of the loop looks only at the channels that are ready, and the heartbeat pass (each link's
keep-alive check, and a heartbeat where its ``beat`` passed without a command) runs once a second.
Whenever a process's status changes (started, ended, lost), the hub notes it in :attr:`LinkHub.changes`,
which the supervisor sleeps on instead of polling every task.
"""

from __future__ import annotations

import os
import select
import threading
import time
from typing import TYPE_CHECKING

from ..agent.protocol import HEARTBEAT
from ..records.trace import bound, tracer
from .hostlink import READ_SIZE, AgentLink

if TYPE_CHECKING:
    from .proxies import AgentProcessBase

END_WATCH = 2.0  # after a channel closed: how long its carrier gets to exit, so its message can be read
_READ = select.EPOLLIN
_WRITE = select.EPOLLOUT
_TROUBLE = select.EPOLLHUP | select.EPOLLERR
log = tracer("linkhub")


class Changes:
    """Processes whose status changed since the last :meth:`take`, and a descriptor that is
    readable while any is waiting: one byte per batch, however many changes it holds."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._changed: list[AgentProcessBase] = []
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)

    def fileno(self) -> int:
        return self._read_fd

    def add(self, process: AgentProcessBase) -> None:
        with self._lock:
            first = not self._changed
            self._changed.append(process)
            if first:
                try:
                    os.write(self._write_fd, b"x")
                except OSError:
                    pass  # readable already

    def take(self) -> list[AgentProcessBase]:
        """The processes that changed (each may come more than once), emptying the batch."""
        with self._lock:
            changed, self._changed = self._changed, []
            try:
                while os.read(self._read_fd, 4096):
                    pass
            except OSError:
                pass  # drained
        return changed


class LinkHub:
    """The one thread that reads and writes every link, sends heartbeats and notices silence."""

    def __init__(self) -> None:
        self._links: dict[AgentLink, None] = {}  # the links it serves, in the order they came
        self._ending: list[tuple[AgentLink, float]] = []  # links whose channel closed: waiting for the carrier
        self._retired: list[AgentLink] = []  # closed links whose descriptors this thread closes
        self._dirty: set[AgentLink] = set()  # links whose registrations this thread brings up to date
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._thread: threading.Thread | None = None
        self.changes = Changes()
        # The hub's thread only: what epoll watches, by descriptor and by link.
        self._epoll: select.epoll | None = None
        self._link_of: dict[int, AgentLink] = {}
        self._read_buffer = bytearray(READ_SIZE)  # every link's reads, one after another
        self._masks_of: dict[AgentLink, dict[int, int]] = {}

    def add(self, link: AgentLink) -> None:
        with self._lock:
            self._links[link] = None
            self._dirty.add(link)
            if self._thread is None:
                self._epoll = select.epoll()
                self._epoll.register(self._wake_r, _READ)
                self._thread = threading.Thread(target=self._run, name="tflaunch-agents", daemon=True)
                log.debug("the links' thread starts")
                self._thread.start()
        self.wake()

    def remove(self, link: AgentLink) -> None:
        with self._lock:
            self._links.pop(link, None)
            self._dirty.add(link)
        if threading.current_thread() is not self._thread:
            self.wake()

    def update(self, link: AgentLink) -> None:
        """``link``'s channel arrived, or it has commands waiting to be written: watch for that."""
        with self._lock:
            self._dirty.add(link)
        if threading.current_thread() is not self._thread:
            self.wake()

    def retire(self, link: AgentLink) -> None:
        """``link`` is closed: its descriptors are closed by this hub's thread, before its next poll."""
        with self._lock:
            self._links.pop(link, None)
            self._retired.append(link)
        self.wake()

    def watch_end(self, link: AgentLink) -> None:
        """The channel closed: give the carrier a moment to exit so its message can be read."""
        with self._lock:
            self._ending.append((link, time.monotonic() + END_WATCH))

    def wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass  # a wakeup is pending already

    # -- the hub's thread -------------------------------------------------------------------------

    def _sync(self, link: AgentLink, active: bool) -> None:
        """Bring epoll's registrations for ``link`` in line with what it waits for now."""
        wanted: dict[int, int] = {}
        if active and not link.closed:
            if link.read_fd is not None:
                wanted[link.read_fd] = _READ
            if link.wants_write():
                wanted[link.write_fd] = wanted.get(link.write_fd, 0) | _WRITE
            if link.carrier.stderr_fd is not None and not link.carrier.said_all:
                wanted[link.carrier.stderr_fd] = _READ
        had = self._masks_of.pop(link, {})
        for fd in had.keys() - wanted.keys():
            self._link_of.pop(fd, None)
            try:
                self._epoll.unregister(fd)
            except OSError:
                pass  # closed already
        for fd, mask in wanted.items():
            try:
                if fd not in had:
                    self._epoll.register(fd, mask)
                elif had[fd] != mask:
                    self._epoll.modify(fd, mask)
            except OSError as exc:  # a descriptor that is no channel: this link alone ends
                link.end(f"its channel cannot be watched ({exc.strerror or exc})")
                return self._sync(link, False)
            self._link_of[fd] = link
        if wanted:
            self._masks_of[link] = wanted

    def _run(self) -> None:
        next_pass = time.monotonic() + HEARTBEAT
        while True:
            with self._lock:
                retired, self._retired = self._retired, []
                dirty, self._dirty = self._dirty, set()
                ending = list(self._ending)
                active = {link: link in self._links for link in dirty}
            for link in retired:
                self._sync(link, False)  # no longer watched before its descriptors close
                link.release_descriptors()
            for link, is_active in active.items():
                self._sync(link, is_active)
            timeout = max(0.0, next_pass - time.monotonic())
            if ending:
                timeout = min(timeout, 0.05)
            try:
                events = self._epoll.poll(timeout)
            except InterruptedError:
                continue
            for fd, mask in events:
                if fd == self._wake_r:
                    try:
                        os.read(self._wake_r, 4096)
                    except OSError:
                        pass
                    continue
                link = self._link_of.get(fd)
                if link is None:
                    continue
                try:
                    if fd == link.read_fd and mask & (_READ | _TROUBLE):
                        link.read_ready(self._read_buffer)
                    if fd == link.write_fd and mask & (_WRITE | _TROUBLE) and link.wants_write():
                        link.write_pending()
                    if fd == link.carrier.stderr_fd:
                        link.carrier.drain()
                        if link.carrier.said_all:
                            with self._lock:
                                self._dirty.add(link)  # no longer watched
                except Exception as exc:  # one broken link must not take every other host down
                    bound(log, link.trace).debug("%s: its link failed", link.host, exc_info=True)
                    link.end(f"its link failed ({exc!r})")
                if mask & _WRITE:
                    with self._lock:
                        self._dirty.add(link)  # written out: it may no longer wait to write
            now = time.monotonic()
            for link, deadline in ending:
                if link.carrier.ended() is not None or now > deadline:
                    bound(log, link.trace).debug(
                        "%s: channel closed; its carrier %s", link.host,
                        "ended" if link.carrier.ended() is not None else "still runs after the end watch")
                    with self._lock:
                        self._ending.remove((link, deadline))
                    link.lose()
            if now >= next_pass:
                next_pass = now + HEARTBEAT
                with self._lock:
                    links = list(self._links)
                for link in links:
                    try:
                        link.heartbeat(now)
                    except Exception as exc:  # one broken link must not stop every other host's heartbeat
                        link.end(f"its link failed ({exc!r})")


HUB = LinkHub()
