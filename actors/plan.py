"""From one command-log epoch to the ordered list of transactions every executor runs.

Interior transactions emitted in epoch e run at the start of epoch e+1, before the logged ones,
ordered by (parent timestamp, emit index); they get the negative seqs -k..-1 so that the
timestamp order ``(epoch, seq)`` puts them first. They are derived, never logged: the engine, the
oracle and replay all derive them here, the same way, from the canonical bytes and keys fixed
when the parent emitted them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import msgspec

from epochal.actors.api import App, Handler
from epochal.actors.outcome import BY_EMIT_ORDER, AbortKind, Emitted, TxnOutcome
from epochal.errors import RecoveryError
from epochal.schemas.commands import CommandTxn, EpochRecord, InputPosition, KeyRef, Origin

__all__ = [
    "Emitted",
    "EpochClock",
    "Invocation",
    "checked_before",
    "emitted_by",
    "ensure_same_code",
    "epoch_order",
    "handler_of",
    "interior_seqs",
    "invocation_of",
    "plan_epoch",
    "plan_slices",
]

PLAN_SLICE = 512
"""A worker plans and runs an epoch this many transactions of it at a time, and hands over
their outcomes: the objects of that many stay in a core's cache from planning to running to
reporting (a drain's 5,000-record epoch planned whole before it runs, and its outcomes held to
its end, cost a quarter more a transaction)."""


@dataclass(frozen=True)
class EpochClock:
    """What the sequencer fixed for one epoch: its number, wall-clock time and random seed."""

    epoch: int
    now_ms: int
    seed: int

    @classmethod
    def of(cls, record: EpochRecord) -> EpochClock:
        return cls(record.epoch, record.now_ms, record.seed)


class Invocation(msgspec.Struct):
    """One transaction to run at ``(epoch, seq)``; ``error`` set means it aborts as planned.

    ``event`` is decoded afresh for each run: a handler that changes its event changes only its
    own copy. ``source``/``request_id`` name the input it came from (for egress). A struct:
    one is made per transaction, four times as fast as a dataclass.
    """

    epoch: int
    seq: int
    handler: Handler
    event: object
    keys: tuple[KeyRef, ...]
    origin: Origin
    error: str = ""
    source: InputPosition | None = None
    request_id: str = ""
    error_kind: AbortKind = AbortKind.EVENT_DECODE  # why it aborts as planned, with ``error``


def emitted_by(outcomes: Iterable[TxnOutcome]) -> list[Emitted]:
    """The events committed transactions emitted, in (parent timestamp, emit index) order."""
    found = [e for o in outcomes if o.committed for e in o.emits]
    return sorted(found, key=BY_EMIT_ORDER)


def _decoded(handler: Handler, data: bytes, checked: bool) -> tuple[object, str]:
    """The event, or the reason it no longer decodes (a log replayed under changed code).
    ``checked``: these bytes passed this schema's checks already (:func:`checked_before`)."""
    codec = handler.codec
    try:
        return (codec.decode_checked if checked else codec.decode)(data), ""
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        return None, f"event no longer decodes as {handler.event.__name__}: {exc}"


def interior_seqs(carried: Iterable[Emitted]) -> list[tuple[int, Emitted]]:
    """The interior transactions an epoch starts with, each with its seq: (parent timestamp,
    emit index) order, seqs -k..-1."""
    ordered = sorted(carried, key=BY_EMIT_ORDER)
    return [(i - len(ordered), emitted) for i, emitted in enumerate(ordered)]


def handler_of(app: App, name: str, epoch: int, seq: int) -> Handler:
    """The handler a logged or emitted transaction names: one the running code no longer has
    cannot run it (``epochal run`` refuses such a deploy at start, naming it)."""
    try:
        return app.handlers[name]
    except KeyError:
        raise RecoveryError(
            f"handler {name!r} is not in this version of the app, but the command log still "
            "has a transaction for it: deploy a version that has it, or skip the transaction "
            "(`epochal skip`)", epoch=epoch, seq=seq,
        ) from None  # fmt: skip


def plan_epoch(app: App, record: EpochRecord, carried: list[Emitted]) -> list[Invocation]:
    """Interior transactions first, then the logged ones in seq order; those an operator
    skipped (``record.skipped``) abort with the reason, unread."""
    return next(plan_slices(app, record, carried, None), [])


def plan_slices(
    app: App, record: EpochRecord, carried: list[Emitted], size: int | None = PLAN_SLICE
) -> Iterator[list[Invocation]]:
    """:func:`plan_epoch` in slices of ``size`` transactions (None: one slice), each planned
    when the one before has been taken; nothing for an empty epoch."""
    epoch, skipped, checked = record.epoch, record.skipped, checked_before(app, record)
    ordered = epoch_order(record, carried)
    while plan := [
        invocation_of(app, epoch, seq, txn, skipped, origin=origin, checked=checked)
        for seq, txn, origin in itertools.islice(ordered, size)
    ]:
        yield plan


def checked_before(app: App, record: EpochRecord) -> bool:
    """True if the sequencer checked the events of ``record`` with the schemas that run it:
    it logged them under the running code, and no deploy re-coded the epoch since. Their
    constraints cannot fail again (the same bytes, the same checks): they are not run twice."""
    return record.code_hash == app.code_hash() and not record.recoded


def epoch_order(
    record: EpochRecord, carried: list[Emitted]
) -> Iterator[tuple[int, CommandTxn | Emitted, Origin]]:
    """The transactions of an epoch in timestamp order, undecoded: interior ones first (seqs
    -k..-1), then the logged ones; each with its seq and origin."""
    for seq, emitted in interior_seqs(carried):
        yield seq, emitted, Origin.INTERIOR
    for txn in record.txns:
        yield txn.seq, txn, txn.origin


def invocation_of(
    app: App, epoch: int, seq: int, txn: CommandTxn | Emitted, skipped: Mapping[int, str], *,
    origin: Origin, checked: bool = False,
) -> Invocation:  # fmt: skip
    """The invocation of a logged transaction, or of an interior one at ``seq``. ``checked``:
    the epoch's logged events were checked by the schemas that run them (:func:`checked_before`);
    an interior one is checked again (it may come from a snapshot of older code)."""
    handler = handler_of(app, txn.handler, epoch, seq)
    if seq in skipped:  # an operator sent it to the dead letters: it aborts as planned
        return Invocation(epoch, seq, handler, None, txn.keys, origin, skipped[seq], txn.source,
                          txn.request_id, AbortKind.SKIPPED)  # fmt: skip
    event, error = _decoded(handler, txn.event, checked and origin is not Origin.INTERIOR)
    return Invocation(epoch, seq, handler, event, txn.keys, origin, error, txn.source,
                      txn.request_id)  # fmt: skip


def ensure_same_code(record: EpochRecord, running: str, allowed: bool = False) -> None:
    """Refuse an epoch logged by other application code: replaying it could give another state
    (docs/concepts.md). ``running`` is ``app.code_hash()``, computed once: it reads source files."""
    if record.code_hash != running and not allowed:
        raise RecoveryError(
            "the command log was written by other application code; replaying it could give "
            "another state. A cluster: start it again with `epochal run`, which checks what "
            "may run under this code (the code changed under a running cluster: install a new "
            "version beside the old one, not over it). `epochal replay`/`recover`: pass "
            "--allow-code-change to replay anyway",
            epoch=record.epoch, logged=record.code_hash, running=running,
        )  # fmt: skip
