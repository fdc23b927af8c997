"""The sequencer's Kafka shell around the pure :func:`epochal.log.ordering.order`.

One loop: consume input and request records until the epoch closes (``epoch_ms`` or
``max_records``), order them, and in **one Kafka transaction** append the epoch to the command
log, the dead letters to ``<app>.dlq`` and the consumed offsets to the sequencer's group. A crash
anywhere leaves either the whole epoch or nothing. An epoch is logged only when something was
consumed (an input record or a request, valid or dead, or a worker's tick): an idle app's log
does not grow.

Start, in this order (docs/concepts.md):

1. ``init_transactions`` under the stable transactional id fences an older sequencer and aborts
   its open transaction, so the tail read next is final;
2. the command log's **tail** (its last epoch, :meth:`KafkaCommandLog.tail`) gives the next
   epoch number, ``now`` (kept monotonic) and the full position vector of the input and requests
   partitions. The command log, not the consumer group, is the source of truth: group offsets
   are committed with each epoch for monitoring tools but never read (Kafka expires them). When
   retention trimmed the log back to a snapshot at its end, no epoch is left, and the latest
   snapshot's manifest row (``latest_snapshot``) gives the same three things, as they were after
   its epoch, the last one logged. A partition absent from the vector starts at its beginning; a
   logged position whose records were deleted is a LogTruncatedError (so is one deleted while
   running: the consumer runs with ``auto.offset.reset=error``);
3. the client request ids of the last ``request_id_window_ms`` are rebuilt from the requests
   topic, from ``offsets_for_times(now - window)`` up to the logged positions.

In weak recovery (``recovery="weak"``, docs/recovery.md) nothing is logged: the sequencer waits
for the workers on its epoch feed (:mod:`epochal.log.epoch_feed`), resumes from the snapshot
they resumed from (its epoch, time and input positions), and sends each epoch to them with its
dead letters. The sequencer writes none itself: after a rollback it re-sequences the records
after the snapshot, and would write their dead letters again. The workers hold them with the
epoch's egress and release them when a snapshot covers the epoch, exactly once
(``actors/egress.py``). Group offsets are not committed: the snapshot manifest holds the
positions.

Only records make dead letters: anything else that fails (Kafka down, fenced, a truncated log)
raises our error and ends the process; recovery takes over.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec
from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from epochal.config import SequencerConfig
from epochal.errors import ConfigError, LogError
from epochal.log.amendments import read_amendments
from epochal.log.client import FOREVER, KafkaClients, translate_kafka_error
from epochal.log.command_log import KafkaCommandLog, chunk_epoch
from epochal.log.epoch_feed import EpochFeedServer, FeedClosed, stopping_soon
from epochal.log.ordering import (
    EpochStamp,
    RequestWindow,
    Router,
    SequencedEpoch,
    order,
    position_key,
)
from epochal.log.snapshot_schedule import SnapshotSchedule
from epochal.log.topics import TopicNames
from epochal.metrics import Metrics, serve_metrics
from epochal.schemas.codec import decode
from epochal.schemas.commands import ClientRequest, DeadLetter, InputRecord
from epochal.schemas.egress import EgressFormat
from epochal.schemas.egress_codec import egress_codec
from epochal.schemas.snapshots import Manifest

if TYPE_CHECKING:  # exported by confluent_kafka.admin, but not declared so for type checkers
    from confluent_kafka.admin._metadata import ClusterMetadata

__all__ = ["Sequencer"]

logger = logging.getLogger(__name__)

_KAFKA_TIMEOUT_S = 30.0
_GROUP_OFFSETS_EVERY_S = 1.0
"""How often an epoch's transaction also commits the group's offsets: they are for monitoring
tools only, and with each of fifty epochs a second they were two of the transaction's five
requests to the broker (and a marker in its offsets topic)."""
_DISCOVERY_S = 5.0  # how often new topics named like inputs (or new partitions) are looked for
_DISCOVERY_TIMEOUT_S = 2.0
_FOREVER = {"retention.ms": str(FOREVER), "retention.bytes": str(FOREVER)}


@dataclass
class _State:
    """Where the sequencer stands: the next epoch, the log's clock, positions, request ids."""

    epoch: int
    now_ms: int
    positions: dict[str, int]
    window: RequestWindow

    def advance(self, sequenced: SequencedEpoch) -> None:
        """The epoch was committed: move past it, remember its request ids, forget old ones."""
        record = sequenced.record
        self.epoch, self.now_ms = record.epoch + 1, record.now_ms
        self.positions = dict(record.next_offsets)
        self.window.remember(sequenced.requests_seen, record.now_ms)
        self.window.prune(record.now_ms)


