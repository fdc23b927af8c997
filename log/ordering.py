"""The pure core of the sequencer: one batch of input records in, one ordered epoch out.

No I/O, no clock, no randomness of its own: the shell passes ``now_ms`` and ``seed`` and logs them.

The order of an epoch (its tie-break rule across input partitions):

1. border transactions, by ``(topic, partition, offset)`` of their records, so every input
   partition keeps its order;
2. then client transactions, by ``(partition, offset)`` on the requests topic. An idempotency key
   is used once: the first request carrying it becomes a transaction (or a dead letter); a later
   one, in this batch or remembered by the shell's :class:`RequestWindow`, is dropped. Ticks
   (``handler == ""``) are neither: they only make the epoch exist.

``seq`` is dense from 0. No record can make :func:`order` raise: a record that cannot become a
transaction (undecodable, invalid, an unknown event type, no transaction for the topic, a key
function that fails, anything the router raises, RecursionError, OverflowError and MemoryError
included, or keys the command log cannot hold) becomes a dead letter with the reason (a
SchemaError's message, else ``"<ExcType>: <message>"``) and its coordinates, capped so that it
always fits in one Kafka message. Every record read, dead or not, advances ``next_offsets``, which
starts from the positions the shell passes in: each epoch carries the full position vector.
"""

from __future__ import annotations

import heapq
import operator
from collections.abc import Container, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Protocol

import msgspec

from epochal.errors import SchemaError, describe_exception
from epochal.schemas.codec import decode, encode
from epochal.schemas.commands import (
    SKIPPED_REASON,
    ClientRequest,
    CommandTxn,
    DeadLetter,
    EpochRecord,
    InputPosition,
    InputRecord,
    KeyRef,
    Origin,
)
from epochal.schemas.egress import EgressFormat
from epochal.schemas.egress_codec import egress_codec

__all__ = [
    "DEFAULT_DEAD_LETTER_BYTES",
    "EpochStamp",
    "RequestWindow",
    "Routed",
    "Router",
    "SequencedEpoch",
    "dead_letter",
    "order",
    "position_key",
]

DEFAULT_DEAD_LETTER_BYTES = 64 * 1024  # far below Kafka's default max.message.bytes (1 MB)
_HEADERS = 16  # msgpack headers of the three capped fields, at most 5 bytes each


@dataclass(frozen=True)
class EpochStamp:
    """What the shell fixes for an epoch before ordering it: number, time, seed, code hash, and
    whether the workers snapshot at its end."""

    epoch: int
    now_ms: int
    seed: int
    code_hash: str
    snapshot: bool = False


class Routed(msgspec.Struct, frozen=True, gc=False):
    """A valid record: the handler it invokes, its event as msgpack, its declared keys. One
    per input record: a Struct is made in C (a NamedTuple's ``__new__`` is a Python function,
    6 % of the sequencer's CPU in a drain)."""

    handler: str
    event: bytes
    keys: tuple[KeyRef, ...]


class Router(Protocol):
    """What the sequencer needs of the application; raises SchemaError with the reason. The
    keys a route declares can be logged (:meth:`App.declared_keys` checks each): the
    sequencer does not encode them again to find out."""

    def route(self, topic: str, value: bytes) -> Routed: ...

    def route_request(self, handler: str, event: bytes) -> Routed: ...


@dataclass(frozen=True)
class SequencedEpoch:
    """The epoch to log and the dead letters to write in the same Kafka transaction.

    ``requests_seen`` maps each client request id read in this batch (ticks excepted) to the
    latest Kafka timestamp of a record carrying it, for the shell's :class:`RequestWindow`.
    """

    record: EpochRecord
    dead: tuple[DeadLetter, ...]
    requests_seen: Mapping[str, int] = field(default_factory=dict)


def position_key(topic: str, partition: int) -> str:
    """The key of a partition in ``EpochRecord.next_offsets``: ``"topic:partition"``."""
    return f"{topic}:{partition}"


