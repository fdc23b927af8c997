"""Weak mode's path from the sequencer to the workers: epochs over TCP, no command log.

In weak recovery (docs/recovery.md) nothing is logged: the sequencer sends each epoch straight to
every worker, and the input topics are the only log. The workers connect to the sequencer and
say which snapshot they resumed from (:class:`FeedHello`); the sequencer waits for all of them,
checks they agree, and re-sequences the input from that snapshot's positions, numbering epochs
from the one after it. Each epoch travels with its dead letters (:class:`FedEpoch`), which the
workers hold with the epoch's egress until a snapshot covers it, so that the re-sequencing
after a rollback never writes one twice. Frames are a 4-byte length and msgpack. A worker
going away is the sequencer's error (the cluster rolls back); the sequencer going away is the
workers'.

A slow worker slows the sequencer (a send waits on a full socket): backpressure, not an
unbounded queue; the sequencer's loop keeps beating meanwhile, so waiting is not taken for a
hang.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable

import msgspec

from epochal.config import Listener
from epochal.errors import BindError, LogError
from epochal.log.command_log import LoggedEpoch
from epochal.schemas.commands import DeadLetter, EpochRecord

__all__ = ["EpochFeed", "EpochFeedServer", "FedEpoch", "FeedClosed", "FeedHello", "stopping_soon"]

_LENGTH = struct.Struct(">I")
_MAX_FRAME = 1 << 30
_WAIT_S = 0.1


class FeedClosed(LogError):
    """The sequencer closed the feed: it stopped (a clean stop, if this worker stops too) or
    failed."""


def stopping_soon(should_stop: Callable[[], bool], within_s: float = 2.0) -> bool:
    """Whether the process is told to stop within ``within_s``: on a clean stop every process
    gets SIGTERM, and the other end of the feed may close a moment before this one hears it."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if should_stop():
            return True
        time.sleep(0.02)
    return should_stop()


class FeedHello(msgspec.Struct, frozen=True, array_like=True):
    """A worker to the sequencer: who it is, and the snapshot it resumed from (-1: none), with the
    epoch, time and input positions to go on from."""

    generation: int
    worker: int
    ssid: int
    next_epoch: int
    now_ms: int
    positions: dict[str, int]


class FedEpoch(msgspec.Struct, frozen=True, array_like=True):
    """The sequencer to the workers: an epoch and its dead letters."""

    record: EpochRecord
    dead: tuple[DeadLetter, ...] = ()


