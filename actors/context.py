"""One run of one handler: the :class:`Context` it sees and the :class:`TxnOutcome` it leaves.

The same function, :func:`run_transaction`, serves the engine, the serial oracle and replay, so a
transaction means one thing everywhere. Writes, emits and egress are buffered in the context and
become the outcome only if the handler returns and every written actor meets its constraints:
an abort has no effect anywhere (docs/concepts.md).

Every value crosses the boundary between handler code and the engine as canonical bytes
(:mod:`epochal.schemas.canonical`): ``get`` decodes a fresh copy, ``put`` and ``emit`` validate
and encode at once. So a handler never holds a reference into the store, a value that breaks
its schema never reaches it, and every participant of a transaction — on this worker or another —
computes on equal values (docs/concepts.md).

Only exceptions of handler code are aborts; MemoryError, RecursionError, SystemError (and the
operator's KeyboardInterrupt) propagate and stop the worker. Breaking the contract — an
undeclared key, a key of the wrong type, an ill-typed ``put`` or ``emit`` — aborts the whole
transaction even if the handler catches the exception.
"""

from __future__ import annotations

import functools
import logging
import random
import re
from collections.abc import Mapping
from typing import Any, NoReturn, TypeVar

import msgspec

from epochal.actors.api import ActorType, App
from epochal.actors.outcome import FATAL, AbortKind, Emitted, TxnOutcome
from epochal.actors.plan import EpochClock, Invocation
from epochal.errors import EpochalError, SchemaError, TransactionAborted, describe_exception
from epochal.schemas.codec import encode
from epochal.schemas.commands import ActorKey, KeyRef, Origin

logger = logging.getLogger(__name__)

CRASHED_AT: list[Invocation] = []
"""The transactions whose handlers stopped this process (a worker reports the first to its
supervisor, which has the next generation keep the state before its epoch)."""

__all__ = [
    "CRASHED_AT",
    "MAX_EGRESS_BYTES",
    "MAX_REASON_CHARS",
    "Context",
    "hang_line",
    "poison_line",
    "run_transaction",
]

S = TypeVar("S", bound=msgspec.Struct)

MAX_REASON_CHARS = 1_000
"""Abort reasons are cut to this length: they travel in egress records and metrics."""
MAX_EGRESS_BYTES = 900_000
"""The largest egress record a handler may write (Kafka's default message limit is 1 MiB)."""
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,200}")


@functools.lru_cache(maxsize=1024)
def _valid_egress_name(name: str) -> bool:
    return _TOPIC_NAME.fullmatch(name) is not None


def _cut(reason: str) -> str:
    return reason if len(reason) <= MAX_REASON_CHARS else reason[: MAX_REASON_CHARS - 1] + "…"


