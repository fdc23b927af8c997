"""Frames between workers: length-prefixed msgpack over asyncio TCP streams.

Every frame carries the cluster generation; a frame of another generation (a zombie from before
a rollback) is dropped. Frames to one peer are buffered and written together on ``flush``, so an
exchange round costs one write per peer, not one per transaction. A lost connection is a failed
worker: :attr:`Peers.failed` completes and the worker stops, and the supervisor rolls back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from epochal.actors.framing import LENGTH, framed, split_address
from epochal.actors.outcome import Emitted
from epochal.config import Listener
from epochal.errors import BindError, EpochalError
from epochal.schemas.commands import KeyRef
from epochal.schemas.snapshots import SnapshotPart

__all__ = [
    "CommittedFrame",
    "DoneFrame",
    "Frame",
    "HeartbeatFrame",
    "HelloFrame",
    "PartFrame",
    "PeerFrame",
    "Peers",
    "ReadsFrame",
    "TransportError",
    "TxnValues",
    "WritesFrame",
]

logger = logging.getLogger(__name__)


class TransportError(EpochalError):
    """A peer could not be reached or went away."""


class TxnValues(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """Canonical values of some of one transaction's keys: ``values[i]`` is ``refs[i]``'s
    (None: no such actor, or deleted)."""

    seq: int
    refs: tuple[KeyRef, ...]
    values: list[bytes | None]


class ReadsFrame(msgspec.Struct, frozen=True, array_like=True, tag="r"):
    """What one worker read for transactions of ``epoch`` that another runs: all that became
    final in one exchange round, in one frame."""

    generation: int
    epoch: int
    txns: list[TxnValues]


class WritesFrame(msgspec.Struct, frozen=True, array_like=True, tag="w"):
    """What transactions of ``epoch`` that one worker ran wrote to the keys of another that
    sent it reads (none for one that aborted): all that ran in one exchange round."""

    generation: int
    epoch: int
    txns: list[TxnValues]


class DoneFrame(msgspec.Struct, frozen=True, array_like=True, tag="d"):
    """A worker finished ``epoch``; the events its reported transactions emitted come with it."""

    generation: int
    epoch: int
    worker: int
    emits: list[Emitted]


class HelloFrame(msgspec.Struct, frozen=True, array_like=True, tag="h"):
    """A peer introduces itself, and the snapshot it resumed from (-1: none): workers that
    resumed from different snapshots would wait on each other for ever."""

    generation: int
    worker: int
    resumed: int = -1


class PartFrame(msgspec.Struct, frozen=True, array_like=True, tag="s"):
    """A worker's part of a snapshot, for the committer (worker 0)."""

    generation: int
    part: SnapshotPart


class CommittedFrame(msgspec.Struct, frozen=True, array_like=True, tag="c"):
    """Worker 0 to the others: snapshot ``ssid`` committed (weak mode releases egress then)."""

    generation: int
    ssid: int


class HeartbeatFrame(msgspec.Struct, frozen=True, array_like=True, tag="b"):
    """Sent to every peer four times per failure bound: a peer silent for longer has failed."""

    generation: int


PeerFrame = ReadsFrame | WritesFrame | DoneFrame | PartFrame | CommittedFrame
"""What a worker's engine handles; hellos and heart-beats stay in the transport."""
Frame = PeerFrame | HelloFrame | HeartbeatFrame
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Frame)


