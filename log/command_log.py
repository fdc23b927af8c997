"""The command log: epochs as the sequencer logged them, read back by workers and replay.

An epoch is encoded once and cut into chunks below the broker's ``max.message.bytes``; the last
chunk is marked ``final``. A reader buffers chunks and yields an epoch only once its final chunk
arrived, so a half-written epoch (a sequencer killed mid-transaction) is never acted on; with
``read_committed`` it is never even seen. The position of an epoch is the offset of its final
chunk: a consumer that commits ``position + 1`` resumes at the next epoch.

The topic's own retention is forever: epochal trims it back to the oldest snapshot kept
(:meth:`DeltaSnapshots.retain`), never further. Readers run
with ``auto.offset.reset=error``: a start below the log's first offset is a
:class:`LogTruncatedError`, never a silent jump. :meth:`KafkaCommandLog.tail` reads only the
tail, backwards from the end in growing windows, so a restart costs the same whatever the log's
length; when retention left no epoch (the oldest snapshot kept ends at the log's end), the latest
snapshot's manifest row says where the log stands.

:class:`MemoryCommandLog` is the in-memory twin used by unit tests: same chunking, no Kafka.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import msgspec
from confluent_kafka import TopicPartition

from epochal.errors import LogError, LogTruncatedError
from epochal.log.client import KafkaClients, arrived, truncated_error
from epochal.schemas.codec import decode, encode
from epochal.schemas.commands import DeadLetter, EpochRecord
from epochal.schemas.snapshots import Manifest

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "EpochAssembler",
    "EpochPoller",
    "KafkaCommandLog",
    "LogTail",
    "LoggedEpoch",
    "MemoryCommandLog",
    "chunk_epoch",
]

logger = logging.getLogger(__name__)

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
    them in the transaction that logs the epoch). ``logged``: the record's msgpack as the
    log holds it, kept for the snapshot's archive instead of the decoded record (a dozen
    objects a transaction, held for a whole snapshot interval); None where the record is not
    the logged one (amended, or fed in weak mode)."""

    position: int
    record: EpochRecord
    dead: tuple[DeadLetter, ...] = ()
    logged: bytes | None = None

    def msgpack(self) -> msgspec.Raw:
        """The record's msgpack: the logged bytes when it is the logged record."""
        return msgspec.Raw(self.logged if self.logged is not None else encode(self.record))


@dataclass(frozen=True)
class LogTail:
    """Where the command log stands: its last epoch, that epoch's clock and the input positions
    after it (what a sequencer goes on from)."""

    epoch: int
    now_ms: int
    positions: Mapping[str, int]


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
        logged = b"".join(self._parts)
        self._parts, self._epoch = [], None
        return LoggedEpoch(position, decode(logged, EpochRecord), logged=logged)


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


_READER = {
    "isolation.level": "read_committed",
    "auto.offset.reset": "error",
    # librdkafka prefetches up to 64 MB by default: a worker behind the sequencer (any drain)
    # held that much more memory; 4 MB is still eight full chunks ahead. With the queue full,
    # librdkafka waits fetch.queue.backoff.ms (1 s by default) before it fetches again: a
    # worker drains 4 MB in about a second, so it would wait on the log
    "queued.max.messages.kbytes": 4096,
    "fetch.queue.backoff.ms": 20,
}


class EpochPoller:
    """Polls the command log from a position; ``poll`` returns the epochs completed meanwhile.

    A start the log no longer holds raises LogTruncatedError from ``poll``.
    """

    def __init__(self, clients: KafkaClients, topic: str, start: int) -> None:
        self.topic = topic
        self._clients = clients
        self._consumer = clients.assigned_consumer(topic, {0: start}, **_READER)
        self._assembler = EpochAssembler()
        self.drained = False  # the last poll read all the log held then

    def poll(self, timeout_s: float, max_chunks: int = 500) -> list[LoggedEpoch]:
        """The epochs the chunks that have arrived complete (:func:`arrived`)."""
        messages = arrived(self._consumer, max_chunks, timeout_s)
        self.drained = len(messages) < max_chunks
        out = []
        for message in messages:
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

    def tail(self, latest_snapshot: Callable[[], Manifest | None]) -> LogTail | None:
        """Where the log stands, or None for a new app's log (nothing logged, nothing deleted).

        Its last epoch when it holds one (:meth:`last_epoch`). Retention trims the log back to
        the oldest snapshot kept, so when that snapshot ends at the log's end (an idle stop with
        one snapshot kept, or a young app's only snapshot) no epoch is left: then the latest
        snapshot (``latest_snapshot()``, read only then) says where the log stood after its
        epoch, the last one logged. A log whose epochs were deleted past what the latest snapshot
        covers, or with no snapshot, is a LogTruncatedError naming the offsets missing. (The
        workers may go on trimming while a restarted sequencer reads: a read the trim overtook
        is read again.)
        """
        while True:
            low, high = self.clients.watermarks(self.topic)
            try:
                last = self._last_epoch(low, high)
                break
            except LogTruncatedError:
                if self.clients.watermarks(self.topic)[0] == low:
                    raise
                # retention trimmed the log while it was read (a snapshot committed): again
        if last is not None:
            record = last.record
            return LogTail(record.epoch, record.now_ms, record.next_offsets)
        if low == 0:
            return None
        snapshot = latest_snapshot()
        if snapshot is None or snapshot.recovery != "strong":  # weak: positions of no log
            raise LogTruncatedError(
                "the command log's epochs were deleted: no epoch to resume from",
                topic=self.topic, partition=0, missing=f"0..{low - 1}",
            )  # fmt: skip
        position = snapshot.command_log_position
        if not low <= position <= high:  # the records after the snapshot, or before, are gone
            what = "the command log no longer goes on from the latest snapshot"
            raise truncated_error(what, self.topic, 0, position=position, low=low, high=high)
        what = "command log trimmed back to the latest snapshot, going on from it"
        logger.info("%s topic=%s ssid=%d position=%d", what, self.topic, snapshot.ssid, position)
        return LogTail(snapshot.epoch, snapshot.time_ms, snapshot.input_positions)

    def last_epoch(self, first_window: int = 16, timeout_s: float = 30.0) -> LoggedEpoch | None:
        """The last complete epoch, or None if the log holds none (never did, or retention
        trimmed it back to a snapshot at its end: :meth:`tail` tells the two apart)."""
        low, high = self.clients.watermarks(self.topic)
        return self._last_epoch(low, high, first_window, timeout_s)

    def _last_epoch(
        self, low: int, high: int, first_window: int = 16, timeout_s: float = 30.0
    ) -> LoggedEpoch | None:
        """Reads ``[low, high)`` backwards from the end in windows growing 4x (an epoch may span
        many chunks, and every Kafka transaction adds a marker offset) until one holds an epoch
        from its chunk 0 to its final chunk."""
        self.tail_records_read = 0
        window = first_window
        while True:
            start = max(low, high - window)
            logged = self._last_in(start, high, timeout_s)
            if logged is not None:
                return logged
            if start == low:
                return None
            window *= 4

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