class Context:
    """The handler's view of the world at its timestamp ``(epoch, seq)``.

    >>> account = ctx.get(Account, "alice"); account.balance -= 10; ctx.put("alice", account)

    ``get`` returns the transaction's own copy (a new default actor where none exists yet);
    changes count only once ``put``, and ``put`` takes the value as it is at that moment.
    Keys outside the declared set abort the transaction.
    """

    __slots__ = (
        "_checked", "_invocation", "_keys", "_now_ms", "_reads", "_rng", "_seed", "_types",
        "_views", "_written", "app", "egressed", "emitted", "epoch", "handler", "seq", "violated",
        "violation",
    )  # fmt: skip

    def __init__(
        self,
        app: App,
        invocation: Invocation,
        reads: Mapping[KeyRef, bytes | None],
        clock: EpochClock,
    ) -> None:
        self.app = app
        self.handler = invocation.handler
        self.epoch = invocation.epoch
        self.seq = invocation.seq
        self._invocation = invocation
        self._types = app.actor_types_by_class
        self._keys = invocation.keys  # a few keys: a tuple is quicker to search than to hash
        self._reads = reads
        self._now_ms = clock.now_ms
        self._seed = clock.seed
        self._rng: random.Random | None = None
        self._views: dict[KeyRef, msgspec.Struct] = {}
        self._written: dict[KeyRef, bytes | None] = {}
        self._checked: dict[KeyRef, msgspec.Struct] = {}  # canonical values, never handed out
        self.emitted: list[Emitted] = []
        self.egressed: list[tuple[str, bytes]] = []
        self.violation: str | None = None  # kept even if the handler swallows the exception
        self.violated = AbortKind.RAISED  # the kind of ``violation``, once there is one

    def _abort(self, kind: AbortKind, reason: str) -> NoReturn:
        if self.violation is None:
            self.violation, self.violated = reason, kind
        raise TransactionAborted(reason, handler=self.handler.name)

    # --- state ---------------------------------------------------------------------------

    def _ref(self, cls: type, key: ActorKey) -> tuple[KeyRef, ActorType]:
        actor_type = self._types.get(cls)
        if actor_type is None:
            self._abort(
                AbortKind.ILL_TYPED, f"not an actor type: {getattr(cls, '__name__', cls)!r}"
            )
        if type(key) is not actor_type.key_type:
            self._abort(
                AbortKind.KEY_TYPE,
                f"key {key!r} of {actor_type.name} has type {type(key).__name__}; "
                f"{actor_type.name} keys are {actor_type.key_type.__name__}",
            )
        ref = KeyRef(actor_type.name, key)
        if ref not in self._keys:
            self._abort(
                AbortKind.UNDECLARED_KEY,
                f"undeclared key {ref.actor_type}[{key!r}]: "
                f"declare it in the keys of {self.handler.name}",
            )
        return ref, actor_type

    def get(self, cls: type[S], key: ActorKey) -> S:
        ref, actor_type = self._ref(cls, key)
        view = self._views.get(ref)
        if view is None:
            data = self._written[ref] if ref in self._written else self._reads.get(ref)
            view = cls() if data is None else actor_type.codec.decode(data)
            self._views[ref] = view
        return view  # type: ignore[return-value]

    def exists(self, cls: type, key: ActorKey) -> bool:
        ref, _ = self._ref(cls, key)
        if ref in self._written:
            return self._written[ref] is not None
        return self._reads.get(ref) is not None

    def put(self, key: ActorKey, value: msgspec.Struct) -> None:
        ref, actor_type = self._ref(type(value), key)
        try:
            data, checked = actor_type.codec.canonical(value)
        except SchemaError as exc:
            self._abort(
                AbortKind.ILL_TYPED, f"ill-typed value for {ref.actor_type}[{key!r}]: {exc.message}"
            )
        self._written[ref] = data
        self._checked[ref] = checked
        self._views.pop(ref, None)  # the next get sees what was put, not later changes

    def delete(self, cls: type, key: ActorKey) -> None:
        ref, _ = self._ref(cls, key)
        self._written[ref] = None
        self._checked.pop(ref, None)
        self._views.pop(ref, None)

    # --- other handlers and the outside world -----------------------------------------------

    def call(self, fn: Any, event: object) -> Any:
        """Run another handler inside this transaction (atomic with it; its keys must be ours).

        A nested transaction: if the called handler raises, its own writes, emits and egress
        are undone and the exception reaches the caller, which may catch it and go on.
        """
        try:
            handler = self.app.handler_for_fn(fn)
        except EpochalError:
            self._abort(
                AbortKind.UNKNOWN_HANDLER,
                f"ctx.call of {getattr(fn, '__name__', fn)!r}: not a registered handler",
            )
        saved = (dict(self._written), dict(self._checked), len(self.emitted), len(self.egressed))
        try:
            return handler.fn(self, event)
        except FATAL:
            raise
        except BaseException:
            self._written, self._checked = saved[0], saved[1]
            del self.emitted[saved[2] :], self.egressed[saved[3] :]
            self._views.clear()  # objects got before the call may carry its changes
            raise

    def emit(self, event: object) -> None:
        """Trigger a separate interior transaction, run at the start of the next epoch.

        The event is taken as it is now; its transaction's keys are declared now, so an unknown
        event type, an ill-typed event or a failing key function aborts this transaction.
        """
        try:
            handler = self.app.interior_handler(event)
        except EpochalError:
            self._abort(
                AbortKind.UNKNOWN_HANDLER,
                f"no transaction handles the emitted {type(event).__name__}",
            )
        try:
            data, checked = handler.codec.canonical(event)
        except SchemaError as exc:
            self._abort(
                AbortKind.ILL_TYPED, f"ill-typed emitted {handler.event.__name__}: {exc.message}"
            )
        try:
            keys = self.app.declared_keys(handler, checked)
        except FATAL:
            raise
        except BaseException as exc:
            self._abort(
                AbortKind.KEY_FUNCTION,
                f"key function of {handler.name} failed: {describe_exception(exc)}",
            )
        inv = self._invocation
        self.emitted.append(
            Emitted(
                self.epoch, self.seq, len(self.emitted), handler.name, data, keys,
                inv.source, inv.request_id,
            )
        )  # fmt: skip

    def egress(self, name: str, record: object) -> None:
        """Write ``record`` to ``<app>.out.<name>`` if, and when, this transaction commits."""
        if not (isinstance(name, str) and _valid_egress_name(name)):
            self._abort(AbortKind.EGRESS, f"egress name {name!r} is not a valid topic name suffix")
        try:
            data = encode(record)
        except (TypeError, ValueError, OverflowError) as exc:
            self._abort(
                AbortKind.EGRESS, f"egress record does not encode: {describe_exception(exc)}"
            )
        if len(data) > MAX_EGRESS_BYTES:
            self._abort(
                AbortKind.EGRESS, f"egress record of {len(data)} bytes is over {MAX_EGRESS_BYTES}"
            )
        check = self.app.egress_codec.check_value
        if check is not None:  # a JSON app: one with no JSON form fails here, not in its writer
            try:
                check(data)
            except (TypeError, ValueError) as exc:
                self._abort(
                    AbortKind.EGRESS, f"egress record has no JSON form: {describe_exception(exc)}"
                )
        self.egressed.append((name, data))

    def now(self) -> int:
        """The epoch's wall-clock time in milliseconds, fixed by the sequencer and logged."""
        return self._now_ms

    def random(self) -> float:
        """A float in [0, 1) from this transaction's own deterministic stream."""
        if self._rng is None:
            self._rng = random.Random(f"{self._seed}:{self.epoch}:{self.seq}")
        return self._rng.random()

    # --- the end of the run ------------------------------------------------------------------

    def broken_constraint(self) -> str | None:
        """The first constraint a written actor breaks, checked on the values as put."""
        for ref, value in self._checked.items():
            broken = self.app.actor_types[ref.actor_type].violated(value)
            if broken is not None:
                return f"constraint {broken!r} violated by {ref.actor_type}[{ref.key!r}]"
        return None

    def writes(self) -> dict[KeyRef, bytes | None]:
        return self._written


