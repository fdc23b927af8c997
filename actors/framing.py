"""Length-prefixed frames over a byte stream: a 4-byte big-endian length, then the payload.

The exchange between workers and the query protocol both speak it. :class:`FrameBuffer` splits
whatever a socket read returned into whole payloads, so that a reader handles every frame of a
read at once (pipelined queries) instead of awaiting each length and each payload apart.
"""

from __future__ import annotations

import struct

from epochal.errors import EpochalError

__all__ = ["LENGTH", "FrameBuffer", "FrameTooLarge", "framed", "split_address"]

LENGTH = struct.Struct(">I")


class FrameTooLarge(EpochalError):
    """A frame announced more bytes than its reader accepts."""


def framed(payload: bytes) -> bytes:
    return LENGTH.pack(len(payload)) + payload


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (``:port`` means 127.0.0.1)."""
    host, _, port = address.rpartition(":")
    return host or "127.0.0.1", int(port)


class FrameBuffer:
    """Bytes read so far; :meth:`feed` returns the payloads they complete.

    >>> buffer = FrameBuffer(limit=1024)
    >>> buffer.feed(framed(b"ab") + framed(b"c")[:3])
    [b'ab']
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._data = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        buffer = self._data
        buffer += data
        payloads: list[bytes] = []
        start, end = 0, len(buffer)
        while end - start >= LENGTH.size:
            (length,) = LENGTH.unpack_from(buffer, start)
            if length > self.limit:
                raise FrameTooLarge("frame too large", length=length, limit=self.limit)
            if end - start - LENGTH.size < length:
                break
            start += LENGTH.size
            payloads.append(bytes(buffer[start : start + length]))
            start += length
        del buffer[:start]
        return payloads
