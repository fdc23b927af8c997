"""The pure core of the sequencer: one batch of input records in, one ordered epoch out.

No I/O, no clock, no randomness of its own: the shell passes ``now_ms`` and ``seed`` and logs them.

The order of an epoch (its tie-break rule across input partitions):

1. border transactions, by ``(topic, partition, offset)`` of their records, so every input
   partition keeps its order;
2. then client transactions, by ``(partition, offset)`` on the requests topic; a request whose
   idempotency key was already sequenced (in this batch or, as the shell says, before) is dropped.

``seq`` is dense from 0. Records that cannot become transactions (undecodable, invalid, an unknown
event type, no transaction for the topic, a failing key function) go to the dead letters with the
reason, never into the epoch. Offsets of every record read, dead or not, advance ``next_offsets``.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from dataclasses import dataclass
from typing import Protocol

from epochal.errors import SchemaError
from epochal.schemas.codec import decode
from epochal.schemas.commands import (
    ClientRequest,
    CommandTxn,
    DeadLetter,
    EpochRecord,
    InputPosition,
    InputRecord,
    KeyRef,
    Origin,
)

__all__ = ["EpochStamp", "Routed", "Router", "SequencedEpoch", "order"]


@dataclass(frozen=True)
class EpochStamp:
    """What the shell fixes for an epoch before ordering it: number, time, seed, code hash."""

    epoch: int
    now_ms: int
    seed: int
    code_hash: str


@dataclass(frozen=True)
class Routed:
    """A valid record: the handler it invokes, its event as msgpack, its declared keys."""

    handler: str
    event: bytes
    keys: tuple[KeyRef, ...]


class Router(Protocol):
    """What the sequencer needs of the application; raises SchemaError with the reason."""

    def route(self, topic: str, value: bytes) -> Routed: ...

    def route_request(self, handler: str, event: bytes) -> Routed: ...


@dataclass(frozen=True)
class SequencedEpoch:
    """The epoch to log, and what goes to the dead-letter topic in the same Kafka transaction."""

    record: EpochRecord
    dead: tuple[DeadLetter, ...]


def _dead(record: InputRecord, reason: str) -> DeadLetter:
    return DeadLetter(
        reason, record.topic, record.partition, record.offset, record.value, record.key
    )


def order(
    router: Router,
    stamp: EpochStamp,
    inputs: Sequence[InputRecord],
    requests: Sequence[InputRecord] = (),
    sequenced_requests: Container[str] = frozenset(),
) -> SequencedEpoch:
    """Order one batch into epoch ``stamp.epoch``; see the module docstring for the rule."""
    txns: list[CommandTxn] = []
    dead: list[DeadLetter] = []
    next_offsets: dict[str, int] = {}
    for record in sorted(inputs, key=lambda r: (r.topic, r.partition, r.offset)):
        _advance(next_offsets, record)
        try:
            routed = router.route(record.topic, record.value)
        except SchemaError as exc:
            dead.append(_dead(record, str(exc)))
            continue
        source = InputPosition(record.topic, record.partition, record.offset)
        txns.append(
            CommandTxn(len(txns), routed.handler, routed.event, routed.keys, Origin.BORDER, source)
        )
    seen: set[str] = set()
    for record in sorted(requests, key=lambda r: (r.partition, r.offset)):
        _advance(next_offsets, record)
        try:
            request = decode(record.value, ClientRequest)
            if request.request_id in seen or request.request_id in sequenced_requests:
                continue  # a retried request: it was sequenced once already
            routed = router.route_request(request.handler, request.event)
        except SchemaError as exc:
            dead.append(_dead(record, str(exc)))
            continue
        seen.add(request.request_id)
        source = InputPosition(record.topic, record.partition, record.offset)
        txns.append(
            CommandTxn(
                len(txns), routed.handler, routed.event, routed.keys,
                Origin.CLIENT, source, request.request_id,
            )
        )  # fmt: skip
    epoch_record = EpochRecord(
        stamp.epoch, stamp.now_ms, stamp.seed, stamp.code_hash, tuple(txns), next_offsets
    )
    return SequencedEpoch(epoch_record, tuple(dead))


def _advance(next_offsets: dict[str, int], record: InputRecord) -> None:
    position = f"{record.topic}:{record.partition}"
    next_offsets[position] = max(next_offsets.get(position, 0), record.offset + 1)
