"""Amendments: what operators and deploys change about epochs already in the command log.

The command log is append-only and written by the sequencer alone; two decisions come later and
from elsewhere, and must hold for every reader of the log, in every generation:

- ``epochal skip`` sends one poison transaction to the dead-letter topic instead of running it;
- a deploy whose code differs from the code that logged the epochs after the latest snapshot
  runs them under the new code when none of their egress was released (``epochal/deploy.py``).

Both are :class:`~epochal.schemas.commands.Amendment` records on the compacted topic
``<app>.amendments`` (one record per amendment key: writing one twice changes nothing). A reader
reads the whole topic once before it reads the log (it holds a handful of records) and applies
them to each epoch as it reads it: :meth:`Amendments.apply` fills in ``EpochRecord.skipped`` and
replaces ``code_hash``. An amendment written after a reader started counts from its next start:
the cluster that could not get past the epoch is rolled back meanwhile.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import msgspec

from epochal.errors import LogError
from epochal.log.client import KafkaClients
from epochal.log.command_log import LoggedEpoch
from epochal.log.egress import POSITIONS_TOPIC_CONFIG
from epochal.log.topics import TopicNames
from epochal.schemas.codec import decode, encode
from epochal.schemas.commands import (
    SKIPPED_REASON,
    Amendment,
    AmendmentKind,
    DeadLetter,
    EpochRecord,
)

__all__ = [
    "AMENDMENTS_TOPIC_CONFIG",
    "Amendments",
    "append_amendment",
    "ensure_amendments_topic",
    "read_amendments",
    "skipped_dead_letters",
]

logger = logging.getLogger(__name__)

AMENDMENTS_TOPIC_CONFIG = POSITIONS_TOPIC_CONFIG  # compacted like it: the latest per key, forever


@dataclass(frozen=True)
class Amendments:
    """The amendments of one app, ready to apply to epochs as they are read."""

    skips: dict[int, dict[int, Amendment]] = field(default_factory=dict)  # epoch → seq → it
    recodes: tuple[Amendment, ...] = ()  # in the order written: a later one wins
    inputs: frozenset[tuple[str, int, int]] = frozenset()  # (topic, partition, offset) skipped

    @classmethod
    def of(cls, amendments: Iterable[Amendment]) -> Amendments:
        skips: dict[int, dict[int, Amendment]] = {}
        recodes = []
        inputs = set()
        for amendment in amendments:
            if amendment.kind is AmendmentKind.SKIP:
                skips.setdefault(amendment.first_epoch, {})[amendment.seq] = amendment
            elif amendment.kind is AmendmentKind.SKIP_INPUT:
                inputs.add((amendment.topic, amendment.partition, amendment.offset))
            else:
                recodes.append(amendment)
        return cls(skips, tuple(recodes), frozenset(inputs))

    def __bool__(self) -> bool:
        return bool(self.skips or self.recodes or self.inputs)

    def code_hash(self, record: EpochRecord) -> str:
        """The code an epoch runs under: the last deploy that re-coded it, else its logger's."""
        for recode in reversed(self.recodes):
            if recode.first_epoch <= record.epoch <= recode.last_epoch:
                return recode.code_hash
        return record.code_hash

    def skipped(self, epoch: int, seq: int) -> bool:
        return seq in self.skips.get(epoch, {})

    def amend(self, logged: LoggedEpoch) -> LoggedEpoch:
        """:meth:`apply` to an epoch read from the log, keeping its position."""
        record = self.apply(logged.record)
        return logged if record is logged.record else replace(logged, record=record, logged=None)

    def apply(self, record: EpochRecord) -> EpochRecord:
        """The epoch as every executor must run it (the same object when nothing amends it)."""
        if not self:
            return record
        code_hash = self.code_hash(record)
        skips = self.skips.get(record.epoch)
        if code_hash == record.code_hash and not skips:
            return record
        skipped = {seq: SKIPPED_REASON for seq in skips or ()}
        recoded = record.recoded or code_hash != record.code_hash
        return msgspec.structs.replace(
            record, code_hash=code_hash, skipped=skipped, recoded=recoded
        )


def read_amendments(clients: KafkaClients, app: str) -> Amendments:
    """Every amendment of ``app`` (none if its topic does not exist: an app that never had one,
    or last ran before epochal had them)."""
    topic = TopicNames(app).amendments
    admin = clients.admin()  # all topics: asking for one by name may auto-create it
    if topic not in admin.list_topics(timeout=30).topics:
        return Amendments()
    end = clients.end_offset(topic)
    latest: dict[bytes, Amendment] = {}
    for message in clients.read_range(topic, {0: (0, end)}, "reading amendments"):
        key = message.key()
        if key is not None:
            latest[key] = decode(message.value() or b"", Amendment)
    return Amendments.of(latest.values())


def ensure_amendments_topic(clients: KafkaClients, app: str) -> None:
    clients.create_topics(
        [TopicNames(app).amendments], partitions=1, config=AMENDMENTS_TOPIC_CONFIG
    )


def append_amendment(clients: KafkaClients, app: str, amendment: Amendment) -> None:
    """Write one amendment durably (the topic is created if needed)."""
    ensure_amendments_topic(clients, app)
    producer = clients.producer(**{"enable.idempotence": True, "acks": "all"})
    producer.produce(TopicNames(app).amendments, encode(amendment), amendment.key)
    if producer.flush(30) != 0:
        raise LogError("cannot write the amendment", app=app, amendment=amendment.key.decode())
    logger.info("amendment recorded app=%s %s", app, amendment.key.decode())


def skipped_dead_letters(record: EpochRecord) -> list[DeadLetter]:
    """The dead letters of the transactions an operator skipped in one (amended) epoch: each
    names where its input was read (nothing, for an interior transaction) and carries the
    logged event."""
    if not record.skipped:
        return []
    return [
        DeadLetter(
            record.skipped[txn.seq],
            txn.source.topic if txn.source else "",
            txn.source.partition if txn.source else -1,
            txn.source.offset if txn.source else -1,
            txn.event,
            size=len(txn.event),
        )
        for txn in record.txns
        if txn.seq in record.skipped
    ]
