"""Frames between workers: length-prefixed msgpack over asyncio TCP streams.

Every frame carries the cluster generation; a frame of another generation (a zombie from before
a rollback) is dropped. Frames to one peer are buffered and written together on ``flush``, so an
exchange round costs one write per peer, not one per transaction. A lost connection is a failed
worker: :attr:`Peers.failed` completes and the worker stops, and the supervisor rolls back.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from epochal.errors import EpochalError
from epochal.schemas.commands import ActorKey

__all__ = [
    "DoneFrame",
    "EmitItem",
    "Frame",
    "HelloFrame",
    "Peers",
    "ReadItem",
    "ReadsFrame",
    "TransportError",
]

logger = logging.getLogger(__name__)
_LENGTH = struct.Struct(">I")


class TransportError(EpochalError):
    """A peer could not be reached or went away."""


class ReadItem(msgspec.Struct, frozen=True, array_like=True):
    actor_type: str
    key: ActorKey
    value: bytes | None


class ReadsFrame(msgspec.Struct, frozen=True, array_like=True, tag="r"):
    """Values one partition read for transaction ``(epoch, seq)``, for partition ``to``."""

    generation: int
    epoch: int
    seq: int
    to: int
    items: list[ReadItem]


class EmitItem(msgspec.Struct, frozen=True, array_like=True):
    epoch: int
    seq: int
    index: int
    handler: str
    event: bytes


class DoneFrame(msgspec.Struct, frozen=True, array_like=True, tag="d"):
    """A worker finished ``epoch``; the events its transactions emitted come with it."""

    generation: int
    epoch: int
    worker: int
    emits: list[EmitItem]


class HelloFrame(msgspec.Struct, frozen=True, array_like=True, tag="h"):
    generation: int
    worker: int


Frame = ReadsFrame | DoneFrame | HelloFrame
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Frame)


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host or "127.0.0.1", int(port)


@dataclass
class Peers:
    """This worker's server and its connections to every other worker.

    ``addresses[w]`` is worker w's listen address (``host:port``); peers come from config, so
    workers on several hosts are only configuration. The engine that uses the peers sets
    ``on_frame`` to receive what arrives.
    """

    worker: int
    addresses: list[str]
    generation: int
    on_frame: Callable[[ReadsFrame | DoneFrame], None] = field(default=lambda frame: None)
    connect_timeout_s: float = 30.0
    failed: asyncio.Future[None] = field(init=False)
    _writers: dict[int, asyncio.StreamWriter] = field(default_factory=dict)
    _buffers: dict[int, list[bytes]] = field(default_factory=dict)
    _server: asyncio.Server | None = None
    _closing: bool = False

    async def start(self) -> None:
        self.failed = asyncio.get_running_loop().create_future()
        host, port = _split(self.addresses[self.worker])
        self._server = await asyncio.start_server(self._serve, host, port)
        for other, address in enumerate(self.addresses):
            if other != self.worker:
                self._writers[other] = await self._connect(other, address)
                self.send(other, HelloFrame(self.generation, self.worker))
        await self.flush()
        logger.info("peers connected worker=%d peers=%d", self.worker, len(self._writers))

    async def _connect(self, other: int, address: str) -> asyncio.StreamWriter:
        deadline = time.monotonic() + self.connect_timeout_s
        while True:
            try:
                _, writer = await asyncio.open_connection(*_split(address))
                return writer
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise TransportError(
                        "cannot reach worker", worker=other, address=address
                    ) from exc
                await asyncio.sleep(0.05)

    def send(self, to: int, frame: Frame) -> None:
        payload = _encoder.encode(frame)
        self._buffers.setdefault(to, []).append(_LENGTH.pack(len(payload)) + payload)

    def broadcast(self, frame: Frame) -> None:
        for other in self._writers:
            self.send(other, frame)

    async def flush(self) -> None:
        for to, chunks in self._buffers.items():
            if chunks:
                writer = self._writers[to]
                writer.write(b"".join(chunks))
                chunks.clear()
                try:
                    await writer.drain()
                except ConnectionError as exc:
                    raise TransportError("a peer went away", worker=to) from exc

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                header = await reader.readexactly(_LENGTH.size)
                frame = _decoder.decode(await reader.readexactly(_LENGTH.unpack(header)[0]))
                if frame.generation != self.generation:
                    continue  # a zombie of another generation
                if not isinstance(frame, HelloFrame):
                    self.on_frame(frame)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            if self._closing:
                return
            if not self.failed.done():
                self.failed.set_exception(TransportError("a peer went away", worker=self.worker))
            logger.warning("peer connection lost worker=%d: %s", self.worker, exc)
        finally:
            writer.close()

    async def close(self) -> None:
        """Close connections; the peers' handlers end on EOF, nothing is cancelled mid-frame."""
        self._closing = True
        for writer in self._writers.values():
            writer.close()
        if self._server is not None:
            self._server.close()
        if not self.failed.done():
            self.failed.cancel()
        elif not self.failed.cancelled():
            self.failed.exception()  # retrieved: the worker is stopping because of it anyway
