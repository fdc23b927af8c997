"""The outcome of one transaction, the events it emitted, and failures that are never outcomes."""

from __future__ import annotations

from enum import StrEnum
from operator import attrgetter

import msgspec

from epochal.schemas.commands import InputPosition, KeyRef

__all__ = ["BY_EMIT_ORDER", "BY_SEQ", "FATAL", "AbortKind", "Emitted", "TxnOutcome"]

# Failures of the process, never of a transaction: they must not become an abort on one
# participant only, so they stop the worker and recovery takes over (docs/concepts.md).
# KeyboardInterrupt is the operator's, not the handler's.
FATAL: tuple[type[BaseException], ...] = (
    MemoryError, RecursionError, SystemError, KeyboardInterrupt,
)  # fmt: skip


class AbortKind(StrEnum):
    """Why a transaction aborted, as data: a rule of the contract it broke, or ``RAISED``, its
    handler's own exception. Each value is a label of ``epochal_aborts_total`` (a raised one is
    labelled by the exception's type instead: the app's code chooses those, so the set of
    labels stays small)."""

    RAISED = "raised"
    CONSTRAINT = "constraint"
    UNDECLARED_KEY = "undeclared_key"
    KEY_TYPE = "key_type"
    KEY_FUNCTION = "key_function"
    ILL_TYPED = "ill_typed"
    UNKNOWN_HANDLER = "unknown_handler"
    EGRESS = "egress"
    RESULT = "result"
    EVENT_DECODE = "event_decode"
    SKIPPED = "skipped"


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


class TxnOutcome(msgspec.Struct):
    """What a transaction did: committed or not (and why), its writes, emits and egress.

    ``writes`` maps each written actor to its new state as canonical bytes, or None where it was
    deleted. ``source``/``request_id`` identify the input the transaction came from. A client
    transaction (``client``) is answered on ``<app>.replies`` with its outcome and ``result``,
    the msgpack of what its handler returned. An aborted one says why in ``reason`` (for
    people) and ``abort`` (as data; ``raised`` names the type of a handler's own exception).
    A struct, not a dataclass: one is made per transaction, and a dataclass's ``__init__`` took
    four times as long.
    """

    epoch: int
    seq: int
    handler: str
    committed: bool
    reason: str = ""
    writes: dict[KeyRef, bytes | None] = msgspec.field(default_factory=dict)
    emits: list[Emitted] = msgspec.field(default_factory=list)
    egress: list[tuple[str, bytes]] = msgspec.field(default_factory=list)
    source: InputPosition | None = None
    request_id: str = ""
    client: bool = False
    result: bytes = b""
    abort: AbortKind | None = None
    raised: str = ""

    @property
    def abort_label(self) -> str:
        """The ``reason`` label of ``epochal_aborts_total`` ("" for a committed one)."""
        if self.abort is None:
            return ""
        if self.abort is not AbortKind.RAISED:
            return self.abort.value
        return self.raised if self.raised.isidentifier() else "other"  # type("a b", ...) exists


BY_SEQ = attrgetter("seq")
"""The sort key of an epoch's outcomes: timestamp order (made in C, not a lambda per outcome)."""
BY_EMIT_ORDER = attrgetter("epoch", "seq", "index")
"""The sort key of emitted events: their parent's timestamp, then the order it emitted them."""
