"""confluent-kafka clients built from one :class:`KafkaConfig`, and the map of their errors to ours.

librdkafka logs through a Python logger here (it is noisy on stderr otherwise), with repeats
folded (:class:`FoldRepeats`: a broker that is away makes every client log each failed
connection attempt, hundreds of lines a second in all). An AdminClient is
kept referenced until its futures resolve: dropping it early can leave the futures hanging.

A consumer that must never skip a record runs with ``auto.offset.reset=error``: a position the
log no longer holds (deleted by retention or ``delete_records``) becomes a
:class:`LogTruncatedError` naming topic, partition and the missing offsets, never a silent jump.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported, no __all__
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)
from confluent_kafka.cimpl import NewTopic

from epochal.config import KafkaConfig
from epochal.errors import BrokerUnavailableError, EpochalError, LogError, LogTruncatedError

__all__ = [
    "FOREVER",
    "FoldRepeats",
    "KafkaClients",
    "arrived",
    "translate_kafka_error",
    "truncated_error",
]

logger = logging.getLogger(__name__)


class FoldRepeats(logging.Filter):
    """Lets through the first librdkafka line of each facility and client, then one per
    ``window_s`` that says how many like it it stands for.

    librdkafka logs ``(facility, client name, text)``; while a broker is away each client logs a
    ``FAIL`` per connection attempt. With this filter an outage costs each client one line (a
    line a minute if it lasts).
    """

    def __init__(self, window_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.window_s = window_s
        self.clock = clock
        self._shown: dict[tuple[str, str], tuple[float, int]] = {}  # -> (shown at, folded since)

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if not (isinstance(args, tuple) and len(args) == 3):
            return True  # not a librdkafka line
        key, now = (str(args[0]), str(args[1])), self.clock()
        shown = self._shown.get(key)
        if shown is not None and now - shown[0] < self.window_s:
            self._shown[key] = (shown[0], shown[1] + 1)
            return False
        if len(self._shown) > 1000:  # forget clients long gone
            self._shown = {k: v for k, v in self._shown.items() if now - v[0] < self.window_s}
        self._shown[key] = (now, 0)
        if shown is not None and shown[1]:
            record.msg = f"{record.msg} (and %d like it in %.0f s)"
            record.args = (*args, shown[1], now - shown[0])
        return True


_librdkafka_logger = logging.getLogger("epochal.librdkafka")
_librdkafka_logger.addFilter(FoldRepeats())

_UNAVAILABLE = {
    KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError._TIMED_OUT,
    KafkaError._RESOLVE,
}
_OUT_OF_RANGE = {KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE}

FOREVER = -1  # retention.ms / retention.bytes: never delete


def translate_kafka_error(exc: KafkaException, what: str, **context: Any) -> LogError:
    """Our error for a confluent-kafka one: unavailable brokers get their own type."""
    error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
    reason = error.str() if error is not None else str(exc)
    if error is not None and error.code() in _UNAVAILABLE:
        return BrokerUnavailableError(f"{what}: Kafka is not reachable: {reason}", **context)
    return LogError(f"{what}: {reason}", **context)


_FENCE_ATTEMPT_S = 0.15  # an id takes ~60 ms on a local broker; librdkafka's retry, 500 ms
_FENCE_QUICK_ATTEMPTS = 4  # then one producer waits (a broker away is not asked by dozens)


class KafkaClients:
    """Makes producers, consumers and admin clients for one cluster.

    >>> clients = KafkaClients(KafkaConfig("127.0.0.1:9092"))
    >>> producer = clients.producer(**{"transactional.id": "bank.egress.0"})
    """

    def __init__(self, config: KafkaConfig) -> None:
        self.config = config
        self._deleter: tuple[int, AdminClient] | None = None  # delete_records's, and its pid
        self._deleter_lock = threading.Lock()

    def producer(self, **settings: Any) -> Producer:
        return Producer(self.config.client_settings(**settings), logger=_librdkafka_logger)

    def fenced_producer(self, timeout_s: float, **settings: Any) -> Producer:
        """A transactional producer whose ``init_transactions`` returned: it holds the
        transactional id, and the last incarnation's open transaction is aborted.

        When the broker is still aborting that transaction (CONCURRENT_TRANSACTIONS), or the
        first coordinator lookup went out on the bootstrap connection librdkafka then drops,
        librdkafka asks again after a fixed 500 ms, where the broker needs milliseconds: every
        restart waited it. So a producer without an id after :data:`_FENCE_ATTEMPT_S` is
        destroyed (it never began a transaction) and a new one asks at once, a few times; the
        last waits out what is left of ``timeout_s``. Raises KafkaException as
        init_transactions does."""
        deadline = time.monotonic() + timeout_s
        for _ in range(_FENCE_QUICK_ATTEMPTS):
            producer = self.producer(**settings)
            try:
                producer.init_transactions(_FENCE_ATTEMPT_S)
                return producer
            except KafkaException as exc:
                if not exc.args[0].retriable():  # out of time, with the last retriable error
                    raise
            del producer  # destroyed before its own retry could fence the next one
        producer = self.producer(**settings)
        producer.init_transactions(max(0.001, deadline - time.monotonic()))
        return producer

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

    def read_range(
        self,
        topic: str,
        ranges: Mapping[int, tuple[int, int]],
        what: str,
        committed: bool = True,
        stall_s: float = 30.0,
    ) -> Iterator[Message]:
        """The records of ``topic`` in ``{partition: (start, end)}`` (end not included), in
        offset order per partition.

        With ``committed``, aborted and open transactions are skipped, and an open one holds the
        read back until it resolves: a reader waiting more than ``stall_s`` for a partition to
        move on raises LogError (an unfenced zombie's transaction, say). A start the log no
        longer holds raises LogTruncatedError.
        """
        pending = {p: bounds for p, bounds in ranges.items() if bounds[0] < bounds[1]}
        if not pending:
            return
        settings = {"isolation.level": _isolation(committed), "auto.offset.reset": "error"}
        consumer = self.assigned_consumer(
            topic, {p: start for p, (start, _) in pending.items()}, **settings
        )
        deadline = time.monotonic() + stall_s
        try:
            while pending:
                messages = arrived(consumer, 1000, 0.2)
                for message in messages:
                    if message.error() is not None:
                        raise self.consume_error(message, what)
                    bounds = pending.get(message.partition() or 0)
                    if bounds is not None and (message.offset() or 0) < bounds[1]:
                        yield message
                positions = consumer.position([TopicPartition(topic, p) for p in pending])
                done = {tp.partition for tp in positions if tp.offset >= pending[tp.partition][1]}
                if messages or done:
                    deadline = time.monotonic() + stall_s
                pending = {p: b for p, b in pending.items() if p not in done}
                if pending and time.monotonic() > deadline:
                    raise LogError(f"{what}: the records stopped arriving", topic=topic,
                                   partitions=sorted(pending))  # fmt: skip
        finally:
            consumer.close()

    def end_offset(
        self, topic: str, partition: int = 0, timeout_s: float = 10.0, committed: bool = True
    ) -> int:
        """The offset the next record of a partition will get (see :meth:`watermarks`)."""
        return self.watermarks(topic, partition, timeout_s, committed)[1]

    def watermarks(
        self, topic: str, partition: int = 0, timeout_s: float = 10.0, committed: bool = True
    ) -> tuple[int, int]:
        """``(low, high)``: the first offset a partition still holds, and the next one it gives
        a reader. With ``committed`` that is its last stable offset, before any transaction
        still open (and a transaction's commit returns before the broker has written its
        markers, so the one a producer just committed may take a moment to count); without,
        its high watermark."""
        consumer = self.consumer(**{"isolation.level": _isolation(committed)})
        try:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=timeout_s
            )
        except KafkaException as exc:
            raise translate_kafka_error(
                exc, "cannot read watermarks", topic=topic, partition=partition
            ) from exc
        finally:
            consumer.close()
        return int(low), int(high)

    def check_position(self, what: str, topic: str, partition: int, position: int) -> None:
        """LogTruncatedError unless the partition still holds ``position`` onwards."""
        low, high = self.watermarks(topic, partition)
        if position < low or position > high:
            raise truncated_error(what, topic, partition, position=position, low=low, high=high)

    def consume_error(self, message: Message, what: str) -> EpochalError:
        """Our error for a consumer's error event: a position out of range is a truncated log
        (LogTruncatedError), anything else a LogError."""
        error = message.error()
        assert error is not None, "consume_error of a record without an error"
        topic, partition = message.topic() or "", message.partition() or 0
        if error.code() in _OUT_OF_RANGE and topic:
            low, high = self.watermarks(topic, partition)
            offset = message.offset() or 0
            return truncated_error(what, topic, partition, position=offset, low=low, high=high)
        return translate_kafka_error(KafkaException(error), what, topic=topic or None,
                                     partition=partition if topic else None)  # fmt: skip

    def delete_records(
        self, before: Mapping[tuple[str, int], int], timeout_s: float = 30.0
    ) -> None:
        """Delete every record of ``{(topic, partition): offset}`` below ``offset`` (epochal's
        own retention: logs are kept back to the oldest snapshot kept, no further)."""
        wanted = [TopicPartition(t, p, o) for (t, p), o in before.items() if o > 0]
        if not wanted:
            return
        futures = self._deleting_admin().delete_records(wanted, request_timeout=timeout_s)
        for tp, future in futures.items():
            try:
                future.result(timeout=timeout_s)
            except KafkaException as exc:
                raise translate_kafka_error(
                    exc, "cannot delete records", topic=tp.topic, partition=tp.partition,
                    before=tp.offset,
                ) from exc  # fmt: skip

    def _deleting_admin(self) -> AdminClient:
        """One admin client for :meth:`delete_records`, kept: retention deletes after every
        snapshot, and a client made each time cost a connection to the broker each second
        (milliseconds each, tens of them once the broker was churning). Made again in a
        forked process, where the parent's client has no threads."""
        with self._deleter_lock:
            if self._deleter is None or self._deleter[0] != os.getpid():
                self._deleter = (os.getpid(), self.admin())
            return self._deleter[1]

    def admin(self, **settings: Any) -> AdminClient:
        return AdminClient(self.config.client_settings(**settings), logger=_librdkafka_logger)

    def create_topics(
        self,
        names: Iterable[str],
        partitions: int = 1,
        timeout_s: float = 30.0,
        config: Mapping[str, str] | None = None,
    ) -> None:
        """Create topics (with topic ``config``) and wait for them; one that exists is fine."""
        topics = [
            NewTopic(
                name, num_partitions=partitions, replication_factor=1, config=dict(config or {})
            )
            for name in names
        ]
        if not topics:
            return  # librdkafka refuses an empty request (an app with no aborts_to topic)
        admin = self.admin()
        futures = admin.create_topics(topics, operation_timeout=timeout_s)
        for name, future in futures.items():
            try:
                future.result(timeout=timeout_s)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise translate_kafka_error(exc, "cannot create topic", topic=name) from exc
        self._wait_for_leaders(admin, list(futures), timeout_s)
        del admin  # only now: the futures have resolved

    @staticmethod
    def _wait_for_leaders(admin: AdminClient, names: list[str], timeout_s: float) -> None:
        """A created topic is usable once every partition has a leader: until then a watermark
        or metadata request for it fails with an unknown partition."""
        deadline = time.monotonic() + timeout_s
        pending = set(names)
        while pending:
            metadata = admin.list_topics(timeout=timeout_s)
            for name in list(pending):
                topic = metadata.topics.get(name)
                if (
                    topic is not None
                    and topic.error is None
                    and topic.partitions
                    and all(p.leader >= 0 for p in topic.partitions.values())
                ):
                    pending.discard(name)
            if pending and time.monotonic() > deadline:
                raise LogError("created topics have no leader in time", topics=sorted(pending))
            if pending:
                time.sleep(0.05)

    def ensure_retention(
        self,
        names: Iterable[str],
        retention_ms: int,
        retention_bytes: int = FOREVER,
        timeout_s: float = 30.0,
    ) -> list[str]:
        """Raise ``retention.ms``/``retention.bytes`` of topics that keep less (-1: forever).

        Never lowers a retention. Returns the topics it changed, each with a warning logged.
        """
        wanted = {"retention.ms": retention_ms, "retention.bytes": retention_bytes}
        admin = self.admin()
        described = admin.describe_configs(
            [ConfigResource(ResourceType.TOPIC, name) for name in names],
            request_timeout=timeout_s,
        )
        raises: dict[str, list[ConfigEntry]] = {}
        for resource, future in described.items():
            entries = self._result(future, timeout_s, "cannot read topic config", resource.name)
            for setting, value in wanted.items():
                current = int(entries[setting].value)
                if _keeps_less(current, value):
                    logger.warning(
                        "raising %s of topic %s from %d to %d: epochal needs these records "
                        "for recovery", setting, resource.name, current, value,
                    )  # fmt: skip
                    raises.setdefault(resource.name, []).append(
                        ConfigEntry(setting, str(value),
                                    incremental_operation=AlterConfigOpType.SET)
                    )  # fmt: skip
        if raises:
            altered = admin.incremental_alter_configs(
                [ConfigResource(ResourceType.TOPIC, n, incremental_configs=e)
                 for n, e in raises.items()],
                request_timeout=timeout_s,
            )  # fmt: skip
            for resource, future in altered.items():
                self._result(future, timeout_s, "cannot raise topic retention", resource.name)
        del admin  # only now: the futures have resolved
        return sorted(raises)

    @staticmethod
    def _result(future: Any, timeout_s: float, what: str, topic: str) -> Any:
        try:
            return future.result(timeout=timeout_s)
        except KafkaException as exc:
            raise translate_kafka_error(exc, what, topic=topic) from exc

    def wait_until_ready(self, timeout_s: float) -> None:
        """Block until the cluster answers a metadata request, or raise BrokerUnavailableError."""
        admin = self.admin()
        try:
            admin.list_topics(timeout=timeout_s)
        except KafkaException as exc:
            raise translate_kafka_error(
                exc, "no metadata answer", bootstrap=self.config.bootstrap_servers
            ) from exc


def arrived(consumer: Consumer, max_messages: int, timeout_s: float) -> list[Message]:
    """The messages that have arrived (up to ``max_messages``), or if none has, the first to
    arrive within ``timeout_s`` and what came with it. ``consume`` alone waits out its whole
    timeout for a full batch: every message of a quiet topic would wait it too."""
    messages = consumer.consume(num_messages=max_messages, timeout=0)
    if messages:
        return messages
    first = consumer.poll(timeout_s)
    return [] if first is None else [first, *consumer.consume(max_messages - 1, 0)]


def _isolation(committed: bool) -> str:
    return "read_committed" if committed else "read_uncommitted"


def _keeps_less(current: int, wanted: int) -> bool:
    """True if a retention of ``current`` deletes records that one of ``wanted`` keeps."""
    if current == FOREVER:
        return False
    return wanted == FOREVER or current < wanted


def truncated_error(
    what: str, topic: str, partition: int, *, position: int, low: int, high: int
) -> LogTruncatedError:
    """The error for a position a partition holding ``[low, high)`` no longer serves."""
    if position > high:  # the partition is shorter than the position: deleted and created again?
        return LogTruncatedError(
            f"{what}: the partition ends at {high}, before the position {position}",
            topic=topic, partition=partition, missing=f"{high}..{position - 1}",
        )  # fmt: skip
    missing = f"{position}..{low - 1}" if position < low else str(position)
    return LogTruncatedError(
        f"{what}: records were deleted before they were read",
        topic=topic, partition=partition, missing=missing,
    )  # fmt: skip
