"""Records epochal writes to egress topics (``<app>.out.<name>``)."""

from __future__ import annotations

import enum

import msgspec

from epochal.errors import ConfigError
from epochal.schemas.commands import ActorKey, InputPosition

__all__ = ["ClientReply", "EgressFormat", "EgressLayout", "EgressPosition", "EgressRecord"]


class EgressFormat(enum.Enum):
    """How an app writes its egress records and dead letters: msgpack (compact, the default)
    or JSON (one readable object per record, for ``kcat`` and other plain Kafka tools)."""

    MSGPACK = "msgpack"
    JSON = "json"

    @classmethod
    def of(cls, value: EgressFormat | str) -> EgressFormat:
        """The format ``value`` names (the enum or its string value), or a ConfigError."""
        try:
            return cls(value)
        except ValueError:
            known = ", ".join(repr(f.value) for f in cls)
            raise ConfigError(
                f"egress_format {value!r} is not one of {known}", egress_format=repr(value)
            ) from None


class EgressRecord(msgspec.Struct, frozen=True):
    """One output of a transaction, with its timestamp ``(epoch, seq)`` and outcome.

    ``value`` is the msgpack of the record the handler produced (in an app whose egress format
    is JSON, its JSON); for an aborted transaction that reports to an egress topic it is empty
    and ``reason`` says why. ``source`` is the input
    record the transaction came from (topic, partition, offset) and ``request_id`` the client's
    idempotency key for a client transaction; an interior transaction carries those of the input
    that started its chain.
    """

    epoch: int
    seq: int
    handler: str
    committed: bool
    value: bytes = b""
    reason: str = ""
    source: InputPosition | None = None
    request_id: str = ""


class ClientReply(msgspec.Struct, frozen=True):
    """The outcome of one client transaction, on ``<app>.replies`` (exactly once, like egress):
    committed at ``(epoch, seq)`` with the msgpack of what its handler returned, or aborted with
    the reason. The client library matches it to the request by ``request_id``."""

    request_id: str
    epoch: int
    seq: int
    handler: str
    committed: bool
    reason: str = ""
    result: bytes = b""


class EgressPosition(msgspec.Struct, frozen=True):
    """How far one egress writer (partition ``partition`` of a layout of ``partitions``) has
    released egress: every output of an epoch before command-log ``position`` is out.

    Committed in the same Kafka transaction as the egress records themselves, to the compacted
    topic ``<app>.egress-positions`` (key ``writer:<partition>``): it is exactly as durable as
    the egress, and never expires the way consumer-group offsets do.
    """

    partition: int
    partitions: int
    position: int


class EgressLayout(msgspec.Struct, frozen=True):
    """Since command-log position ``start``, egress is written by ``partitions`` writers, and
    partition i of actor type t owns the keys in [points[t][i-1], points[t][i]).

    Written (key ``layout``) when the layout changes (the partition count or the split points:
    either changes which partition reports a transaction), once every writer of the old layout
    has released everything before ``start``; a writer of the new layout starts at
    ``max(start, its own position)``. It is the layout every worker of the cluster runs.
    ``points`` None: a layout recorded before layouts carried their split points.
    """

    partitions: int
    start: int
    points: dict[str, list[ActorKey]] | None = None
