"""The command log: epochs as the sequencer logged them, read back by workers and replay.

An epoch is encoded once and cut into chunks below the broker's ``max.message.bytes``; the last
chunk is marked ``final``. A reader buffers chunks and yields an epoch only once its final chunk
arrived, so a half-written epoch (a sequencer killed mid-transaction) is never acted on; with
``read_committed`` it is never even seen. The position of an epoch is the offset of its final
chunk: a consumer that commits ``position + 1`` resumes at the next epoch.

:class:`MemoryCommandLog` is the in-memory twin used by unit tests: same chunking, no Kafka.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import msgspec
from confluent_kafka import TopicPartition

from epochal.errors import LogError
from epochal.log.client import KafkaClients
from epochal.schemas.codec import decode, encode
from epochal.schemas.commands import EpochRecord

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
    """An epoch and the command-log position of its final chunk."""

    position: int
    record: EpochRecord


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
    """Reassembles epochs from chunks read in log order."""

    _parts: list[bytes] = field(default_factory=list)
    _epoch: int | None = None

    def add(self, position: int, value: bytes) -> LoggedEpoch | None:
        chunk = decode(value, EpochChunk)
        if chunk.index == 0:
            self._parts, self._epoch = [], chunk.epoch
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


class EpochPoller:
    """Polls the command log from a position; ``poll`` returns the epochs completed meanwhile."""

    def __init__(self, clients: KafkaClients, topic: str, start: int) -> None:
        self.topic = topic
        self._consumer = clients.assigned_consumer(
            topic, {0: start}, **{"isolation.level": "read_committed"}
        )
        self._assembler = EpochAssembler()

    def poll(self, timeout_s: float, max_chunks: int = 500) -> list[LoggedEpoch]:
        out = []
        for message in self._consumer.consume(num_messages=max_chunks, timeout=timeout_s):
            if message.error() is not None:
                raise LogError(
                    f"reading the command log failed: {message.error()}", topic=self.topic
                )
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