class Sequencer:
    """Orders the input topics of one app into the command log.

    ``latest_snapshot`` reads the app's latest snapshot (None: there is none, or no snapshots):
    where a command log that retention trimmed back to it goes on from.

    >>> Sequencer(config, clients, app, app.input_topics(), app.code_hash()).run(lambda: stopping)
    """

    def __init__(
        self,
        config: SequencerConfig,
        clients: KafkaClients,
        router: Router,
        inputs: list[str],
        code_hash: str,
        *,
        latest_snapshot: Callable[[], Manifest | None] = lambda: None,
        final_epoch: bool = False,
        egress_format: EgressFormat = EgressFormat.MSGPACK,
    ) -> None:
        self.config = config
        self.egress_format = egress_format  # the app's: how its dead letters are written
        self.encode_dead_letter = egress_codec(egress_format).dead_letter
        self.latest_snapshot = latest_snapshot
        self.skipped_inputs: frozenset[tuple[str, int, int]] = frozenset()  # weak: read at start
        self.clients = clients
        self.router = router
        self.names = TopicNames(config.app)
        self.inputs = list(inputs)  # full names: epochal's own and external ones
        self.code_hash = code_hash
        self.final_epoch = final_epoch  # a stop logs a final epoch (a savepoint): epochal run's
        self.schedule = SnapshotSchedule(config.snapshot_interval_ms, config.snapshot_every_epochs)
        self._assigned: set[tuple[str, int]] = set()  # the input partitions being read
        self.last_epoch = -1  # the last epoch logged (or sent) by this process
        self._offsets_committed_at = -_GROUP_OFFSETS_EVERY_S  # monotonic: the first epoch commits
        self.input_lag: dict[str, int] = {}  # "topic:partition" -> records not yet sequenced
        self.metrics = Metrics(app=config.app, role="sequencer")
        self.metrics.describe("epochal_epochs_total", "counter", "epochs logged")
        self.metrics.describe("epochal_sequenced_total", "counter", "transactions sequenced")
        self.metrics.describe("epochal_dead_letters_total", "counter", "records sent to the DLQ")
        self.metrics.describe("epochal_input_lag", "gauge", "input records not yet sequenced")
        self.metrics.describe("epochal_epoch_commit_seconds_sum", "counter", "Kafka commit time")
        self.metrics.describe("epochal_request_ids", "gauge", "client request ids remembered")
        self.metrics.describe(
            "epochal_resume_records", "gauge", "command-log records read on start"
        )

    @property
    def transaction_streams(self) -> list[str]:
        """The topics transactions come from: the inputs and the requests topic."""
        return [*self.inputs, self.names.requests]

    @property
    def external_inputs(self) -> list[str]:
        """The input topics that are not epochal's (``external_topic=``): never created,
        trimmed nor given another retention here."""
        return [topic for topic in self.inputs if not self.names.is_input(topic)]

    def streams(self, existing: Iterable[str]) -> list[str]:
        """The topics the sequencer reads: :attr:`transaction_streams`, and any other topic of
        ``existing`` named like an input (its records are dead letters: no transaction reads
        them)."""
        unread = sorted({t for t in existing if self.names.is_input(t)} - set(self.inputs))
        return [*self.transaction_streams, *unread]

    def ensure_topics(self, input_partitions: int = 1) -> None:
        """Create the app's topics if missing, and make sure they keep what recovery needs.

        The command log's retention is forever (epochal trims it back to the oldest snapshot
        kept); the input and requests topics get ``input_retention_ms`` (default forever). An
        existing topic that keeps less gets its retention raised, with a warning; none is ever
        lowered. An external input topic (``external_topic=``) is the user's: it must exist,
        and epochal changes nothing of it.
        """
        external = self.external_inputs
        if external:
            known = self.clients.admin().list_topics(timeout=_KAFKA_TIMEOUT_S).topics
            missing = [topic for topic in external if topic not in known]
            if missing:
                raise ConfigError(
                    f"input topic {missing[0]} does not exist: a transaction reads it as an "
                    "external_topic, which epochal never creates; create it (with the "
                    "partitions and retention you want) and start again",
                    topic=missing[0],
                )
        retention = self.config.input_retention_ms
        stream_config = {"retention.ms": str(retention), "retention.bytes": str(FOREVER)}
        streams = [topic for topic in self.transaction_streams if topic not in external]
        self.clients.create_topics(streams, partitions=input_partitions, config=stream_config)
        self.clients.create_topics([self.names.command_log], partitions=1, config=_FOREVER)
        self.clients.create_topics([self.names.dead_letters], partitions=1)
        self.clients.ensure_retention(streams, retention)
        self.clients.ensure_retention([self.names.command_log], FOREVER)

    def run(self, should_stop: Callable[[], bool]) -> None:
        """Sequence until ``should_stop()``; Kafka failures raise (LogError and subclasses)."""
        if self.config.metrics_port:
            serve_metrics(self.metrics, self.config.metrics_port, "the sequencer")
        feed: EpochFeedServer | None = None
        producer: Producer | None = None  # weak mode writes nothing to Kafka
        if self.config.recovery == "weak":
            feed = EpochFeedServer(self.config.feed, self.config.workers, self.config.generation)
            try:
                resumed = self._resume_from_workers(feed, should_stop)
            except BaseException:
                feed.close()
                raise
            if resumed is None:
                feed.close()
                return  # told to stop before every worker was there
            state = resumed
            self.skipped_inputs = read_amendments(self.clients, self.names.app).inputs
        else:
            producer = self._producer()  # fences an older sequencer: before anything is read
            state = self._resume()
        consumer = self._consumer(state.positions)  # checks the inputs still hold the positions
        try:
            self._remember_recent_requests(state)
            logger.info(
                "sequencer started app=%s next_epoch=%d positions=%d request_ids=%d",
                self.config.app, state.epoch, len(state.positions), len(state.window),
            )  # fmt: skip
            next_look = time.monotonic() + _DISCOVERY_S
            while not should_stop():
                if time.monotonic() >= next_look:
                    self._assign_new(consumer, state.positions)
                    next_look = time.monotonic() + _DISCOVERY_S
                records = self._collect(consumer)
                now_ms = max(state.now_ms, int(time.time() * 1000))
                if not records and not self.schedule.idle_due(now_ms):
                    continue  # nothing consumed, nothing logged (workers send ticks if need be)
                sequenced = self._order(state, records, now_ms)
                if feed is None:
                    assert producer is not None, "strong mode logs through its producer"
                    self._log(producer, consumer, sequenced)
                elif not self._send(feed, consumer, sequenced, should_stop):
                    return  # the workers stopped first: a clean stop
                state.advance(sequenced)
                self.schedule.logged(now_ms, sequenced.record.snapshot)
                self.metrics.set("epochal_request_ids", len(state.window))
            self._log_final(state, feed, producer, consumer)
        finally:
            consumer.close()
            _flush(producer)
            if feed is not None:
                feed.close()

    def _log_final(
        self,
        state: _State,
        feed: EpochFeedServer | None,
        producer: Producer | None,
        consumer: Consumer,
    ) -> None:
        """A clean stop: one last epoch, marked final and snapshot, with whatever was read
        already, so that the workers end on a snapshot and a start after it replays nothing.
        Only when asked (``final_epoch``: ``epochal run`` does)."""
        if not self.final_epoch:
            return
        now_ms = max(state.now_ms, int(time.time() * 1000))
        sequenced = self._order(state, self._collect(consumer), now_ms)
        record = msgspec.structs.replace(sequenced.record, snapshot=True, final=True)
        sequenced = dataclasses.replace(sequenced, record=record)
        if feed is None:
            assert producer is not None, "strong mode logs through its producer"
            self._log(producer, consumer, sequenced)
        elif not self._send(feed, consumer, sequenced, lambda: False):
            return
        logger.info("sequencer logged its final epoch epoch=%d", record.epoch)

    def _producer(self) -> Producer:
        try:
            return self.clients.fenced_producer(_KAFKA_TIMEOUT_S, **{
                "transactional.id": f"{self.config.app}.sequencer",
                "transaction.timeout.ms": self.config.transaction_timeout_ms,
                "linger.ms": 0,
            })  # fmt: skip
        except KafkaException as exc:
            raise translate_kafka_error(exc, "cannot start the sequencer's transactions",
                                        app=self.config.app) from exc  # fmt: skip

    def _resume(self) -> _State:
        """The state after the last logged epoch: from the command log's tail, never its start."""
        log = KafkaCommandLog(self.clients, self.names.command_log)
        tail = log.tail(self.latest_snapshot)
        self.metrics.set("epochal_resume_records", log.tail_records_read)
        window = RequestWindow(self.config.request_id_window_ms)
        if tail is None:
            return _State(0, 0, {}, window)
        return _State(tail.epoch + 1, tail.now_ms, dict(tail.positions), window)

    def _resume_from_workers(
        self, feed: EpochFeedServer, should_stop: Callable[[], bool]
    ) -> _State | None:
        """Weak mode: go on from the snapshot every worker resumed from (or the very start);
        None if told to stop first."""
        hello = feed.accept(self.config.feed_timeout_ms / 1000, should_stop)
        if hello is None:
            return None
        logger.info("workers on the epoch feed ssid=%d next_epoch=%d", hello.ssid,
                    hello.next_epoch)  # fmt: skip
        window = RequestWindow(self.config.request_id_window_ms)
        return _State(hello.next_epoch, hello.now_ms, dict(hello.positions), window)

    def _remember_recent_requests(self, state: _State) -> None:
        """Refill the window as it was when the last epoch closed: the request ids of the requests
        topic's records from ``now - window`` up to the logged positions (the requests topic is
        small next to the command log, which is never scanned)."""
        state.window.remember(self._recent_requests(state), state.now_ms)
        state.window.prune(state.now_ms)
        self.metrics.set("epochal_request_ids", len(state.window))

    def _recent_requests(self, state: _State) -> dict[str, int]:
        topic = self.names.requests
        ends = {int(key.rpartition(":")[2]): offset for key, offset in state.positions.items()
                if key.rpartition(":")[0] == topic}  # fmt: skip
        if not ends:
            return {}
        since = max(0, state.now_ms - self.config.request_id_window_ms)
        consumer = self.clients.consumer()
        try:
            starts = consumer.offsets_for_times(
                [TopicPartition(topic, p, since) for p in ends], timeout=_KAFKA_TIMEOUT_S
            )
        except KafkaException as exc:
            raise translate_kafka_error(exc, "cannot read recent requests", topic=topic) from exc
        finally:
            consumer.close()
        ranges = {tp.partition: (tp.offset, ends[tp.partition]) for tp in starts if tp.offset >= 0}
        seen: dict[str, int] = {}
        for message in self.clients.read_range(topic, ranges, "reading recent requests"):
            _note_request(seen, message)  # below the logged positions: sequenced already
        return seen

    def _consumer(self, positions: Mapping[str, int]) -> Consumer:
        """Assigned (never subscribed) at the logged positions, after checking the log has them."""
        consumer = self.clients.consumer(**{
            "group.id": f"{self.config.app}.sequencer",
            "isolation.level": "read_committed",
            "auto.offset.reset": "error",
        })  # fmt: skip
        try:
            metadata = consumer.list_topics(timeout=_KAFKA_TIMEOUT_S)
            for topic in self.transaction_streams:
                if topic not in metadata.topics or metadata.topics[topic].error is not None:
                    raise LogError("an input topic is missing", topic=topic)
            self._assigned = set()
            consumer.assign(self._unassigned(metadata, positions))
        except KafkaException as exc:
            consumer.close()
            raise translate_kafka_error(exc, "cannot assign the input partitions") from exc
        except BaseException:
            consumer.close()
            raise
        return consumer

    def _unassigned(
        self, metadata: ClusterMetadata, positions: Mapping[str, int]
    ) -> list[TopicPartition]:
        """The partitions of the streams in ``metadata`` not yet assigned, at their logged
        positions (the beginning for one never read); each is remembered as assigned."""
        assignment = []
        read = set(self.transaction_streams)
        for topic in self.streams(metadata.topics):
            if metadata.topics[topic].error is not None:
                continue
            partitions = sorted(metadata.topics[topic].partitions)
            new = [p for p in partitions if (topic, p) not in self._assigned]
            if topic not in read and len(new) == len(partitions):
                logger.warning("no transaction reads topic=%s: its records go to %s",
                               topic, self.names.dead_letters)  # fmt: skip
            for p in new:
                offset = positions.get(position_key(topic, p))
                if offset is not None:
                    self.clients.check_position(self._resume_failure(topic), topic, p, offset)
                assignment.append(TopicPartition(topic, p, OFFSET_BEGINNING
                                                 if offset is None else offset))  # fmt: skip
                self._assigned.add((topic, p))
        return assignment

    def _resume_failure(self, topic: str) -> str:
        """What a position an input no longer holds means: for an external topic, that its own
        retention (which epochal never changes) deleted what the latest snapshot needs."""
        if topic in self.external_inputs:
            return (
                "the sequencer cannot resume: the external topic's retention (its own: epochal "
                "never changes it) deleted records after the latest snapshot's position; keep "
                "them longer than the snapshot interval, or recover past them"
            )
        return "the sequencer cannot resume"

    def _assign_new(self, consumer: Consumer, positions: Mapping[str, int]) -> None:
        """Take in topics named like inputs (and partitions) created since the start; a broker
        that does not answer now is asked again at the next look."""
        try:
            metadata = consumer.list_topics(timeout=_DISCOVERY_TIMEOUT_S)
        except KafkaException:
            return
        new = self._unassigned(metadata, positions)
        if new:
            consumer.incremental_assign(new)

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
                    raise self.clients.consume_error(message, "consuming input failed")
            out.extend(batch)
        return out

    def _order(self, state: _State, messages: list[Message], now_ms: int) -> SequencedEpoch:
        inputs: list[InputRecord] = []
        requests: list[InputRecord] = []
        requests_topic = self.names.requests  # a property: not once per record
        for m in messages:
            kind, stamp_ms = m.timestamp()  # :func:`_timestamp_ms`, inline: once per record
            stamp_ms = -1 if kind == TIMESTAMP_NOT_AVAILABLE else stamp_ms
            record = InputRecord(m.topic() or "", m.partition() or 0, m.offset() or 0,
                                 m.value() or b"", m.key(), stamp_ms)  # fmt: skip
            (requests if record.topic == requests_topic else inputs).append(record)
        seed = int.from_bytes(os.urandom(8), "big") >> 1
        stamp = EpochStamp(state.epoch, now_ms, seed, self.code_hash, self.schedule.due(now_ms))
        return order(
            self.router, stamp, inputs, requests, sequenced_requests=state.window,
            positions=state.positions, dead_letter_bytes=self.config.dead_letter_max_bytes,
            skipped=self.skipped_inputs, egress_format=self.egress_format,
        )  # fmt: skip

    def _log(self, producer: Producer, consumer: Consumer, sequenced: SequencedEpoch) -> None:
        """One Kafka transaction: the epoch's chunks, its dead letters, and, once a second and
        at a final epoch, the group's offsets."""
        started = time.monotonic()
        record = sequenced.record
        positions = self._group_offsets(record.next_offsets)
        with_offsets = (
            record.final or started - self._offsets_committed_at >= _GROUP_OFFSETS_EVERY_S
        )
        try:
            producer.begin_transaction()
            for chunk in chunk_epoch(record, self.config.chunk_bytes):
                producer.produce(self.names.command_log, chunk)
            for dead in sequenced.dead:
                self._warn_dead(dead)
                producer.produce(
                    self.names.dead_letters, self.encode_dead_letter(dead), key=dead.key
                )
            if with_offsets:
                producer.send_offsets_to_transaction(
                    positions, consumer.consumer_group_metadata(), _KAFKA_TIMEOUT_S
                )
            producer.commit_transaction(_KAFKA_TIMEOUT_S)
        except KafkaException as exc:
            raise translate_kafka_error(exc, "cannot log the epoch", epoch=record.epoch) from exc
        except BufferError as exc:
            raise LogError(f"cannot log the epoch: {exc}", epoch=record.epoch) from exc
        if with_offsets:
            self._offsets_committed_at = started
        self._count(sequenced, started)
        self._measure_lag(consumer, positions)

    def _warn_dead(self, dead: DeadLetter) -> None:
        logger.warning(
            "dead letter topic=%s partition=%d offset=%d truncated=%s reason=%s",
            dead.topic, dead.partition, dead.offset, dead.truncated, dead.reason,
        )  # fmt: skip

    def _count(self, sequenced: SequencedEpoch, started: float) -> None:
        self.last_epoch = sequenced.record.epoch
        self.metrics.inc("epochal_epochs_total")
        self.metrics.inc("epochal_sequenced_total", len(sequenced.record.txns))
        self.metrics.inc("epochal_dead_letters_total", len(sequenced.dead))
        self.metrics.inc("epochal_epoch_commit_seconds_sum", time.monotonic() - started)

    def _send(
        self, feed: EpochFeedServer, consumer: Consumer, sequenced: SequencedEpoch,
        should_stop: Callable[[], bool],
    ) -> bool:  # fmt: skip
        """Weak mode: the epoch and its dead letters to every worker, which hold the dead
        letters until a snapshot covers the epoch; False if they are gone because the cluster
        stops."""
        started = time.monotonic()
        record = sequenced.record
        for dead in sequenced.dead:
            self._warn_dead(dead)
        try:
            if not feed.send(record, sequenced.dead, waiting=should_stop):
                return False
        except FeedClosed:
            if stopping_soon(should_stop):
                return False
            raise
        self._count(sequenced, started)
        self._measure_lag(consumer, self._group_offsets(record.next_offsets))
        return True

    def _group_offsets(self, next_offsets: Mapping[str, int]) -> list[TopicPartition]:
        """The positions to commit to the group: those of the topics read (a topic the app no
        longer reads keeps its position in the log, where it may be resumed later)."""
        streams = {topic for topic, _ in self._assigned}
        partitions = (_partition(key, offset) for key, offset in next_offsets.items())
        return [tp for tp in partitions if tp.topic in streams]

    def _measure_lag(self, consumer: Consumer, positions: list[TopicPartition]) -> None:
        lags = {}
        for tp in positions:
            _, high = consumer.get_watermark_offsets(tp, cached=True)
            lags[position_key(tp.topic, tp.partition)] = max(0, high - tp.offset)
        self.input_lag = lags  # replaced whole: the status thread reads it
        self.metrics.set("epochal_input_lag", sum(lags.values()))


def _flush(producer: Producer | None) -> None:
    """Flush on the way out (weak mode has no producer); a fenced producer raises here too, and
    the error that ended the loop is the one to report, not this one."""
    if producer is None:
        return
    try:
        producer.flush(5)
    except KafkaException as exc:
        logger.info("sequencer producer not flushed on exit: %s", exc)


def _partition(key: str, offset: int) -> TopicPartition:
    topic, _, partition = key.rpartition(":")
    return TopicPartition(topic, int(partition), offset)


def _note_request(seen: dict[str, int], message: Message) -> None:
    try:
        request = decode(message.value() or b"", ClientRequest)
    except Exception:  # a dead letter already, or never a request: not an id in use
        return
    if not request.is_tick:
        timestamp_ms = _timestamp_ms(message)
        seen[request.request_id] = max(seen.get(request.request_id, -1), timestamp_ms)


def _timestamp_ms(message: Message) -> int:
    kind, timestamp_ms = message.timestamp()
    return -1 if kind == TIMESTAMP_NOT_AVAILABLE else int(timestamp_ms)