@dataclass
class Peers:
    """This worker's server and its connections to every other worker.

    ``addresses[w]`` is worker w's listen address (``host:port``); peers come from config, so
    workers on several hosts are only configuration. The engine that uses the peers sets
    ``on_frame`` to receive what arrives.

    :attr:`failed` completes with a :class:`TransportError` when a peer is lost: its connection
    closes, a frame from it cannot be handled (whatever the exception: a reader must never die
    silently, or its peers wait forever), or it has been silent for ``failure_timeout_s`` (every
    worker sends a :class:`HeartbeatFrame` four times per bound, so this catches a peer that is
    alive but unreachable). An inbound connection is a peer's only once it said Hello for this
    generation; anything else from it just closes it.
    """

    worker: int
    addresses: list[str]
    generation: int
    on_frame: Callable[[PeerFrame], None] = field(default=lambda f: None)
    connect_timeout_s: float = 30.0
    failure_timeout_s: float = 6.0
    resumed: int = -1
    stopping: Callable[[], bool] = field(default=lambda: False)
    """Whether the worker is told to stop: a peer not reached yet is not waited for then."""
    failed: asyncio.Future[None] = field(init=False)
    _writers: dict[int, asyncio.StreamWriter] = field(default_factory=dict)
    _buffers: dict[int, list[bytes]] = field(default_factory=dict)
    _heard: dict[int, float] = field(default_factory=dict)
    _inbound: dict[asyncio.Task[None], asyncio.StreamWriter] = field(default_factory=dict)
    _server: asyncio.Server | None = None
    _keeping_alive: asyncio.Task[None] | None = None
    _closing: bool = False

    async def start(self) -> None:
        self.failed = asyncio.get_running_loop().create_future()
        host, port = split_address(self.addresses[self.worker])
        try:
            self._server = await asyncio.start_server(self._serve, host, port)
        except OSError as exc:
            address = self.addresses[self.worker]
            raise BindError.of(exc, address, Listener.PEERS, f"worker {self.worker}") from exc
        for other, address in enumerate(self.addresses):
            if other != self.worker:
                self._writers[other] = await self._connect(other, address)
                self.send(other, HelloFrame(self.generation, self.worker, self.resumed))
        await self.flush()
        self._heard = dict.fromkeys(self._writers, time.monotonic())  # a bound to say Hello
        self._keeping_alive = asyncio.create_task(self._keep_alive(), name="peer-heartbeats")
        logger.info("peers connected worker=%d peers=%d", self.worker, len(self._writers))

    async def _connect(self, other: int, address: str) -> asyncio.StreamWriter:
        """Connect to worker ``other``, retrying while it starts: until ``connect_timeout_s``,
        or at once when a peer was lost meanwhile (one that connected here, then went: the
        generation is over) or the worker is told to stop."""
        deadline = time.monotonic() + self.connect_timeout_s
        while True:
            try:
                _, writer = await asyncio.open_connection(*split_address(address))
                return writer
            except OSError as exc:
                if self.failed.done() and not self.failed.cancelled():
                    raise self.failed.exception() or exc from exc
                if self.stopping():
                    raise TransportError(
                        "stopped before a peer was reached", worker=other, address=address
                    ) from exc
                if time.monotonic() > deadline:
                    raise TransportError(
                        "cannot reach worker", worker=other, address=address
                    ) from exc
                await asyncio.sleep(0.05)

    def send(self, to: int, frame: Frame) -> None:
        self._buffers.setdefault(to, []).append(_framed(frame))

    def broadcast(self, frame: Frame) -> None:
        for other in self._writers:
            self.send(other, frame)

    async def flush(self) -> None:
        for to, chunks in self._buffers.items():
            if chunks:
                writer = self._writers[to]
                if writer.is_closing():  # lost already: uvloop would raise RuntimeError on write
                    raise TransportError("a peer went away", worker=to)
                writer.write(b"".join(chunks))
                chunks.clear()
                try:
                    await writer.drain()
                except ConnectionError as exc:
                    raise TransportError("a peer went away", worker=to) from exc

    async def _keep_alive(self) -> None:
        """Heart-beat every peer, and fail on a peer silent for longer than the bound.

        A round that comes late means this loop was blocked: the peers' frames may be waiting
        unread, so their silence is judged a round later, once the readers caught up.
        """
        interval = self.failure_timeout_s / 4
        beat = _framed(HeartbeatFrame(self.generation))
        last = time.monotonic()
        while True:
            await asyncio.sleep(interval)
            for writer in self._writers.values():
                if not writer.is_closing():
                    writer.write(beat)  # whole frames, between the engine's whole frames
            now = time.monotonic()
            late, last = now - last > 2 * interval, now
            bound = self.failure_timeout_s
            silent = [(p, now - t) for p, t in self._heard.items() if now - t > bound]
            if silent and not late:
                peer, seconds = silent[0]
                self._fail(TransportError("a peer has been silent", worker=self.worker,
                                          peer=peer, silent_s=round(seconds, 2)))  # fmt: skip
                return

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer: int | None = None
        task = asyncio.current_task()
        assert task is not None
        self._inbound[task] = writer
        try:
            hello = await asyncio.wait_for(_read(reader, _HELLO_BYTES), self.failure_timeout_s)
            if not isinstance(hello, HelloFrame) or hello.generation != self.generation:
                logger.info("not a peer of this generation, closed worker=%d", self.worker)
                return
            peer = hello.worker
            if hello.resumed != self.resumed:
                self._fail(TransportError("workers resumed from different snapshots",
                                          worker=self.worker, ssid=self.resumed, peer=peer,
                                          peer_ssid=hello.resumed))  # fmt: skip
                return
            while True:
                self._heard[peer] = time.monotonic()
                frame = await _read(reader)
                if frame.generation != self.generation:
                    continue  # a zombie of another generation
                if not isinstance(frame, HelloFrame | HeartbeatFrame):
                    self.on_frame(frame)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            if peer is not None and not self._closing:
                error = TransportError("a peer went away", worker=self.worker, peer=peer)
                self._fail(error, exc, level=logging.WARNING)  # or it stopped before this one
        except Exception as exc:  # any error handling a peer's frame fails this worker
            if peer is None:
                logger.info("not a peer, closed worker=%d: %r", self.worker, exc)
            elif not self._closing:
                error = TransportError("a frame from a peer could not be handled",
                                       worker=self.worker, peer=peer, error=repr(exc))  # fmt: skip
                self._fail(error, exc)
        finally:
            writer.close()
            del self._inbound[task]

    def _fail(
        self, error: TransportError, cause: BaseException | None = None, level: int = logging.ERROR
    ) -> None:
        error.__cause__ = cause
        logger.log(level, "peer lost: %s", error)
        if not self.failed.done():
            self.failed.set_exception(error)

    async def close(self) -> None:
        """Close connections; the peers' handlers end on EOF, nothing is cancelled mid-frame."""
        self._closing = True
        if self._keeping_alive is not None:
            self._keeping_alive.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeping_alive
        for writer in [*self._writers.values(), *self._inbound.values()]:
            writer.close()
        if self._server is not None:
            self._server.close()
        if self._inbound:  # they end on EOF now: none is left for the loop's end to cancel
            await asyncio.wait(list(self._inbound), timeout=self.failure_timeout_s)
        if not self.failed.done():
            self.failed.cancel()
        elif not self.failed.cancelled():
            self.failed.exception()  # retrieved: the worker is stopping because of it anyway


_HELLO_BYTES = 1024  # the most a connection may send before it said Hello


def _framed(frame: Frame) -> bytes:
    return framed(_encoder.encode(frame))


async def _read(reader: asyncio.StreamReader, limit: int | None = None) -> Frame:
    (length,) = LENGTH.unpack(await reader.readexactly(LENGTH.size))
    if limit is not None and length > limit:
        raise TransportError("frame too large", length=length, limit=limit)
    frame: Frame = _decoder.decode(await reader.readexactly(length))
    return frame
