"""The sequencer's Kafka shell around the pure :func:`epochal.log.ordering.order`.

One loop: consume input and request records until the epoch closes (``epoch_ms`` or
``max_records``), order them, and in **one Kafka transaction** append the epoch to the command
log, the dead letters to ``<app>.dlq`` and the consumed offsets to the sequencer's group. A
crash anywhere leaves either the whole epoch or nothing; a restarted sequencer resumes from the
committed offsets, and its stable transactional id fences a zombie (DESIGN §2.4).

On start it reads the command log once: the next epoch number, ``now`` (kept monotonic) and the
idempotency keys of client requests already sequenced come from there.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_INVALID,
    Consumer,
    Message,
    Producer,
    TopicPartition,
)

from epochal.config import SequencerConfig
from epochal.errors import LogError
from epochal.log.client import KafkaClients
from epochal.log.command_log import KafkaCommandLog, chunk_epoch
from epochal.log.ordering import EpochStamp, Router, SequencedEpoch, order
from epochal.log.topics import TopicNames
from epochal.metrics import Metrics, serve_metrics
from epochal.schemas.codec import encode
from epochal.schemas.commands import InputRecord, Origin

__all__ = ["Sequencer"]

logger = logging.getLogger(__name__)


@dataclass
class _Resume:
    epoch: int = 0
    now_ms: int = 0
    request_ids: set[str] = field(default_factory=set)


class Sequencer:
    """Orders the input topics of one app into the command log.

    >>> Sequencer(config, clients, app, ["transfers"], app.code_hash()).run(lambda: stopping)
    """

    def __init__(
        self,
        config: SequencerConfig,
        clients: KafkaClients,
        router: Router,
        inputs: list[str],
        code_hash: str,
    ) -> None:
        self.config = config
        self.clients = clients
        self.router = router
        self.names = TopicNames(config.app)
        self.inputs = [self.names.input(name) for name in inputs]
        self.code_hash = code_hash
        self.metrics = Metrics(app=config.app, role="sequencer")
        self.metrics.describe("epochal_epochs_total", "counter", "epochs logged")
        self.metrics.describe("epochal_sequenced_total", "counter", "transactions sequenced")
        self.metrics.describe("epochal_dead_letters_total", "counter", "records sent to the DLQ")
        self.metrics.describe("epochal_input_lag", "gauge", "input records not yet sequenced")
        self.metrics.describe("epochal_epoch_commit_seconds_sum", "counter", "Kafka commit time")

    def ensure_topics(self, input_partitions: int = 1) -> None:
        """Create the app's topics if missing (input, requests, command log, dead letters)."""
        self.clients.create_topics([*self.inputs, self.names.requests], partitions=input_partitions)
        self.clients.create_topics([self.names.command_log, self.names.dead_letters], partitions=1)

    def run(self, should_stop: Callable[[], bool]) -> None:
        if self.config.metrics_port:
            serve_metrics(self.metrics, self.config.metrics_port)
        resume = self._resume()
        producer = self.clients.producer(**{
            "transactional.id": f"{self.config.app}.sequencer",
            "transaction.timeout.ms": self.config.transaction_timeout_ms,
            "linger.ms": 0,
        })  # fmt: skip
        producer.init_transactions(30)  # fences any earlier instance with this id
        consumer = self._consumer()
        logger.info("sequencer started app=%s next_epoch=%d", self.config.app, resume.epoch)
        last_logged = 0.0
        try:
            while not should_stop():
                records = self._collect(consumer)
                idle = time.monotonic() - last_logged < self.config.idle_epoch_ms / 1000
                if not records and idle:
                    continue
                sequenced = self._order(resume, records)
                self._log(producer, consumer, sequenced)
                last_logged = time.monotonic()
        finally:
            consumer.close()
            producer.flush(5)

    def _resume(self) -> _Resume:
        resume = _Resume()
        log = KafkaCommandLog(self.clients, self.names.command_log)
        for logged in log.epochs(to_end=True):
            resume.epoch = logged.record.epoch + 1
            resume.now_ms = logged.record.now_ms
            resume.request_ids.update(
                t.request_id for t in logged.record.txns if t.origin == Origin.CLIENT
            )
        return resume

    def _consumer(self) -> Consumer:
        consumer = self.clients.consumer(**{
            "group.id": f"{self.config.app}.sequencer",
            "isolation.level": "read_committed",
        })  # fmt: skip
        metadata = consumer.list_topics(timeout=10)
        partitions = [
            TopicPartition(topic, p)
            for topic in [*self.inputs, self.names.requests]
            for p in sorted(metadata.topics[topic].partitions)
        ]
        committed = consumer.committed(partitions, timeout=10)
        for tp in committed:
            if tp.offset == OFFSET_INVALID:
                tp.offset = OFFSET_BEGINNING
        consumer.assign(committed)
        return consumer

    def _collect(self, consumer: Consumer) -> list[Message]:
        deadline = time.monotonic() + self.config.epoch_ms / 1000
        out: list[Message] = []
        while len(out) < self.config.max_records:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            batch = consumer.consume(self.config.max_records - len(out), timeout=remaining)
            for message in batch:
                if message.error() is not None:
                    raise LogError(f"consuming input failed: {message.error()}")
            out.extend(batch)
        return out

    def _order(self, resume: _Resume, messages: list[Message]) -> SequencedEpoch:
        inputs: list[InputRecord] = []
        requests: list[InputRecord] = []
        for m in messages:
            record = InputRecord(m.topic() or "", m.partition() or 0, m.offset() or 0,
                                 m.value() or b"", m.key())  # fmt: skip
            (requests if record.topic == self.names.requests else inputs).append(record)
        resume.now_ms = max(resume.now_ms, int(time.time() * 1000))
        seed = int.from_bytes(os.urandom(8), "big") >> 1
        stamp = EpochStamp(resume.epoch, resume.now_ms, seed, self.code_hash)
        sequenced = order(self.router, stamp, inputs, requests, resume.request_ids)
        resume.epoch += 1
        resume.request_ids.update(
            t.request_id for t in sequenced.record.txns if t.origin == Origin.CLIENT
        )
        return sequenced

    def _log(self, producer: Producer, consumer: Consumer, sequenced: SequencedEpoch) -> None:
        started = time.monotonic()
        producer.begin_transaction()
        for chunk in chunk_epoch(sequenced.record, self.config.chunk_bytes):
            producer.produce(self.names.command_log, chunk)
        for dead in sequenced.dead:
            logger.warning(
                "dead letter topic=%s partition=%d offset=%d reason=%s",
                dead.topic, dead.partition, dead.offset, dead.reason,
            )  # fmt: skip
            producer.produce(self.names.dead_letters, encode(dead), key=dead.key)
        positions = [tp for tp in consumer.position(consumer.assignment()) if tp.offset >= 0]
        producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), 30)
        producer.commit_transaction(30)
        self.metrics.inc("epochal_epochs_total")
        self.metrics.inc("epochal_sequenced_total", len(sequenced.record.txns))
        self.metrics.inc("epochal_dead_letters_total", len(sequenced.dead))
        self.metrics.inc("epochal_epoch_commit_seconds_sum", time.monotonic() - started)
        lag = 0
        for tp in positions:
            _, high = consumer.get_watermark_offsets(tp, cached=True)
            lag += max(0, high - tp.offset)
        self.metrics.set("epochal_input_lag", lag)
