"""The one thread that serves every host agent's link (:mod:`.hostlink`): reading, writing,
heartbeats and noticing silence, so a run costs one thread, whatever its size."""

from __future__ import annotations

import os
import select
import threading
import time

from .hostagent import HEARTBEAT
from .hostlink import AgentLink

END_WATCH = 2.0  # after a channel closed: how long its carrier gets to exit, so its message can be read


class LinkHub:
    """The one thread that reads and writes every link, sends heartbeats and notices silence."""

    def __init__(self) -> None:
        self._links: list[AgentLink] = []
        self._ending: list[tuple[AgentLink, float]] = []  # links whose channel closed: waiting for the carrier
        self._retired: list[AgentLink] = []  # closed links whose descriptors this thread closes
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._thread: threading.Thread | None = None

    def add(self, link: AgentLink) -> None:
        with self._lock:
            self._links.append(link)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="tflaunch-agents", daemon=True)
                self._thread.start()
        self.wake()

    def remove(self, link: AgentLink) -> None:
        with self._lock:
            if link in self._links:
                self._links.remove(link)

    def retire(self, link: AgentLink) -> None:
        """``link`` is closed: its descriptors are closed by this hub's thread, before its next poll."""
        self.remove(link)
        with self._lock:
            self._retired.append(link)
        self.wake()

    def _release_retired(self) -> None:
        retired, self._retired = self._retired, []
        for link in retired:
            link.release_descriptors()

    def watch_end(self, link: AgentLink) -> None:
        """The channel closed: give the carrier a moment to exit so its message can be read."""
        with self._lock:
            self._ending.append((link, time.monotonic() + END_WATCH))

    def wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass  # a wakeup is pending already

    def _run(self) -> None:
        next_beat = time.monotonic() + HEARTBEAT
        while True:
            with self._lock:
                self._release_retired()
                links = list(self._links)
                ending = list(self._ending)
            poller = select.poll()
            poller.register(self._wake_r, select.POLLIN)
            by_fd: dict[int, list[tuple[AgentLink, int]]] = {}
            for link in links:
                if link.read_fd is not None:
                    by_fd.setdefault(link.read_fd, []).append((link, select.POLLIN))
                if link.wants_write():
                    by_fd.setdefault(link.write_fd, []).append((link, select.POLLOUT))
            for fd, entries in by_fd.items():
                mask = 0
                for _, flag in entries:
                    mask |= flag
                poller.register(fd, mask)
            timeout = max(0.0, next_beat - time.monotonic())
            if ending:
                timeout = min(timeout, 0.05)
            try:
                events = poller.poll(timeout * 1000)
            except InterruptedError:
                continue
            for fd, mask in events:
                if fd == self._wake_r:
                    try:
                        os.read(self._wake_r, 4096)
                    except OSError:
                        pass
                    continue
                for link, flag in by_fd.get(fd, ()):
                    try:
                        if flag == select.POLLIN and mask & (select.POLLIN | select.POLLHUP | select.POLLERR):
                            link.read_ready()
                        elif flag == select.POLLOUT and mask & (select.POLLOUT | select.POLLERR):
                            link.write_pending()
                    except Exception as exc:  # one broken link must not take every other host down
                        link.end(f"its link failed ({exc!r})")
            now = time.monotonic()
            for link, deadline in ending:
                if link.carrier.ended() is not None or now > deadline:
                    with self._lock:
                        self._ending.remove((link, deadline))
                    link.lose()
            if now >= next_beat:
                next_beat = now + HEARTBEAT
                for link in links:
                    try:
                        link.heartbeat(now)
                    except Exception as exc:  # one broken link must not stop every other host's heartbeat
                        link.end(f"its link failed ({exc!r})")


HUB = LinkHub()
