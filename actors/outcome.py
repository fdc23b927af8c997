"""The outcome of one transaction, and the failures that are never outcomes."""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from epochal.schemas.commands import KeyRef

__all__ = ["FATAL", "TxnOutcome"]

# Failures of the process, never of a transaction: they must not become an abort on one
# participant only, so they stop the worker and recovery takes over (DESIGN §2.9).
FATAL: tuple[type[BaseException], ...] = (MemoryError, RecursionError, SystemError)


@dataclass
class TxnOutcome:
    """What a transaction did: committed or not (and why), its writes, emits and egress.

    ``writes`` maps each written actor to its new state, or None where it was deleted.
    """

    epoch: int
    seq: int
    handler: str
    committed: bool
    reason: str = ""
    writes: dict[KeyRef, msgspec.Struct | None] = field(default_factory=dict)
    emits: list[object] = field(default_factory=list)
    egress: list[tuple[str, bytes]] = field(default_factory=list)
