"""The command log: what the sequencer decided for one epoch, self-contained for replay.

S-Store's command log holds the procedure and its parameters; ours holds, per transaction, the
handler's name, the encoded event, where it came from and the keys it declared, plus the epoch's
``now`` and random seed and the input offsets it covers. Strong recovery needs nothing else.
"""

from __future__ import annotations

from enum import IntEnum
from typing import NewType

import msgspec

__all__ = [
    "SKIPPED_REASON",
    "ActorKey",
    "Amendment",
    "AmendmentKind",
    "ClientRequest",
    "CommandTxn",
    "DeadLetter",
    "Epoch",
    "EpochRecord",
    "InputPosition",
    "InputRecord",
    "KeyRef",
    "Origin",
    "PartitionId",
    "Seq",
]

Epoch = NewType("Epoch", int)
Seq = NewType("Seq", int)
PartitionId = NewType("PartitionId", int)
ActorKey = str | int


class Origin(IntEnum):
    """Where a transaction came from (S-Store: border vs interior; OLTP from clients)."""

    BORDER = 0  # an input topic
    CLIENT = 1  # the requests topic (client library)
    INTERIOR = 2  # emitted by another transaction; derived, never logged


# ``gc=False`` on the records below: they hold only strings, ints, bytes and tuples of them, so
# they can be in no reference cycle, and a worker holds one KeyRef per actor and every logged
# transaction since the last snapshot. Python's cycle collector then never walks them: its full
# collections were ~40% of the engine's time on the bank (bench.profile_engine).
class KeyRef(msgspec.Struct, frozen=True, array_like=True, order=True, gc=False):
    """One actor: its type's name and its key."""

    actor_type: str
    key: ActorKey


class InputPosition(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """Where a border transaction's record was read: topic, partition, offset."""

    topic: str
    partition: int
    offset: int


class CommandTxn(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One logged transaction: handler, event bytes (msgpack), declared keys, origin.

    ``seq`` is dense inside the epoch; the timestamp of the transaction is ``(epoch, seq)``.
    ``request_id`` is the client's idempotency key for client transactions, else empty.
    """

    seq: int
    handler: str
    event: bytes
    keys: tuple[KeyRef, ...]
    origin: Origin = Origin.BORDER
    source: InputPosition | None = None
    request_id: str = ""


class EpochRecord(msgspec.Struct, frozen=True):
    """The ordering decisions of one epoch.

    ``next_offsets`` maps ``"topic:partition"`` to the next offset to read after this epoch, for
    every input and requests partition the sequencer has read from so far (the full vector, not
    only the partitions of this epoch): the last epoch alone tells a restarted sequencer where to
    resume, so positions never depend on consumer-group offsets that Kafka may expire. A partition
    absent from it has never been read. ``code_hash`` identifies the application's code: replay
    under a different hash is refused unless forced (docs/concepts.md). ``snapshot``: every worker
    snapshots its partitions at the end of this epoch (the cut's id, its ssid, is the epoch):
    the sequencer decides, so that every worker cuts at the same boundary without a word.
    ``skipped``: the seqs an operator sent to the dead-letter topic, each with its reason; the
    sequencer logs none: they are filled in from the log's :class:`Amendment` records when the
    epoch is read back (``log/amendments.py``), as ``code_hash`` is after a deploy.
    ``final``: the last epoch before a clean stop (a snapshot epoch too): the workers run it,
    commit its snapshot and egress, and exit: the stop is a savepoint (docs/operations.md).
    ``recoded``: a deploy's amendment replaced ``code_hash`` (the sequencer logs False): the
    events were checked by other code than the one the epoch now runs under.
    """

    epoch: int
    now_ms: int
    seed: int
    code_hash: str
    txns: tuple[CommandTxn, ...] = ()
    next_offsets: dict[str, int] = {}
    snapshot: bool = False
    skipped: dict[int, str] = {}
    final: bool = False
    recoded: bool = False


SKIPPED_REASON = "skipped by an operator (epochal skip)"


class AmendmentKind(IntEnum):
    """What an amendment changes about epochs already logged."""

    SKIP = 0  # one transaction goes to the dead-letter topic instead of running
    RECODE = 1  # epochs whose egress was never released run under a new deploy's code
    SKIP_INPUT = 2  # weak mode: one input record goes to the dead-letter topic, never sequenced


class Amendment(msgspec.Struct, frozen=True):
    """A change to logged epochs that is not the sequencer's: ``epochal skip`` of a poison
    input, or a deploy that runs epochs never released under its own code. Amendments live on
    the compacted topic ``<app>.amendments``, one record per :attr:`key`, so writing one twice
    changes nothing; every reader of the command log applies them (``log/amendments.py``).

    SKIP names ``first_epoch`` (= ``last_epoch``) and ``seq``; RECODE names the epochs
    ``first_epoch..last_epoch`` and the ``code_hash`` they run under; SKIP_INPUT names the input
    record at ``topic``/``partition``/``offset`` (weak mode, where epochs are sequenced anew at
    each rollback: only the input is a stable name). ``at_ms`` and ``note`` say when and why,
    for people.
    """

    kind: AmendmentKind
    first_epoch: int
    last_epoch: int
    seq: int = 0
    code_hash: str = ""
    at_ms: int = 0
    note: str = ""
    topic: str = ""
    partition: int = 0
    offset: int = 0

    @property
    def key(self) -> bytes:
        if self.kind is AmendmentKind.SKIP:
            return f"skip:{self.first_epoch}:{self.seq}".encode()
        if self.kind is AmendmentKind.SKIP_INPUT:
            return f"skip-input:{self.topic}:{self.partition}:{self.offset}".encode()
        return f"recode:{self.first_epoch}:{self.last_epoch}".encode()


class DeadLetter(msgspec.Struct, frozen=True):
    """A record that could not become a transaction, with the reason and where it came from.

    A dead letter always fits in one Kafka message: the sequencer caps ``value``, ``key`` and
    ``reason``. When it cut the value or the key, ``truncated`` is True and they are prefixes;
    ``size`` is the original value's length in bytes (None in dead letters written before epochal
    recorded it). The whole record stays in its input topic at ``topic``/``partition``/``offset``.
    """

    reason: str
    topic: str
    partition: int
    offset: int
    value: bytes
    key: bytes | None = None
    truncated: bool = False
    size: int | None = None


class InputRecord(msgspec.Struct, frozen=True):
    """A record as the sequencer read it from an input or requests topic.

    ``timestamp_ms`` is the record's Kafka timestamp (-1 when it has none); the sequencer uses it
    only to remember client request ids for a window of time.
    """

    topic: str
    partition: int
    offset: int
    value: bytes
    key: bytes | None = None
    timestamp_ms: int = -1


class ClientRequest(msgspec.Struct, frozen=True):
    """A client transaction on ``<app>.requests``: handler, msgpack event, idempotency key.

    A request whose ``handler`` is ``""`` is a **tick**: it is no transaction, but it makes the
    sequencer log an epoch (possibly empty) when the input is idle, so that interior transactions
    emitted by the last epoch get one to run in. Workers send ticks; their ``request_id`` is
    free (``tick:<epoch>``) and never remembered.
    """

    request_id: str
    handler: str
    event: bytes

    @classmethod
    def tick(cls, epoch: int) -> ClientRequest:
        """A tick sent after ``epoch``: asks for one more epoch, carries no transaction."""
        return cls(f"tick:{epoch}", "", b"")

    @property
    def is_tick(self) -> bool:
        return not self.handler
