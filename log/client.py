"""confluent-kafka clients built from one :class:`KafkaConfig`, and the map of their errors to ours.

librdkafka logs through a Python logger here (it is noisy on stderr otherwise). An AdminClient is
kept referenced until its futures resolve: dropping it early can leave the futures hanging.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from epochal.config import KafkaConfig
from epochal.errors import BrokerUnavailableError, LogError

__all__ = ["KafkaClients", "translate_kafka_error"]

logger = logging.getLogger(__name__)
_librdkafka_logger = logging.getLogger("epochal.librdkafka")

_UNAVAILABLE = {
    KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError._TIMED_OUT,
    KafkaError._RESOLVE,
}


def translate_kafka_error(exc: KafkaException, what: str, **context: Any) -> LogError:
    """Our error for a confluent-kafka one: unavailable brokers get their own type."""
    error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
    reason = error.str() if error is not None else str(exc)
    if error is not None and error.code() in _UNAVAILABLE:
        return BrokerUnavailableError(f"{what}: Kafka is not reachable: {reason}", **context)
    return LogError(f"{what}: {reason}", **context)


class KafkaClients:
    """Makes producers, consumers and admin clients for one cluster.

    >>> clients = KafkaClients(KafkaConfig("127.0.0.1:9092"))
    >>> producer = clients.producer(**{"transactional.id": "bank.egress.0"})
    """

    def __init__(self, config: KafkaConfig) -> None:
        self.config = config

    def producer(self, **settings: Any) -> Producer:
        return Producer(self.config.client_settings(**settings), logger=_librdkafka_logger)

    def consumer(self, **settings: Any) -> Consumer:
        base: dict[str, Any] = {"group.id": "epochal", "enable.auto.commit": False}
        return Consumer(
            self.config.client_settings(**{**base, **settings}), logger=_librdkafka_logger
        )

    def assigned_consumer(self, topic: str, offsets: dict[int, int], **settings: Any) -> Consumer:
        """A consumer assigned (no group membership) to ``{partition: start offset}`` of a topic."""
        consumer = self.consumer(**settings)
        consumer.assign([TopicPartition(topic, p, offset) for p, offset in offsets.items()])
        return consumer

    def end_offset(self, topic: str, partition: int = 0, timeout_s: float = 10.0) -> int:
        """The offset the next record of a partition will get (its high watermark)."""
        consumer = self.consumer()
        try:
            _, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=timeout_s
            )
        except KafkaException as exc:
            raise translate_kafka_error(
                exc, "cannot read end offset", topic=topic, partition=partition
            ) from exc
        finally:
            consumer.close()
        return int(high)

    def admin(self, **settings: Any) -> AdminClient:
        return AdminClient(self.config.client_settings(**settings), logger=_librdkafka_logger)

    def create_topics(
        self, names: Iterable[str], partitions: int = 1, timeout_s: float = 30.0
    ) -> None:
        """Create topics and wait for them; a topic that already exists is fine."""
        admin = self.admin()
        futures = admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1) for name in names],
            operation_timeout=timeout_s,
        )
        for name, future in futures.items():
            try:
                future.result(timeout=timeout_s)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise translate_kafka_error(exc, "cannot create topic", topic=name) from exc
        del admin  # only now: the futures have resolved

    def wait_until_ready(self, timeout_s: float) -> None:
        """Block until the cluster answers a metadata request, or raise BrokerUnavailableError."""
        admin = self.admin()
        try:
            admin.list_topics(timeout=timeout_s)
        except KafkaException as exc:
            raise translate_kafka_error(
                exc, "no metadata answer", bootstrap=self.config.bootstrap_servers
            ) from exc
