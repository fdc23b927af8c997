"""The command log: epochs as the sequencer logged them, read back by workers and replay.

An epoch is encoded once and cut into chunks below the broker's ``max.message.bytes``; the last
chunk is marked ``final``. A reader buffers chunks and yields an epoch only once its final chunk
arrived, so a half-written epoch (a sequencer killed mid-transaction) is never acted on; with
``read_committed`` it is never even seen. The position of an epoch is the offset of its final
chunk: a consumer that commits ``position + 1`` resumes at the next epoch.

The topic's own retention is forever: epochal trims it back to the oldest snapshot kept
(:meth:`DeltaSnapshots.retain`), never further. Readers run
with ``auto.offset.reset=error``: a start below the log's first offset is a
:class:`LogTruncatedError`, never a silent jump. :meth:`KafkaCommandLog.last_epoch` reads only the
tail, backwards from the end in growing windows, so a restart costs the same whatever the log's
length.

:class:`MemoryCommandLog` is the in-memory twin used by unit tests: same chunking, no Kafka.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import msgspec
from confluent_kafka import TopicPartition

from epochal.errors import LogError, LogTruncatedError
from epochal.log.client import KafkaClients
from epochal.schemas.codec import decode, encode
from epochal.schemas.commands import DeadLetter, EpochRecord

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "EpochAssembler",
    "EpochPoller",
    "KafkaCommandLog",
    "LoggedEpoch",
    "MemoryCommandLog",
    "chunk_epoch",
]

DEFAULT_CHUNK_BYTES = 512 * 1024  # well below Kafka's default max.message.bytes (1 MiB)


class EpochChunk(msgspec.Struct, frozen=True, array_like=True):
    """A slice of one encoded epoch."""

    epoch: int
    index: int
    final: bool
    data: bytes


@dataclass(frozen=True)
class LoggedEpoch:
    """An epoch and the command-log position of its final chunk. ``dead``: in weak mode, the
    epoch's dead letters, which the feed carries to the workers to hold until a snapshot
    covers the epoch (the command log never holds them: in strong mode the sequencer writes
    them in the transaction that logs the epoch)."""

    position: int
    record: EpochRecord
    dead: tuple[DeadLetter, ...] = ()


def chunk_epoch(record: EpochRecord, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> list[bytes]:
    """The encoded chunks of one epoch, in order; the last one is final."""
    data = encode(record)
    pieces = [data[i : i + chunk_bytes] for i in range(0, len(data), chunk_bytes)] or [b""]
    return [
        encode(EpochChunk(record.epoch, i, i == len(pieces) - 1, piece))
        for i, piece in enumerate(pieces)
    ]


@dataclass
class EpochAssembler:
    """Reassembles epochs from chunks read in log order.

    ``from_middle``: reading starts anywhere (a tail window), so chunks before the first chunk 0
    belong to an epoch that began earlier and are skipped rather than an error.
    """

    from_middle: bool = False
    _parts: list[bytes] = field(default_factory=list)
    _epoch: int | None = None

    def add(self, position: int, value: bytes) -> LoggedEpoch | None:
        chunk = decode(value, EpochChunk)
        if chunk.index == 0:
            self._parts, self._epoch = [], chunk.epoch
        elif self._epoch is None and self.from_middle:
            return None
        elif chunk.epoch != self._epoch or chunk.index != len(self._parts):
            raise LogError(
                "command log chunk out of order", epoch=chunk.epoch, index=chunk.index,
                offset=position,
            )  # fmt: skip
        self._parts.append(chunk.data)
        if not chunk.final:
            return None
        record = decode(b"".join(self._parts), EpochRecord)
        self._parts, self._epoch = [], None
        return LoggedEpoch(position, record)


@dataclass
class MemoryCommandLog:
    """The in-memory twin: a list of chunks, offsets are list indexes."""

    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    chunks: list[bytes] = field(default_factory=list)

    def append(self, record: EpochRecord) -> int:
        """Append one epoch; returns its position."""
        self.chunks.extend(chunk_epoch(record, self.chunk_bytes))
        return len(self.chunks) - 1

    def epochs(self, start: int = 0) -> Iterator[LoggedEpoch]:
        assembler = EpochAssembler()
        for offset in range(start, len(self.chunks)):
            logged = assembler.add(offset, self.chunks[offset])
            if logged is not None:
                yield logged


_READER = {"isolation.level": "read_committed", "auto.offset.reset": "error"}


class EpochPoller:
    """Polls the command log from a position; ``poll`` returns the epochs completed meanwhile.

    A start the log no longer holds raises LogTruncatedError from ``poll``.
    """

    def __init__(self, clients: KafkaClients, topic: str, start: int) -> None:
        self.topic = topic
        self._clients = clients
        self._consumer = clients.assigned_consumer(topic, {0: start}, **_READER)
        self._assembler = EpochAssembler()

    def poll(self, timeout_s: float, max_chunks: int = 500) -> list[LoggedEpoch]:
        out = []
        for message in self._consumer.consume(num_messages=max_chunks, timeout=timeout_s):
            if message.error() is not None:
                raise self._clients.consume_error(message, "reading the command log failed")
            logged = self._assembler.add(message.offset() or 0, message.value() or b"")
            if logged is not None:
                out.append(logged)
        return out

    def position(self) -> int:
        (position,) = self._consumer.position([TopicPartition(self.topic, 0)])
        return int(position.offset)

    def close(self) -> None:
        self._consumer.close()


class KafkaCommandLog:
    """Reads the command log topic (one partition) with ``read_committed``.

    >>> for logged in KafkaCommandLog(clients, "bank.cmd").epochs(start=0, to_end=True): ...
    """

    def __init__(self, clients: KafkaClients, topic: str) -> None:
        self.clients = clients
        self.topic = topic
        self.tail_records_read = 0  # by the last ``last_epoch``: what a restart cost

    def last_epoch(self, first_window: int = 16, timeout_s: float = 30.0) -> LoggedEpoch | None:
        """The last complete epoch, or None if the log never held one.

        Reads backwards from the end in windows growing 4x (an epoch may span many chunks, and
        every Kafka transaction adds a marker offset) until one holds an epoch from its chunk 0
        to its final chunk. Raises LogTruncatedError when the records that held it were deleted
        (the log's first offset is above 0 and no complete epoch is left).
        """
        low, high = self.clients.watermarks(self.topic)
        self.tail_records_read = 0
        window = first_window
        while True:
            start = max(low, high - window)
            logged = self._last_in(start, high, timeout_s)
            if logged is not None:
                return logged
            if start == low:
                break
            window *= 4
        if low > 0:
            raise LogTruncatedError(
                "the command log's epochs were deleted: no epoch to resume from",
                topic=self.topic, partition=0, missing=f"0..{low - 1}",
            )  # fmt: skip
        return None

    def _last_in(self, start: int, end: int, timeout_s: float) -> LoggedEpoch | None:
        """The last complete epoch among the committed records of ``[start, end)``."""
        assembler, last = EpochAssembler(from_middle=True), None
        records = self.clients.read_range(
            self.topic, {0: (start, end)}, "reading the command log", stall_s=timeout_s
        )
        for message in records:
            self.tail_records_read += 1
            last = assembler.add(message.offset() or 0, message.value() or b"") or last
        return last

    def poller(self, start: int = 0) -> EpochPoller:
        return EpochPoller(self.clients, self.topic, start)

    def epochs(
        self,
        start: int = 0,
        to_end: bool = False,
        should_stop: Callable[[], bool] = lambda: False,
        poll_s: float = 0.1,
    ) -> Iterator[LoggedEpoch]:
        """Epochs from ``start``; with ``to_end`` only those committed when the call began."""
        end = self.clients.end_offset(self.topic) if to_end else None
        if end is not None and start >= end:
            return
        poller = self.poller(start)
        try:
            while not should_stop():
                if end is not None and poller.position() >= end:
                    return
                yield from poller.poll(poll_s)
        finally:
            poller.close()
