"""Exactly-once egress: one transactional producer per partition, positions that never expire.

Partition p produces under the stable transactional id ``<app>.egress.<p>``. Each of its Kafka
transactions holds its egress records and one :class:`EgressPosition` record (key
``writer:<p>``) on the compacted topic ``<app>.egress-positions``: the command-log position the
transaction covers. The position is exactly as durable as the egress it describes and, unlike a
consumer group's offsets, Kafka never expires it (docs/concepts.md). A restarted partition
replays silently up to its position and produces only after it; a zombie with the same id is
fenced by ``init_transactions``, which also aborts its open transaction. One transaction may span
many epochs: fewer commits, and egress is released when it commits (docs/recovery.md). In weak mode
partition 0's writer also releases the dead letters (``actors/egress.py``), under the same
positions.

Which partition reports a transaction depends on the partition count, so a change of it must
not change who is responsible for an output already decided: an :class:`EgressLayout` record
says since which position the current count applies (``actors/egress.py`` moves a cluster from
one layout to another).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from confluent_kafka import KafkaException, Producer

from epochal.errors import LogError
from epochal.log.client import KafkaClients, translate_kafka_error
from epochal.log.topics import TopicNames
from epochal.schemas.codec import decode, encode
from epochal.schemas.commands import PartitionId
from epochal.schemas.egress import EgressLayout, EgressPosition

__all__ = [
    "POSITIONS_TOPIC_CONFIG",
    "EgressState",
    "EgressWriter",
    "Staged",
    "commit_all",
    "ensure_positions_topic",
    "read_egress_state",
    "write_layout",
]

logger = logging.getLogger(__name__)

POSITIONS_TOPIC_CONFIG = {
    "cleanup.policy": "compact",  # the latest record per key, forever
    "min.cleanable.dirty.ratio": "0.1",
    "segment.ms": str(10 * 60 * 1000),  # compaction only cleans closed segments
}
_LAYOUT_KEY = b"layout"


def _writer_key(partition: int) -> bytes:
    return f"writer:{partition}".encode()


def ensure_positions_topic(clients: KafkaClients, app: str) -> None:
    clients.create_topics(
        [TopicNames(app).egress_positions], partitions=1, config=POSITIONS_TOPIC_CONFIG
    )


@dataclass(frozen=True)
class EgressState:
    """The layout in force and the latest position of every writer that ever committed."""

    layout: EgressLayout | None
    positions: dict[int, EgressPosition]

    def start(self, partition: int) -> int:
        """Where writer ``partition`` of the current layout resumes: nothing before it is due."""
        begin = self.layout.start if self.layout is not None else 0
        own = self.positions.get(partition)
        return max(begin, own.position if own is not None else 0)


def read_egress_state(
    clients: KafkaClients, app: str, committed: bool = True, timeout_s: float = 60.0
) -> EgressState:
    """Read ``<app>.egress-positions`` to its end: its high watermark.

    With ``committed`` (the default) only committed transactions count; a zombie's open
    transaction holds the read back until its writer is fenced or the transaction times out,
    so open (and fence) this process's writers first. The read must not stop at the last
    stable offset: another process's zombie (a worker killed mid-commit) holds that before the
    positions other writers committed after it, and a writer that missed its own would
    release again what it released.
    """
    topic = TopicNames(app).egress_positions
    layout: EgressLayout | None = None
    positions: dict[int, EgressPosition] = {}
    end = clients.end_offset(topic, committed=False)
    for message in clients.read_range(topic, {0: (0, end)}, "reading egress positions",
                                      committed, timeout_s):  # fmt: skip
        key, value = message.key(), message.value() or b""
        if key == _LAYOUT_KEY:
            layout = decode(value, EgressLayout)
        elif key is not None and key.startswith(b"writer:"):
            position = decode(value, EgressPosition)
            positions[position.partition] = position
    return EgressState(layout, positions)


def write_layout(clients: KafkaClients, app: str, layout: EgressLayout) -> None:
    """Record that egress is written by ``layout.partitions`` writers from ``layout.start`` on."""
    producer = clients.producer(**{"enable.idempotence": True, "acks": "all"})
    producer.produce(TopicNames(app).egress_positions, encode(layout), _LAYOUT_KEY)
    if producer.flush(30) != 0:
        raise LogError("cannot write the egress layout", app=app)
    logger.info("egress layout app=%s partitions=%d start=%d", app, layout.partitions, layout.start)


Staged = tuple[str, bytes, bytes | None]
"""One egress record staged for the next commit: topic, value, key."""


class EgressWriter:
    """Buffers one partition's egress records and commits them with the position they cover.

    >>> writer = EgressWriter(clients, "bank", partition=3, partitions=4, start=state.start(3))
    >>> writer.add("bank.out.receipts", value); writer.commit(next_position=42)
    """

    def __init__(
        self,
        clients: KafkaClients,
        app: str,
        partition: int,
        partitions: int,
        transaction_timeout_ms: int = 10_000,
        *,
        queue_records: int = 1_000_000,
    ) -> None:
        names = TopicNames(app)
        self.positions_topic = names.egress_positions
        self.partition = partition
        self.partitions = partitions
        self.transactional_id = f"{app}.egress.{partition}"
        try:  # fences the previous incarnation
            self._producer: Producer = clients.fenced_producer(30, **{
                "transactional.id": self.transactional_id,
                "transaction.timeout.ms": transaction_timeout_ms,
                "linger.ms": 5,
                "batch.size": 1_000_000,
                "queue.buffering.max.messages": queue_records,
            })  # fmt: skip
        except KafkaException as exc:
            raise translate_kafka_error(
                exc, "cannot start egress", transactional_id=self.transactional_id
            ) from exc
        self._pending: list[Staged] = []
        self.covered = 0  # set from read_egress_state once every writer of the process is open

    @property
    def pending(self) -> int:
        return len(self._pending)

    def add(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        self._pending.append((topic, value, key))

    def stage(self, records: list[Staged]) -> None:
        """:meth:`add` each of ``records``, in order."""
        self._pending.extend(records)

    def commit(self, next_position: int) -> None:
        """Produce what is pending and record ``next_position`` as covered, atomically."""
        self.commit_batch(self.take(), next_position)

    def take(self) -> list[Staged]:
        """The records staged so far, for :meth:`commit_batch`: records staged after this go
        in the next batch (the loop stages while a thread commits)."""
        batch, self._pending = self._pending, []
        return batch

    def commit_batch(self, batch: list[Staged], next_position: int) -> None:
        """Produce ``batch`` and record ``next_position`` as covered, in one Kafka transaction
        (blocks on Kafka: run it off an event loop)."""
        if next_position <= self.covered and not batch:
            return
        position = EgressPosition(self.partition, self.partitions, next_position)
        try:
            self._producer.begin_transaction()
            self._produce_all(batch)
            self._produce(self.positions_topic, encode(position), _writer_key(self.partition))
            self._producer.commit_transaction(60)
        except KafkaException as exc:
            raise translate_kafka_error(
                exc, "egress commit failed", transactional_id=self.transactional_id
            ) from exc
        self.covered = next_position

    def _produce_all(self, batch: list[Staged]) -> None:
        """Produce every record of ``batch`` in order: the producer's bound method called
        directly (not :meth:`_produce`, a Python call more per record), and :meth:`_produce`'s
        wait for the one that finds the local queue full."""
        produce = self._producer.produce
        for topic, value, key in batch:
            try:
                produce(topic, value, key)
            except BufferError:
                self._produce(topic, value, key)

    def _produce(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        """Produce, waiting for room when the local queue is full (a backlog drains, never
        fails: librdkafka's queue is bounded, a commit may hold more records than it)."""
        while True:
            try:
                self._producer.produce(topic, value, key)
                return
            except BufferError:
                self._producer.poll(0.05)

    def close(self) -> None:
        self._producer.flush(5)


def commit_all(writers: Mapping[PartitionId, EgressWriter], next_position: int) -> None:
    """Commit what each writer holds, recording ``next_position`` as released (blocks on
    Kafka: run it off an event loop)."""
    for writer in writers.values():
        writer.commit(next_position)