def _frame(data: bytes) -> bytes:
    return _LENGTH.pack(len(data)) + data


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ConnectionError("closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class EpochFeedServer:
    """The sequencer's end: ``accept`` every worker, then ``send`` each epoch to all."""

    def __init__(self, address: str, workers: int, generation: int) -> None:
        host, _, port = address.rpartition(":")
        self.workers = workers
        self.generation = generation
        try:
            self._listener = socket.create_server((host, int(port)), reuse_port=False)
        except OSError as exc:
            raise BindError.of(exc, address, Listener.FEED, "the sequencer") from exc
        self._peers: dict[int, socket.socket] = {}

    def accept(
        self, timeout_s: float, stopping: Callable[[], bool] = lambda: False
    ) -> FeedHello | None:
        """Wait for every worker of this generation; the snapshot they all resumed from. None
        if ``stopping()`` became True first: a worker that cannot start is no reason to make
        the stop wait out the timeout."""
        deadline = time.monotonic() + timeout_s
        hellos: dict[int, FeedHello] = {}
        decoder = msgspec.msgpack.Decoder(FeedHello)
        while len(hellos) < self.workers:
            if stopping():
                return None
            self._listener.settimeout(max(0.01, min(_WAIT_S, deadline - time.monotonic())))
            try:
                conn, _ = self._listener.accept()
                conn.settimeout(max(0.01, deadline - time.monotonic()))
                (length,) = _LENGTH.unpack(_read_exactly(conn, _LENGTH.size))
                hello = decoder.decode(_read_exactly(conn, min(length, _MAX_FRAME)))
            except TimeoutError as exc:
                if time.monotonic() < deadline:
                    continue
                raise LogError("workers did not connect to the epoch feed in time",
                               connected=sorted(hellos), workers=self.workers) from exc  # fmt: skip
            except (OSError, msgspec.DecodeError, struct.error):
                continue  # not a worker, or one that went away: it will be missed in time
            if hello.generation != self.generation:
                conn.close()  # a zombie of another generation
                continue
            conn.settimeout(_WAIT_S)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._peers[hello.worker] = conn
            hellos[hello.worker] = hello
        if len({h.ssid for h in hellos.values()}) > 1:
            raise LogError("workers resumed from different snapshots",
                           ssids={w: h.ssid for w, h in hellos.items()})  # fmt: skip
        return hellos[min(hellos)]

    def send(
        self,
        record: EpochRecord,
        dead: tuple[DeadLetter, ...] = (),
        waiting: Callable[[], bool] = lambda: False,
    ) -> bool:
        """Send ``record`` and its ``dead`` letters to every worker. A worker busy with a
        backlog fills its socket: the send waits (backpressure), calling ``waiting()`` every
        ``_WAIT_S`` meanwhile so the sequencer's loop still counts as alive; if that returns
        True (stopping), False is returned."""
        data = _frame(msgspec.msgpack.encode(FedEpoch(record, dead)))
        for worker, conn in self._peers.items():
            view = memoryview(data)
            while view:
                try:
                    view = view[conn.send(view) :]
                except TimeoutError:
                    if waiting():
                        return False
                except OSError as exc:
                    raise FeedClosed("a worker left the epoch feed", worker=worker) from exc
        return True

    def close(self) -> None:
        for conn in self._peers.values():
            conn.close()
        self._listener.close()


class EpochFeed:
    """A worker's end: the same ``poll`` as the command log's poller; positions are epochs."""

    def __init__(self, address: str, hello: FeedHello, connect_timeout_s: float) -> None:
        host, _, port = address.rpartition(":")
        deadline = time.monotonic() + connect_timeout_s
        while True:
            try:
                self._sock = socket.create_connection((host, int(port)), timeout=1.0)
                break
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise LogError("cannot reach the sequencer's epoch feed",
                                   address=address) from exc  # fmt: skip
                time.sleep(0.05)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.sendall(_frame(msgspec.msgpack.encode(hello)))
        self._buffer = bytearray()
        self.drained = False  # the last poll took all the feed had sent
        self._decoder = msgspec.msgpack.Decoder(FedEpoch)

    def poll(self, timeout_s: float, max_epochs: int = 16) -> list[LoggedEpoch]:
        out: list[LoggedEpoch] = []
        self._sock.settimeout(timeout_s)
        while len(out) < max_epochs:
            fed = self._next_frame()
            if fed is None:
                try:
                    chunk = self._sock.recv(1 << 20)
                except (TimeoutError, BlockingIOError):
                    break
                except OSError as exc:
                    raise LogError("the epoch feed failed") from exc
                if not chunk:
                    if out:  # the epochs before the close (a stop's final one) still count
                        break
                    raise FeedClosed("the sequencer closed the epoch feed")
                self._buffer += chunk
                self._sock.settimeout(0.0 if out else timeout_s)
                continue
            out.append(LoggedEpoch(fed.record.epoch, fed.record, fed.dead))
        self.drained = len(out) < max_epochs
        return out

    def _next_frame(self) -> FedEpoch | None:
        if len(self._buffer) < _LENGTH.size:
            return None
        (length,) = _LENGTH.unpack_from(self._buffer)
        if len(self._buffer) < _LENGTH.size + length:
            return None
        data = bytes(self._buffer[_LENGTH.size : _LENGTH.size + length])
        del self._buffer[: _LENGTH.size + length]
        return self._decoder.decode(data)

    def close(self) -> None:
        self._sock.close()