def run_transaction(
    app: App, invocation: Invocation, reads: Mapping[KeyRef, bytes | None], clock: EpochClock
) -> TxnOutcome:
    """Run one handler on ``reads`` (the canonical bytes of its keys at its timestamp; it may
    hold other keys too, the store itself, which the handler cannot name)."""
    inv = invocation
    if inv.error:
        return TxnOutcome(inv.epoch, inv.seq, inv.handler.name, False, _cut(inv.error),
                          source=inv.source, request_id=inv.request_id,
                          abort=inv.error_kind)  # fmt: skip
    client = inv.origin == Origin.CLIENT
    ctx = Context(app, inv, reads, clock)
    result = b""
    raised = ""
    try:
        returned = inv.handler.fn(ctx, inv.event)
        reason = ctx.violation
        if reason is None and (reason := ctx.broken_constraint()) is not None:
            ctx.violated = AbortKind.CONSTRAINT
        if client and returned is not None and reason is None:
            result, reason = _result_of(returned)
            if reason is not None:
                ctx.violated = AbortKind.RESULT
    except FATAL as exc:
        logger.error("%s", poison_line(inv, exc))
        CRASHED_AT.append(inv)  # the worker process reports it as it dies
        raise
    except BaseException as exc:  # handler code's exception, however odd: an abort
        reason = ctx.violation or describe_exception(exc)
        raised = type(exc).__name__
    if reason is not None:
        return TxnOutcome(inv.epoch, inv.seq, inv.handler.name, False, _cut(reason),
                          source=inv.source, request_id=inv.request_id, client=client,
                          abort=ctx.violated, raised=raised)  # fmt: skip
    return TxnOutcome(
        inv.epoch, inv.seq, inv.handler.name, True, writes=ctx.writes(), emits=ctx.emitted,
        egress=ctx.egressed, source=inv.source, request_id=inv.request_id, client=client,
        result=result,
    )  # fmt: skip


def poison_line(inv: Invocation, exc: BaseException) -> str:
    """One line naming a transaction whose handler stopped its worker: which handler, at which
    timestamp, from which input, and the two ways past it (docs/operations.md)."""
    return (
        f"transaction crashed its worker {_named(inv)} error={describe_exception(exc)}: it will "
        f"crash every replay; {_ways_out(inv)}"
    )


def hang_line(inv: Invocation, seconds: float, bound_s: float) -> str:
    """The line of :func:`poison_line` for a handler that has not returned for ``seconds``."""
    return (
        f"transaction hung its worker {_named(inv)} has run for {seconds:.1f} s (the bound is "
        f"{bound_s:g} s): it will hang every replay; {_ways_out(inv)}"
    )


def _named(inv: Invocation) -> str:
    request = f" request_id={inv.request_id}" if inv.request_id else ""
    return (
        f"handler={inv.handler.name} epoch={inv.epoch} seq={inv.seq} "
        f"origin={Origin(inv.origin).name.lower()} input={_input(inv)}{request}"
    )


def _input(inv: Invocation) -> str:
    if inv.source is None:
        return "none (interior)"
    return f"{inv.source.topic}/{inv.source.partition}@{inv.source.offset}"


def _ways_out(inv: Invocation) -> str:
    weak = f" (in weak recovery mode: --input {_input(inv)})" if inv.source is not None else ""
    return (
        "deploy a fixed version, or skip it: epochal skip APP --epoch "
        f"{inv.epoch} --seq {inv.seq}{weak}"
    )


def _result_of(returned: object) -> tuple[bytes, str | None]:
    """What a client transaction's handler returned, as msgpack for its reply, or why not."""
    try:
        data = encode(returned)
    except Exception as exc:  # any failure to encode it is the handler's
        return b"", f"the returned value does not encode: {describe_exception(exc)}"
    if len(data) > MAX_EGRESS_BYTES:
        return b"", f"the returned value of {len(data)} bytes is over {MAX_EGRESS_BYTES}"
    return data, None
