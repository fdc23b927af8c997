"""The real broker: msgpack records round-trip in order, and transactions isolate readers."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable

import msgspec
import pytest
from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from epochal.log.client import KafkaClients
from epochal.schemas.codec import decode, encode

pytestmark = pytest.mark.integration


class Reading(msgspec.Struct, frozen=True):
    sensor: str
    seq: int
    value: float


def _drain(consumer: Consumer, expected: int, timeout_s: float = 30.0) -> list[Message]:
    """Records until ``expected`` have come (or the deadline), then any extras within 1 s more.

    ``consume`` waits for its full batch or its timeout, so it is called with short timeouts.
    """
    out: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < expected and time.monotonic() < deadline:
        out.extend(consumer.consume(num_messages=expected - len(out), timeout=0.5))
    out.extend(consumer.consume(num_messages=10_000, timeout=1.0))
    for message in out:
        assert message.error() is None, message.error()
    return out


def _reader(kafka: KafkaClients, topic: str, partitions: int, isolation: str) -> Consumer:
    consumer = kafka.consumer(**{"isolation.level": isolation})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    return consumer


def test_10k_msgpack_records_come_back_exactly_and_in_order_per_partition(
    kafka: KafkaClients, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory(partitions=3)
    sent = [Reading(f"s{i % 7}", i, i * 0.5) for i in range(10_000)]
    producer = kafka.producer(**{"enable.idempotence": True, "linger.ms": 5})
    for reading in sent:
        producer.produce(topic, key=reading.sensor.encode(), value=encode(reading))
    assert producer.flush(30) == 0

    consumer = _reader(kafka, topic, 3, "read_committed")
    received = _drain(consumer, len(sent))
    consumer.close()

    decoded = [decode(m.value() or b"", Reading) for m in received]
    assert sorted(decoded, key=lambda r: r.seq) == sent  # exactly: nothing lost, nothing doubled
    per_partition: dict[int, list[Message]] = defaultdict(list)
    for message in received:
        per_partition[message.partition()].append(message)
    assert len(per_partition) == 3
    for messages in per_partition.values():
        seqs = [decode(m.value() or b"", Reading).seq for m in messages]
        assert seqs == sorted(seqs)  # each partition keeps produce order
        sensors = {decode(m.value() or b"", Reading).sensor for m in messages}
        for other in per_partition.values():  # one key lives in one partition
            if other is not messages:
                assert sensors.isdisjoint(decode(m.value() or b"", Reading).sensor for m in other)


def test_aborted_transaction_is_invisible_to_read_committed_and_committed_one_is_visible(
    kafka: KafkaClients, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory()
    producer = kafka.producer(
        **{"transactional.id": f"{topic}.tx", "transaction.timeout.ms": 10_000}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(50):
        producer.produce(topic, value=encode(Reading("aborted", i, 0.0)))
    producer.flush(30)
    producer.abort_transaction(30)
    producer.begin_transaction()
    for i in range(50):
        producer.produce(topic, value=encode(Reading("committed", i, 1.0)))
    producer.commit_transaction(30)

    committed = _reader(kafka, topic, 1, "read_committed")
    seen = [decode(m.value() or b"", Reading) for m in _drain(committed, 50)]
    committed.close()
    assert [r.sensor for r in seen] == ["committed"] * 50
    assert [r.seq for r in seen] == list(range(50))

    uncommitted = _reader(kafka, topic, 1, "read_uncommitted")
    everything = [decode(m.value() or b"", Reading).sensor for m in _drain(uncommitted, 100)]
    uncommitted.close()
    assert everything.count("aborted") == 50  # the aborted records were written, just hidden


def test_a_fenced_producer_aborts_the_zombies_open_transaction_and_the_zombie_cannot_commit(
    kafka: KafkaClients, topic_factory: Callable[..., str]
) -> None:
    """``fenced_producer`` replaces producers that wait out librdkafka's 500 ms retry: whatever
    it gave up on must not fence the one it returns, and the zombie's open transaction (a
    killed worker's) is aborted, never committed."""
    topic = topic_factory()
    settings = {"transactional.id": f"{topic}.tx", "transaction.timeout.ms": 10_000}
    for round_ in range(3):
        zombie = kafka.fenced_producer(30, **settings)
        zombie.begin_transaction()
        zombie.produce(topic, value=encode(Reading("zombie", round_, 0.0)))
        zombie.flush(30)
        fenced = kafka.fenced_producer(30, **settings)
        time.sleep(0.7)  # past librdkafka's own retry of a producer given up on
        fenced.begin_transaction()
        fenced.produce(topic, value=encode(Reading("fenced", round_, 1.0)))
        fenced.commit_transaction(30)  # raises if a later producer of the id fenced it
        with pytest.raises(KafkaException):
            zombie.commit_transaction(10)
    committed = _reader(kafka, topic, 1, "read_committed")
    seen = [decode(m.value() or b"", Reading) for m in _drain(committed, 3)]
    committed.close()
    assert [(r.sensor, r.seq) for r in seen] == [("fenced", 0), ("fenced", 1), ("fenced", 2)]


def test_retention_deletes_records_again_and_again_through_one_admin_client(
    kafka: KafkaClients, topic_factory: Callable[..., str]
) -> None:
    """Retention deletes after every snapshot: each call moves the low watermark, and the
    calls share one admin client (one made per call cost a broker connection each second)."""
    topic = topic_factory(partitions=1)
    clients = KafkaClients(kafka.config)
    producer = kafka.producer()
    for i in range(30):
        producer.produce(topic, value=encode(i))
    assert producer.flush(10) == 0
    admins = []
    for before in (10, 20, 25):
        clients.delete_records({(topic, 0): before})
        assert clients.watermarks(topic, 0, committed=False) == (before, 30)
        admins.append(clients._deleting_admin())
    assert all(admin is admins[0] for admin in admins)
