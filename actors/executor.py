"""The epoch executor of one partition: Calvin-style, deterministic, no locks, no 2PC.

Every partition receives the same ordered transactions and runs those that touch its keys:

* a transaction runs once none of its local keys is held by an earlier transaction of this
  partition that has not run yet (per-key operation chains, TStream): each key sees its
  operations in timestamp order, while unrelated later transactions pass a blocked one;
* a multi-partition transaction first sends the values of its local keys to the other
  participants (as soon as they are final), waits for theirs, then every participant runs the
  same handler on the same values, reaches the same outcome, and applies only its own writes.
  The lowest participant reports the outcome (egress, emits, aborts).

Sends are buffered and flushed once per pass over the pending transactions, so a chain of
dependent multi-partition transactions costs a few exchange rounds per epoch, never a round
trip per transaction. There is no deadlock: every partition follows the same global order, so
each wait is on a transaction that every participant reaches.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import msgspec

from epochal.actors.api import App
from epochal.actors.context import run_transaction
from epochal.actors.digest import DigestSum
from epochal.actors.outcome import TxnOutcome
from epochal.actors.partitioning import KeyRanges
from epochal.actors.plan import EpochClock, Invocation
from epochal.schemas.commands import KeyRef, PartitionId

__all__ = ["Exchange", "PartitionExecutor", "Reads", "Step", "split_plan"]

Reads = dict[KeyRef, msgspec.Struct | None]


class Exchange(Protocol):
    """Carries read values between partitions: in-process queues or TCP, one protocol."""

    def send(self, to: PartitionId, epoch: int, seq: int, reads: Reads) -> None: ...

    async def flush(self) -> None: ...


@dataclass
class Step:
    """One transaction as one participant sees it: all participants, its own keys."""

    invocation: Invocation
    participants: tuple[PartitionId, ...]
    local_keys: tuple[KeyRef, ...]
    sent: bool = False


def split_plan(
    plan: Sequence[Invocation], ranges: KeyRanges, partitions: Iterable[PartitionId]
) -> dict[PartitionId, list[Step]]:
    """Each of ``partitions``' share of an epoch, in timestamp order; owners computed once."""
    shares: dict[PartitionId, list[Step]] = {p: [] for p in partitions}
    for invocation in plan:
        owners = [ranges.partition_of(ref) for ref in invocation.keys]
        participants = tuple(sorted(set(owners))) or (PartitionId(0),)
        for p in participants:
            share = shares.get(p)
            if share is not None:
                local = tuple(k for k, o in zip(invocation.keys, owners, strict=True) if o == p)
                share.append(Step(invocation, participants, local))
    return shares


@dataclass
class PartitionExecutor:
    """The state of one key range and the loop that runs its share of each epoch."""

    pid: PartitionId
    app: App
    ranges: KeyRanges
    store: dict[KeyRef, msgspec.Struct] = field(default_factory=dict)
    digest: DigestSum | None = field(default_factory=DigestSum)  # None: not tracked
    _inbox: dict[tuple[int, int], Reads] = field(default_factory=dict)
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def receive(self, epoch: int, seq: int, reads: Reads) -> None:
        """Values another participant read for transaction ``(epoch, seq)``."""
        self._inbox.setdefault((epoch, seq), {}).update(reads)
        self._arrived.set()

    async def run_epoch(
        self, clock: EpochClock, steps: list[Step], exchange: Exchange
    ) -> list[TxnOutcome]:
        """Run this partition's share of an epoch (:func:`split_plan`); its reported outcomes."""
        pending = steps
        reported: list[TxnOutcome] = []
        while pending:
            pending, progressed = self._pass(clock, pending, exchange, reported)
            await exchange.flush()
            if pending and not progressed:
                await self._arrived.wait()
                self._arrived.clear()
        reported.sort(key=lambda o: o.seq)
        return reported

    def _pass(
        self,
        clock: EpochClock,
        pending: list[Step],
        exchange: Exchange,
        reported: list[TxnOutcome],
    ) -> tuple[list[Step], bool]:
        """One pass in timestamp order: run what is ready, send what is final, keep the rest."""
        held: set[KeyRef] = set()
        still: list[Step] = []
        progressed = False
        for step in pending:
            if held and not held.isdisjoint(step.local_keys):
                still.append(step)
                held.update(step.local_keys)
                continue
            remote: Mapping[KeyRef, msgspec.Struct | None] = {}
            if len(step.participants) > 1:
                self._send_reads(step, exchange)
                key = (step.invocation.epoch, step.invocation.seq)
                remote = self._inbox.get(key, {})
                if len(remote) + len(step.local_keys) < len(step.invocation.keys):
                    still.append(step)
                    held.update(step.local_keys)
                    continue
                self._inbox.pop(key, None)
            self._execute(clock, step, remote, reported)
            progressed = True
        return still, progressed

    def _send_reads(self, step: Step, exchange: Exchange) -> None:
        if step.sent:
            return
        reads = {ref: self.store.get(ref) for ref in step.local_keys}
        for other in step.participants:
            if other != self.pid:
                exchange.send(other, step.invocation.epoch, step.invocation.seq, reads)
        step.sent = True

    def _execute(
        self,
        clock: EpochClock,
        step: Step,
        remote: Mapping[KeyRef, msgspec.Struct | None],
        reported: list[TxnOutcome],
    ) -> None:
        reads: Reads = {ref: self.store.get(ref) for ref in step.local_keys}
        reads.update(remote)
        outcome = run_transaction(self.app, step.invocation, reads, clock)
        for ref, value in outcome.writes.items():
            if self.ranges.partition_of(ref) != self.pid:
                continue
            old = self.store.pop(ref, None) if value is None else self.store.get(ref)
            if value is not None:
                self.store[ref] = value
            if self.digest is not None:
                self.digest.replace(ref, old, value)
        if step.participants[0] == self.pid:
            reported.append(outcome)