def order(
    router: Router,
    stamp: EpochStamp,
    inputs: Sequence[InputRecord],
    requests: Sequence[InputRecord] = (),
    *,
    sequenced_requests: Container[str] = frozenset(),
    positions: Mapping[str, int] | None = None,
    dead_letter_bytes: int = DEFAULT_DEAD_LETTER_BYTES,
    skipped: AbstractSet[tuple[str, int, int]] = frozenset(),
    egress_format: EgressFormat = EgressFormat.MSGPACK,
) -> SequencedEpoch:
    """Order one batch into epoch ``stamp.epoch``; see the module docstring for the rule.

    ``positions`` is the position vector before this batch (the last epoch's ``next_offsets``);
    ``sequenced_requests`` the request ids already used; ``dead_letter_bytes`` caps each dead
    letter encoded in ``egress_format`` (the app's); ``skipped`` the ``(topic, partition,
    offset)`` of records an operator sent to the dead letters (``epochal skip --input``).
    """
    batch = _Batch(router, dead_letter_bytes, dict(positions or {}), skipped, egress_format)
    for record in sorted(inputs, key=_BY_POSITION):
        batch.border(record)
    for record in sorted(requests, key=_BY_PARTITION_OFFSET):
        batch.client(record, sequenced_requests)
    batch.end_run()
    epoch_record = EpochRecord(
        stamp.epoch, stamp.now_ms, stamp.seed, stamp.code_hash, tuple(batch.txns),
        batch.next_offsets, stamp.snapshot,
    )  # fmt: skip
    return SequencedEpoch(epoch_record, tuple(batch.dead), batch.seen)


_BY_POSITION = operator.attrgetter("topic", "partition", "offset")  # made in C, not a lambda
_BY_PARTITION_OFFSET = operator.attrgetter("partition", "offset")


@dataclass
class _Batch:
    """The epoch being built: transactions, dead letters, positions, request ids seen."""

    router: Router
    dead_letter_bytes: int
    next_offsets: dict[str, int]
    skipped: AbstractSet[tuple[str, int, int]]
    egress_format: EgressFormat
    txns: list[CommandTxn] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)
    seen: dict[str, int] = field(default_factory=dict)
    run: InputRecord | None = None  # the last record of the partition being read

    def border(self, record: InputRecord) -> None:
        if self._advance(record):
            return
        try:
            routed = self.router.route(record.topic, record.value)
        except Exception as exc:  # whatever the router raises, this record is a dead letter
            self._dead(record, exc)
            return
        self._append(routed, record, Origin.BORDER)

    def client(self, record: InputRecord, remembered: Container[str]) -> None:
        if self._advance(record):
            return
        try:
            request = decode(record.value, ClientRequest)
        except Exception as exc:  # a RecursionError, too, from skipping a deep unknown field
            self._dead(record, exc)
            return
        if request.is_tick:
            return
        request_id = request.request_id
        retry = request_id in self.seen or request_id in remembered
        self.seen[request_id] = max(self.seen.get(request_id, -1), record.timestamp_ms)
        if retry:
            return  # its idempotency key was used already: sequenced (or dead) once
        try:
            routed = self.router.route_request(request.handler, request.event)
        except Exception as exc:
            self._dead(record, exc)
            return
        self._append(routed, record, Origin.CLIENT, request_id)

    def _append(
        self, routed: Routed, record: InputRecord, origin: Origin, request_id: str = ""
    ) -> None:
        source = InputPosition(record.topic, record.partition, record.offset)
        self.txns.append(
            CommandTxn(len(self.txns), routed.handler, routed.event, routed.keys, origin, source,
                       request_id)
        )  # fmt: skip

    def _dead(self, record: InputRecord, exc: Exception) -> None:
        self.dead.append(
            dead_letter(record, _reason(exc), self.dead_letter_bytes, self.egress_format)
        )

    def _advance(self, record: InputRecord) -> bool:
        """Move the position past ``record``; True if it was skipped (now a dead letter).
        Records come sorted, a partition's in one run: its position is written once, when the
        run ends (:meth:`end_run`)."""
        run = self.run
        if run is not None and (record.partition != run.partition or record.topic != run.topic):
            self.end_run()
        self.run = record
        if not self.skipped or (record.topic, record.partition, record.offset) not in self.skipped:
            return False
        self.dead.append(
            dead_letter(record, SKIPPED_REASON, self.dead_letter_bytes, self.egress_format)
        )
        return True

    def end_run(self) -> None:
        """Write the position after the run of records just read (none: nothing to write)."""
        run, self.run = self.run, None
        if run is not None:
            position = position_key(run.topic, run.partition)
            self.next_offsets[position] = max(self.next_offsets.get(position, 0), run.offset + 1)


def _reason(exc: BaseException) -> str:
    """A SchemaError's message with its context, else ``"<ExcType>: <message>"``."""
    return str(exc) if isinstance(exc, SchemaError) else describe_exception(exc)


