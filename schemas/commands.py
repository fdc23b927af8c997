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
    "ActorKey",
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


class KeyRef(msgspec.Struct, frozen=True, array_like=True, order=True):
    """One actor: its type's name and its key."""

    actor_type: str
    key: ActorKey


class InputPosition(msgspec.Struct, frozen=True, array_like=True):
    """Where a border transaction's record was read: topic, partition, offset."""

    topic: str
    partition: int
    offset: int


class CommandTxn(msgspec.Struct, frozen=True, array_like=True):
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

    ``next_offsets`` maps ``"topic:partition"`` to the next offset to read after this epoch (the
    offsets committed with it). ``code_hash`` identifies the application's code: replay under a
    different hash is refused unless forced (DESIGN §2.3).
    """

    epoch: int
    now_ms: int
    seed: int
    code_hash: str
    txns: tuple[CommandTxn, ...] = ()
    next_offsets: dict[str, int] = {}


class DeadLetter(msgspec.Struct, frozen=True):
    """A record that could not become a transaction, with the reason and where it came from."""

    reason: str
    topic: str
    partition: int
    offset: int
    value: bytes
    key: bytes | None = None


class InputRecord(msgspec.Struct, frozen=True):
    """A record as the sequencer read it from an input or requests topic."""

    topic: str
    partition: int
    offset: int
    value: bytes
    key: bytes | None = None


class ClientRequest(msgspec.Struct, frozen=True):
    """A client transaction on ``<app>.requests``: handler, msgpack event, idempotency key."""

    request_id: str
    handler: str
    event: bytes
