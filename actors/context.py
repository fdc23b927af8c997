"""One run of one handler: the :class:`Context` it sees and the :class:`TxnOutcome` it leaves.

The same function, :func:`run_transaction`, serves the engine, the serial oracle and replay, so a
transaction means one thing everywhere. Writes, emits and egress are buffered in the context and
become the outcome only if the handler returns and every written actor meets its constraints:
an abort has no effect anywhere (DESIGN §2.2). Only exceptions of handler code are aborts;
MemoryError, RecursionError and SystemError propagate and stop the worker.
"""

from __future__ import annotations

import copy
import functools
import random
from collections.abc import Mapping
from typing import Any, TypeVar

import msgspec

from epochal.actors.api import App
from epochal.actors.outcome import FATAL, TxnOutcome
from epochal.actors.plan import EpochClock, Invocation
from epochal.errors import TransactionAborted
from epochal.schemas.codec import encode
from epochal.schemas.commands import ActorKey, KeyRef

__all__ = ["Context", "run_transaction"]

State = msgspec.Struct

S = TypeVar("S", bound=msgspec.Struct)


class Context:
    """The handler's view of the world at its timestamp ``(epoch, seq)``.

    >>> account = ctx.get(Account, "alice"); account.balance -= 10; ctx.put("alice", account)

    ``get`` returns the transaction's own copy (a new default actor where none exists yet);
    changes count only once ``put``. Keys outside the declared set abort the transaction.
    """

    def __init__(
        self,
        app: App,
        invocation: Invocation,
        reads: Mapping[KeyRef, State | None],
        clock: EpochClock,
    ) -> None:
        self.app = app
        self.handler = invocation.handler
        self.epoch = invocation.epoch
        self.seq = invocation.seq
        self._keys = frozenset(invocation.keys)
        self._reads = reads
        self._now_ms = clock.now_ms
        self._seed = clock.seed
        self._rng: random.Random | None = None
        self._working: dict[KeyRef, State | None] = {}
        self.written: set[KeyRef] = set()
        self.emitted: list[object] = []
        self.egressed: list[tuple[str, bytes]] = []
        self.violation: str | None = None  # kept even if the handler swallows the exception

    # --- state ---------------------------------------------------------------------------

    def _ref(self, cls: type, key: ActorKey) -> KeyRef:
        ref = KeyRef(self.app.actor_type(cls).name, key)
        if ref not in self._keys:
            self.violation = (
                f"undeclared key {ref.actor_type}[{key!r}]: "
                f"declare it in the keys of {self.handler.name}"
            )
            raise TransactionAborted(self.violation, handler=self.handler.name)
        return ref

    def get(self, cls: type[S], key: ActorKey) -> S:
        ref = self._ref(cls, key)
        if ref not in self._working:
            stored = self._reads.get(ref)
            self._working[ref] = cls() if stored is None else _copy(stored, cls)
        value = self._working[ref]
        return cls() if value is None else value  # type: ignore[return-value]

    def exists(self, cls: type, key: ActorKey) -> bool:
        ref = self._ref(cls, key)
        if ref in self._working:
            return self._working[ref] is not None
        return self._reads.get(ref) is not None

    def put(self, key: ActorKey, value: msgspec.Struct) -> None:
        ref = self._ref(type(value), key)
        self._working[ref] = value
        self.written.add(ref)

    def delete(self, cls: type, key: ActorKey) -> None:
        ref = self._ref(cls, key)
        self._working[ref] = None
        self.written.add(ref)

    # --- other handlers and the outside world -----------------------------------------------

    def call(self, fn: Any, event: object) -> Any:
        """Run another handler inside this transaction (atomic with it; its keys must be ours)."""
        return self.app.handler_for_fn(fn).fn(self, event)

    def emit(self, event: object) -> None:
        """Trigger a separate interior transaction, run at the start of the next epoch."""
        self.app.interior_handler(event)  # unknown event types abort now, not next epoch
        self.emitted.append(event)

    def egress(self, name: str, record: object) -> None:
        """Write ``record`` to ``<app>.out.<name>`` if, and when, this transaction commits."""
        self.egressed.append((name, encode(record)))

    def now(self) -> int:
        """The epoch's wall-clock time in milliseconds, fixed by the sequencer and logged."""
        return self._now_ms

    def random(self) -> float:
        """A float in [0, 1) from this transaction's own deterministic stream."""
        if self._rng is None:
            self._rng = random.Random(f"{self._seed}:{self.epoch}:{self.seq}")
        return self._rng.random()

    def outcome(self) -> dict[KeyRef, State | None]:
        return {ref: self._working[ref] for ref in sorted(self.written)}


@functools.cache
def _is_flat(cls: type) -> bool:
    fields = msgspec.structs.fields(cls)
    return all(
        isinstance(f.type, type) and f.type in (int, float, str, bool, bytes) for f in fields
    )


def _copy(value: State, cls: type[S]) -> S:
    """The transaction's own copy of a stored actor: shallow where all fields are scalars."""
    if _is_flat(cls):
        return copy.copy(value)  # type: ignore[return-value]
    return msgspec.msgpack.decode(encode(value), type=cls)


def run_transaction(
    app: App, invocation: Invocation, reads: Mapping[KeyRef, State | None], clock: EpochClock
) -> TxnOutcome:
    """Run one handler on ``reads`` (the values of its keys at its timestamp) to an outcome."""
    epoch, seq, name = invocation.epoch, invocation.seq, invocation.handler.name
    if invocation.error:
        return TxnOutcome(epoch, seq, name, committed=False, reason=invocation.error)
    ctx = Context(app, invocation, reads, clock)
    try:
        invocation.handler.fn(ctx, invocation.event)
        writes = ctx.outcome()
        broken = _broken_constraint(app, writes)
    except FATAL:
        raise
    except Exception as exc:
        return TxnOutcome(epoch, seq, name, False, ctx.violation or f"{type(exc).__name__}: {exc}")
    reason = ctx.violation or broken
    if reason is not None:
        return TxnOutcome(epoch, seq, name, committed=False, reason=reason)
    return TxnOutcome(epoch, seq, name, True, writes=writes, emits=ctx.emitted, egress=ctx.egressed)


def _broken_constraint(app: App, writes: Mapping[KeyRef, State | None]) -> str | None:
    for ref, value in writes.items():
        if value is not None:
            broken = app.actor_types[ref.actor_type].violated(value)
            if broken is not None:
                return f"constraint {broken!r} violated by {ref.actor_type}[{ref.key!r}]"
    return None
