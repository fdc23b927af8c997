"""From one command-log epoch to the ordered list of transactions every executor runs.

Interior transactions emitted in epoch e run at the start of epoch e+1, before the logged ones,
ordered by (parent timestamp, emit index); they get the negative seqs -k..-1 so that the
timestamp order ``(epoch, seq)`` puts them first. They are derived, never logged: the engine, the
oracle and replay all derive them here, the same way.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from epochal.actors.api import App, Handler
from epochal.actors.outcome import FATAL, TxnOutcome
from epochal.errors import RecoveryError
from epochal.schemas.commands import EpochRecord, KeyRef, Origin

__all__ = ["Emitted", "EpochClock", "Invocation", "emitted_by", "ensure_same_code", "plan_epoch"]


@dataclass(frozen=True)
class EpochClock:
    """What the sequencer fixed for one epoch: its number, wall-clock time and random seed."""

    epoch: int
    now_ms: int
    seed: int

    @classmethod
    def of(cls, record: EpochRecord) -> EpochClock:
        return cls(record.epoch, record.now_ms, record.seed)


@dataclass(frozen=True)
class Emitted:
    """An event a committed transaction emitted: parent timestamp and emit index order them."""

    epoch: int
    seq: int
    index: int
    event: object


@dataclass(frozen=True)
class Invocation:
    """One transaction to run at ``(epoch, seq)``; ``error`` set means it aborts as planned."""

    epoch: int
    seq: int
    handler: Handler
    event: object
    keys: tuple[KeyRef, ...]
    origin: Origin
    error: str = ""


def emitted_by(outcomes: Iterable[TxnOutcome]) -> list[Emitted]:
    """The events committed transactions emitted, in (parent timestamp, emit index) order."""
    found = [
        Emitted(o.epoch, o.seq, i, event)
        for o in outcomes
        if o.committed
        for i, event in enumerate(o.emits)
    ]
    return sorted(found, key=lambda e: (e.epoch, e.seq, e.index))


def _interior(app: App, epoch: int, carried: list[Emitted]) -> list[Invocation]:
    ordered = sorted(carried, key=lambda e: (e.epoch, e.seq, e.index))
    out = []
    for i, emitted in enumerate(ordered):
        seq = i - len(ordered)
        handler = app.interior_handler(emitted.event)
        try:
            keys, error = app.declared_keys(handler, emitted.event), ""
        except FATAL:
            raise
        except Exception as exc:  # the user's key function failed: the transaction aborts
            keys, error = (), f"key function of {handler.name} failed: {exc}"
        out.append(Invocation(epoch, seq, handler, emitted.event, keys, Origin.INTERIOR, error))
    return out


def plan_epoch(app: App, record: EpochRecord, carried: list[Emitted]) -> list[Invocation]:
    """Interior transactions first, then the logged ones in seq order."""
    plan = _interior(app, record.epoch, carried)
    for txn in record.txns:
        handler = app.handlers[txn.handler]
        event = app.decode_event(handler, txn.event)
        plan.append(Invocation(record.epoch, txn.seq, handler, event, txn.keys, txn.origin))
    return plan


def ensure_same_code(record: EpochRecord, running: str, allowed: bool = False) -> None:
    """Refuse an epoch logged by other application code: replaying it could give another state
    (DESIGN §2.3). ``running`` is ``app.code_hash()``, computed once: it reads source files."""
    if record.code_hash != running and not allowed:
        raise RecoveryError(
            "the command log was written by other application code; replaying it could give "
            "another state (pass --allow-code-change to replay anyway)",
            epoch=record.epoch, logged=record.code_hash, running=running,
        )  # fmt: skip
