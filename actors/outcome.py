"""The outcome of one transaction, the events it emitted, and failures that are never outcomes."""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from epochal.schemas.commands import InputPosition, KeyRef

__all__ = ["FATAL", "Emitted", "TxnOutcome"]

# Failures of the process, never of a transaction: they must not become an abort on one
# participant only, so they stop the worker and recovery takes over (docs/concepts.md).
# KeyboardInterrupt is the operator's, not the handler's.
FATAL: tuple[type[BaseException], ...] = (
    MemoryError, RecursionError, SystemError, KeyboardInterrupt,
)  # fmt: skip


class Emitted(msgspec.Struct, frozen=True, array_like=True):
    """An event a committed transaction emitted, as every worker derives the interior
    transaction from it: parent timestamp and emit index order them; the event is canonical
    bytes and its keys were declared when it was emitted. ``source``/``request_id`` name the
    input that started the chain, so that egress can say which input it is about."""

    epoch: int
    seq: int
    index: int
    handler: str
    event: bytes
    keys: tuple[KeyRef, ...]
    source: InputPosition | None = None
    request_id: str = ""
    client: bool = False
    result: bytes = b""


@dataclass(slots=True)
class TxnOutcome:
    """What a transaction did: committed or not (and why), its writes, emits and egress.

    ``writes`` maps each written actor to its new state as canonical bytes, or None where it was
    deleted. ``source``/``request_id`` identify the input the transaction came from. A client
    transaction (``client``) is answered on ``<app>.replies`` with its outcome and ``result``,
    the msgpack of what its handler returned.
    """

    epoch: int
    seq: int
    handler: str
    committed: bool
    reason: str = ""
    writes: dict[KeyRef, bytes | None] = field(default_factory=dict)
    emits: list[Emitted] = field(default_factory=list)
    egress: list[tuple[str, bytes]] = field(default_factory=list)
    source: InputPosition | None = None
    request_id: str = ""
    client: bool = False
    result: bytes = b""
