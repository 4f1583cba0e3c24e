"""An agent's channel as tflaunch reads it: the bytes of each read, cut into whole frames.

What a login shell prints comes before the agent's sync mark (:data:`launcher.agent.protocol.SYNC`) and is
handed on as the host's own output; after it, every byte belongs to a frame (:data:`launcher.agent.protocol.HEADER`,
then its payload). A read ends wherever the channel's bytes ran out (in a header, in a payload,
between two frames): the start of a frame it cuts is kept and completed from the next read, and a
frame that lies whole in a read is handed on where it lies, as a view of the read's buffer. What
is no frame, or no sync mark within :data:`launcher.agent.protocol.MAX_FRAME` bytes, is a :class:`ProtocolError`.
"""

from __future__ import annotations

from typing import Callable

from ..agent.protocol import HEADER, MAX_FRAME, SYNC, printable


class ProtocolError(Exception):
    """The agent's channel carried something that is not the protocol; the message says what."""


class FrameReader:
    """Cuts one channel's reads into frames: ``valid(kind, ident, length)`` judges each header,
    ``on_frame(kind, ident, payload)`` gets each whole frame (the payload a memoryview valid until it
    returns), ``on_host_output(data)`` what came before the sync mark."""

    def __init__(self, valid: Callable[[bytes, int, int], bool],
                 on_frame: Callable[[bytes, int, memoryview], None], on_host_output: Callable[[bytes], None]):
        self.valid = valid
        self.on_frame = on_frame
        self.on_host_output = on_host_output
        self.synced = False
        self.pending = bytearray()  # the start of a frame cut by the end of a read (or bytes before the sync mark)
        self._before_sync = 0  # bytes read before the sync mark
        self._said_first = b""  # the first of them, to name them

    def feed(self, data: memoryview) -> None:
        """Act on every whole frame of ``data`` (a read), after the one an earlier read left
        unfinished; keep the start of a frame it leaves unfinished for the next."""
        if not self.synced:
            self.pending += data
            if not self._sync():
                return
            data, self.pending = memoryview(bytes(self.pending)), bytearray()  # once per channel
        if self.pending:
            data = data[self._finish_frame(data):]
            if self.pending:
                return  # the read ended inside that frame
        offset, size = 0, len(data)
        while size - offset >= HEADER.size:
            kind, ident, length = self._header(data, offset)
            start = offset + HEADER.size
            if size - start < length:
                break
            offset = start + length
            self.on_frame(kind, ident, data[start:offset])
        self.pending += data[offset:]

    def _finish_frame(self, data: memoryview) -> int:
        """Complete the frame begun in ``pending`` from the start of ``data``, as far as ``data``
        goes, and act on it once whole; how many bytes of ``data`` it took."""
        pending, taken = self.pending, 0
        if len(pending) < HEADER.size:
            taken = min(HEADER.size - len(pending), len(data))
            pending += data[:taken]
            if len(pending) < HEADER.size:
                return taken
        kind, ident, length = self._header(pending, 0)
        more = min(HEADER.size + length - len(pending), len(data) - taken)
        pending += data[taken:taken + more]
        if len(pending) == HEADER.size + length:
            self.pending = bytearray()
            with memoryview(pending) as frame:
                self.on_frame(kind, ident, frame[HEADER.size:])
        return taken + more

    def _header(self, data: bytes | bytearray | memoryview, offset: int) -> tuple[bytes, int, int]:
        """The kind, id and payload length of the frame at ``offset``; a ProtocolError when they are
        none the agent could send."""
        kind, ident, length = HEADER.unpack_from(data, offset)
        if not self.valid(kind, ident, length):
            raise ProtocolError(f"read {printable(bytes(data[offset:offset + 40]))} where a frame was "
                                "expected; does a login or setup script print after the start?")
        return kind, ident, length

    def _sync(self) -> bool:
        """Look for the agent's sync mark; what comes before it is the login shell's."""
        mark = self.pending.find(SYNC)
        if mark < 0:
            keep = len(SYNC) - 1  # the mark may be cut between two reads
            if len(self.pending) > keep:
                self._host_output(bytes(self.pending[:-keep]))
                del self.pending[:-keep]
            if self._before_sync > MAX_FRAME:
                raise ProtocolError(f"read {printable(self._said_first)} and then {self._before_sync} bytes "
                                    "more, but never the agent's start")
            return False
        self._host_output(bytes(self.pending[:mark]))
        del self.pending[:mark + len(SYNC)]
        self.synced = True
        return True

    def _host_output(self, data: bytes) -> None:
        self._before_sync += len(data)
        if len(self._said_first) < 64:
            self._said_first += data[:64 - len(self._said_first)]
        self.on_host_output(data)