def dead_letter(
    record: InputRecord,
    reason: str,
    max_bytes: int = DEFAULT_DEAD_LETTER_BYTES,
    egress_format: EgressFormat = EgressFormat.MSGPACK,
) -> DeadLetter:
    """The dead letter of ``record``, encoded in ``egress_format`` in at most ``max_bytes``
    (unless its coordinates alone are longer): the reason gets up to a quarter of the room, the
    key up to a quarter, the value the rest; a cut value or key sets ``truncated``."""
    key = record.key
    bare = DeadLetter("", record.topic, record.partition, record.offset, b"",
                      None if key is None else b"", True, len(record.value))  # fmt: skip
    if egress_format is not EgressFormat.MSGPACK:
        return _fit_json(record, reason, max_bytes, bare)
    room = max(0, max_bytes - len(encode(bare)) - _HEADERS)
    text = _clip(reason, room // 4)
    if key is not None:
        key = key[: room // 4]
    value = record.value[: max(0, room - len(text.encode()) - len(key or b""))]
    truncated = len(value) < len(record.value) or (key is not None and key != record.key)
    return DeadLetter(text, record.topic, record.partition, record.offset, value, key,
                      truncated, len(record.value))  # fmt: skip


def _fit_json(record: InputRecord, reason: str, max_bytes: int, bare: DeadLetter) -> DeadLetter:
    """:func:`dead_letter` in JSON, where bytes grow by a third (base64) and the reason by its
    escapes: the reason gets up to a quarter of the room as escaped, the key up to a quarter
    of the rest and the value what is left, then the value, the key and the reason are cut
    in turn until the encoded letter fits, measured rather than estimated."""
    encode_json = egress_codec(EgressFormat.JSON).dead_letter
    room = max(0, max_bytes - len(encode_json(bare)))
    text = _clip(reason, room // 4)
    while (escaped := len(msgspec.json.encode(text)) - 2) > room // 4:
        text = _clip(text, len(text.encode()) * (room // 4) // escaped)
    raw_room = (room - escaped) * 3 // 4  # the room left for bytes, before base64
    key = None if record.key is None else record.key[: raw_room // 3]
    value = record.value[: max(0, raw_room - len(key or b""))]
    while True:
        truncated = len(value) < len(record.value) or (key is not None and key != record.key)
        letter = DeadLetter(text, record.topic, record.partition, record.offset, value, key,
                            truncated, len(record.value))  # fmt: skip
        excess = len(encode_json(letter)) - max_bytes
        if excess <= 0:
            return letter
        if value:  # each pass cuts at least one byte of one field: it ends
            value = value[: max(0, len(value) - excess)]
        elif key:
            key = key[: max(0, len(key) - excess)]
        elif text:
            text = _clip(text, max(0, len(text.encode()) - excess))
        else:
            return letter  # the coordinates alone are longer


def _clip(text: str, limit: int) -> str:
    """``text`` as valid UTF-8 in at most ``limit`` bytes, ending in ``...`` when cut."""
    data = text.encode("utf-8", "backslashreplace")  # lone surrogates cannot go to msgpack
    if len(data) <= limit:
        return data.decode()
    return data[: max(0, limit - 3)].decode("utf-8", "ignore") + "..."[:limit]


class RequestWindow:
    """The client request ids used in the last ``window_ms`` of epoch time: a retry within the
    window is dropped, so a request is sequenced once.

    An id is remembered from the Kafka timestamp of the latest request record that carried it
    (clamped to the epoch's ``now``, so a producer's clock ahead of ours does not stretch the
    window; each retry extends it) until ``window_ms`` later in epoch time, when
    :meth:`prune` forgets it. Memory is one window's ids, whatever the uptime. A restarted
    sequencer rebuilds the same set from the records of the requests topic.

    >>> window = RequestWindow(600_000)
    >>> window.remember({"req-1": 5_000}, now_ms=6_000); "req-1" in window
    True
    """

    def __init__(self, window_ms: int) -> None:
        self.window_ms = window_ms
        self._at: dict[str, int] = {}
        self._heap: list[tuple[int, str]] = []

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._at

    def __len__(self) -> int:
        return len(self._at)

    def remember(self, seen: Mapping[str, int], now_ms: int) -> None:
        """Remember ids read at Kafka timestamps ``seen`` (-1: none) by an epoch at ``now_ms``."""
        for request_id, timestamp_ms in seen.items():
            at = now_ms if timestamp_ms < 0 else min(timestamp_ms, now_ms)
            if at > self._at.get(request_id, -1):
                self._at[request_id] = at
                heapq.heappush(self._heap, (at, request_id))

    def prune(self, now_ms: int) -> None:
        """Forget the ids last seen more than ``window_ms`` before ``now_ms``."""
        horizon = now_ms - self.window_ms
        while self._heap and self._heap[0][0] < horizon:
            at, request_id = heapq.heappop(self._heap)
            if self._at.get(request_id) == at:
                del self._at[request_id]
