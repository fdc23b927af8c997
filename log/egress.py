"""Exactly-once egress: one transactional producer per partition.

Partition p produces under the stable transactional id ``<app>.egress.<p>`` and commits, in the
same Kafka transaction, the command-log position it has covered (as the offset of the group
``<app>.egress.<p>``). A restarted partition replays silently up to that position and produces
only after it; a zombie with the same id is fenced by ``init_transactions``. One transaction may
span many epochs: fewer commits, and egress is released when it commits (DESIGN §2.4, §2.6).
"""

from __future__ import annotations

import logging

from confluent_kafka import OFFSET_INVALID, KafkaException, TopicPartition

from epochal.log.client import KafkaClients, translate_kafka_error
from epochal.log.topics import TopicNames

__all__ = ["EgressWriter"]

logger = logging.getLogger(__name__)


class EgressWriter:
    """Buffers one partition's egress records and commits them with the position they cover.

    >>> writer = EgressWriter(clients, "bank", partition=3)
    >>> writer.add("bank.out.receipts", value); writer.commit(next_position=42)
    """

    def __init__(
        self, clients: KafkaClients, app: str, partition: int, transaction_timeout_ms: int = 10_000
    ) -> None:
        names = TopicNames(app)
        self.command_log = names.command_log
        self.group = f"{app}.egress.{partition}"
        self._consumer = clients.consumer(**{"group.id": self.group})
        self._producer = clients.producer(**{
            "transactional.id": self.group,
            "transaction.timeout.ms": transaction_timeout_ms,
            "linger.ms": 5,
        })  # fmt: skip
        try:
            self._producer.init_transactions(30)  # fences the previous incarnation
        except KafkaException as exc:
            raise translate_kafka_error(exc, "cannot start egress", group=self.group) from exc
        self._pending: list[tuple[str, bytes]] = []
        self.covered = self._committed()

    def _committed(self) -> int:
        """The command-log position this partition's egress already covers."""
        (tp,) = self._consumer.committed([TopicPartition(self.command_log, 0)], timeout=10)
        return 0 if tp.offset == OFFSET_INVALID else int(tp.offset)

    def add(self, topic: str, value: bytes) -> None:
        self._pending.append((topic, value))

    def commit(self, next_position: int) -> None:
        """Produce what is pending and record ``next_position`` as covered, atomically."""
        if next_position <= self.covered and not self._pending:
            return
        try:
            self._producer.begin_transaction()
            for topic, value in self._pending:
                self._producer.produce(topic, value)
            offsets = [TopicPartition(self.command_log, 0, next_position)]
            metadata = self._consumer.consumer_group_metadata()
            self._producer.send_offsets_to_transaction(offsets, metadata, 30)
            self._producer.commit_transaction(30)
        except KafkaException as exc:
            raise translate_kafka_error(exc, "egress commit failed", group=self.group) from exc
        self._pending.clear()
        self.covered = next_position

    def close(self) -> None:
        self._producer.flush(5)
        self._consumer.close()
