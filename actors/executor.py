"""The epoch executor of one worker: Calvin-style, deterministic, no locks, no 2PC.

Every worker receives the same ordered transactions and runs, **once**, each one that touches a
key of one of its partitions (however many of its partitions the transaction touches):

* a transaction runs once none of its local keys is held by an earlier transaction of this
  worker that has not run yet (per-key operation chains, TStream): each key sees its operations
  in timestamp order, while unrelated later transactions pass a blocked one;
* a transaction spanning several workers first sends the canonical bytes of its local keys to
  the other participating workers (as soon as they are final), waits for theirs, then every
  participant runs the same handler on the same bytes, reaches the same outcome, and applies
  only the writes to its own keys. The owner of the lowest participating partition reports the
  outcome (egress, emits, aborts) for that partition.

Running a transaction once per worker (not once per local partition) means that partitions of
one worker never exchange anything, and that every participant decodes its own event and reads:
no two runs ever share a value. A worker plans and runs an epoch a slice of its timestamp order
at a time (so that the slice's objects stay in cache); transactions wait in per-key chains built
once per slice, so a transaction is looked at again only when one of its chains moves, however
many exchange rounds the slice takes; sends are buffered and flushed once per round, when
nothing more can run. There is no deadlock: every worker follows the same global order, and a
slice is a prefix of what is left of it, so each wait is on a transaction that every
participant reaches.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Protocol

import msgspec

from epochal.actors.api import App
from epochal.actors.context import run_transaction
from epochal.actors.outcome import BY_SEQ, Emitted, TxnOutcome
from epochal.actors.partitioning import KeyRanges
from epochal.actors.plan import (
    PLAN_SLICE,
    EpochClock,
    Invocation,
    checked_before,
    epoch_order,
    invocation_of,
)
from epochal.actors.store import StateStore
from epochal.actors.watchdog import RUNNING
from epochal.schemas.commands import EpochRecord, KeyRef, PartitionId

__all__ = ["EpochExecutor", "Exchange", "Reads", "Step", "share_slices"]

Reads = dict[KeyRef, bytes | None]


class Exchange(Protocol):
    """Carries read values to other workers (TCP, or nothing for a single worker)."""

    def send(
        self, to: int, epoch: int, seq: int, refs: tuple[KeyRef, ...], values: list[bytes | None]
    ) -> None: ...

    async def flush(self) -> None: ...


class Step(msgspec.Struct):
    """One transaction as one worker sees it: the participating workers and its own keys.

    ``partitions[i]`` owns ``local_keys[i]``; ``reporter`` is the partition that reports the
    outcome if this worker owns it, else None. ``reads`` of a cross-worker step: its values,
    from its first turn (the other workers' join them as they come). A struct: one is made per
    transaction.
    """

    invocation: Invocation
    workers: tuple[int, ...]
    local_keys: tuple[KeyRef, ...]
    partitions: tuple[PartitionId, ...]
    reporter: PartitionId | None
    reads: Reads | None = None


_Shape = tuple[tuple[int, ...], tuple[int, ...] | None, PartitionId | None]
"""How a transaction on some partitions falls to one worker: the workers it runs on, the
indices of its keys on this worker (None: all of them) and the partition that reports it here
(None: another worker's)."""

_SHAPES: dict[tuple[tuple[int, ...], int], dict[tuple[PartitionId, ...], _Shape | None]] = {}
"""The shapes worked out so far, per (``worker_of``, worker): a process plans under one layout
at a time, and an epoch's transactions fall on a few distinct tuples of partitions."""
_MAX_SHAPES = 4_096  # per layout: more are forgotten at once and worked out again


def _shape_of(
    parts: tuple[PartitionId, ...], worker_of: tuple[int, ...], worker: int
) -> _Shape | None:
    """The :data:`_Shape` of a transaction on ``parts`` for ``worker``; None if it does not
    run there. One without keys: partition 0's worker runs and reports it."""
    if not parts:
        return ((worker,), None, PartitionId(0)) if worker_of[0] == worker else None
    owners = [worker_of[p] for p in parts]
    if worker not in owners:
        return None
    lowest = min(parts)
    reporter = lowest if worker_of[lowest] == worker else None
    if all(owner == worker for owner in owners):
        return (worker,), None, reporter
    local = tuple([i for i, owner in enumerate(owners) if owner == worker])
    return tuple(sorted(set(owners))), local, reporter


def share_slices(
    app: App,
    record: EpochRecord,
    carried: list[Emitted],
    ranges: KeyRanges,
    *,
    worker_of: Sequence[int],
    worker: int,
    size: int = PLAN_SLICE,
) -> Iterator[list[Step]]:
    """This worker's share of each ``size`` transactions of an epoch in turn, each planned
    when the one before has been taken; a slice may hold no step. Its share
    is, in timestamp order, the transactions that touch a key of its partitions
    (``worker_of[p]`` runs partition p), and those without keys if it runs partition 0. One
    pass: each transaction's partitions are looked up once, what they mean for this worker is
    worked out once per distinct tuple of partitions (a few, however many transactions), and
    only the events of this worker's transactions are decoded."""
    epoch, skipped, checked = record.epoch, record.skipped, checked_before(app, record)
    partitions_of = ranges.partitions_of_keys
    layout = (tuple(worker_of), worker)
    shapes = _SHAPES.get(layout)
    if shapes is None or len(shapes) > _MAX_SHAPES:
        shapes = _SHAPES[layout] = {}
    ordered = epoch_order(record, carried)
    while chunk := list(itertools.islice(ordered, size)):
        steps: list[Step] = []
        for seq, txn, origin in chunk:
            keys = txn.keys
            parts = partitions_of(keys)
            try:
                shape = shapes[parts]
            except KeyError:
                shape = shapes[parts] = _shape_of(parts, layout[0], worker)
            if shape is None:
                continue
            workers, here, reporter = shape
            if here is None:
                local, local_parts = keys, parts
            elif len(here) == 1:  # most cross-worker transactions: one key here
                local, local_parts = (keys[here[0]],), (parts[here[0]],)
            else:
                local = tuple([keys[i] for i in here])
                local_parts = tuple([parts[i] for i in here])
            invocation = invocation_of(
                app, epoch, seq, txn, skipped, origin=origin, checked=checked
            )
            steps.append(Step(invocation, workers, local, local_parts, reporter))
        yield steps


class EpochExecutor:
    """Runs this worker's share of each epoch on its :class:`StateStore`."""

    def __init__(self, app: App, worker: int, partitions: Iterable[PartitionId], store: StateStore):
        self.app = app
        self.worker = worker
        self.partitions = tuple(partitions)
        self.store = store
        self._inbox: dict[tuple[int, int], Reads] = {}  # reads come before their step is ready
        self._waiting: dict[tuple[int, int], tuple[int, Reads, int]] = {}
        """(step index, its reads so far, how many reads it runs on) of each step that sent
        its reads and waits for the others'."""
        self._completed: list[int] = []  # waiting steps whose reads have all come
        self._arrived = asyncio.Event()  # set when one has

    def receive(
        self, epoch: int, seq: int, refs: Sequence[KeyRef], values: Sequence[bytes | None]
    ) -> None:
        """Values another worker read for transaction ``(epoch, seq)``: ``values[i]`` is
        ``refs[i]``'s."""
        timestamp = (epoch, seq)
        waiting = self._waiting.get(timestamp)
        if waiting is None:  # its step is not ready here yet: it takes them when it is
            inbox = self._inbox.get(timestamp)
            if inbox is None:
                self._inbox[timestamp] = dict(zip(refs, values, strict=True))
            else:
                inbox.update(zip(refs, values, strict=True))
            return
        index, reads, keys = waiting
        reads.update(zip(refs, values, strict=True))
        if len(reads) >= keys:
            del self._waiting[timestamp]
            self._completed.append(index)
            self._arrived.set()

    def run_alone(
        self,
        clock: EpochClock,
        plan: Sequence[Invocation],
        ranges: KeyRanges,
        ran: dict[PartitionId, int],
    ) -> dict[PartitionId, list[TxnOutcome]]:
        """Run an epoch, or a slice of it (:func:`plan_slices`), on a worker that owns every
        partition (one worker; replay): in timestamp order, with no chains, no exchange and no
        :class:`Step` per transaction. Counts in ``ran`` the transactions each partition took
        part in."""
        reported: dict[PartitionId, list[TxnOutcome]] = {p: [] for p in self.partitions}
        app, values, apply, epoch = self.app, self.store.values, self.store.apply, clock.epoch
        partitions_of = ranges.partitions_of_keys
        by_parts: dict[tuple[PartitionId, ...], int] = {}  # transactions per partition tuple
        for invocation in plan:
            keys = invocation.keys
            parts = partitions_of(keys)
            by_parts[parts] = by_parts.get(parts, 0) + 1
            reporter = min(parts) if parts else PartitionId(0)  # no keys: partition 0 reports
            RUNNING.invocation = invocation  # for the watchdog of a handler that hangs
            try:
                outcome = run_transaction(app, invocation, values, clock)
            finally:
                RUNNING.invocation = None
            if outcome.committed:  # the handler read the store itself: apply after it ran
                for ref, value in outcome.writes.items():
                    apply(ref, parts[keys.index(ref)], value, epoch)
            reported[reporter].append(outcome)
        for parts, count in by_parts.items():
            for p in set(parts):
                ran[p] += count
        return reported

    async def run_epoch(
        self,
        clock: EpochClock,
        steps: list[Step],
        exchange: Exchange,
        ran: dict[PartitionId, int],
    ) -> dict[PartitionId, list[TxnOutcome]]:
        """Run this worker's share of an epoch, or of a slice of it (:func:`share_slices`); the
        outcomes each local partition reports.
        Counts in ``ran`` the transactions each local partition takes part in."""
        reported: dict[PartitionId, list[TxnOutcome]] = {p: [] for p in self.partitions}
        _count_parts(steps, ran)
        values = self.store.values  # a step on this worker alone reads the store as it is
        if all(len(step.workers) == 1 for step in steps):  # nothing to wait for: in order
            for step in steps:
                self._execute(clock, step, values, reported)
            return reported
        chains = _Chains(steps)
        while chains.left:
            while chains.ready:
                index = heapq.heappop(chains.ready)
                step = steps[index]
                reads: Mapping[KeyRef, bytes | None]
                if len(step.workers) == 1:
                    reads = values
                elif step.reads is not None:  # back from waiting: receive() completed them
                    reads = step.reads
                else:  # its first turn: it sends its reads
                    first = self._reads(step, index, exchange)
                    if first is None:  # receive() makes it ready when the others' have come
                        continue
                    reads = first
                self._execute(clock, step, reads, reported)
                chains.done(index)
            await exchange.flush()
            if chains.left and not chains.ready:
                while not self._completed:
                    self._arrived.clear()
                    await self._arrived.wait()
                for index in self._completed:
                    heapq.heappush(chains.ready, index)
                self._completed.clear()
        for outcomes in reported.values():  # in timestamp order, whatever the arrival order
            outcomes.sort(key=BY_SEQ)
        return reported

    def _reads(self, step: Step, index: int, exchange: Exchange) -> Reads | None:
        """Every read of a cross-worker ``step`` at its first turn: its local keys' values,
        sent to the other participants (they are final now), and theirs that came before; None
        while some of theirs have not come (it waits in ``_waiting``, and :meth:`receive`
        completes ``step.reads``)."""
        invocation, local, values = step.invocation, step.local_keys, self.store.values
        if len(local) == 1:  # most cross-worker transactions: no comprehension nor zip
            ref = local[0]
            value = values.get(ref)
            mine, reads = [value], {ref: value}
        else:
            mine = [values.get(ref) for ref in local]
            reads = dict(zip(local, mine, strict=True))
        step.reads = reads
        keys = len(reads) + len(invocation.keys) - len(local)  # the reads it runs on, in all
        epoch, seq = invocation.epoch, invocation.seq
        for other in step.workers:
            if other != self.worker:
                exchange.send(other, epoch, seq, local, mine)
        timestamp = (epoch, seq)
        remote = self._inbox.pop(timestamp, None)
        if remote is not None:
            reads.update(remote)
        if len(reads) < keys:
            self._waiting[timestamp] = (index, reads, keys)
            return None
        return reads

    def _execute(
        self,
        clock: EpochClock,
        step: Step,
        reads: Mapping[KeyRef, bytes | None],
        reported: dict[PartitionId, list[TxnOutcome]],
    ) -> None:
        """Run ``step`` on ``reads`` (the handler writes to its context; the writes to this
        worker's keys are applied after it returns)."""
        RUNNING.invocation = step.invocation  # for the watchdog of a handler that hangs
        try:
            outcome = run_transaction(self.app, step.invocation, reads, clock)
        finally:
            RUNNING.invocation = None
        if outcome.committed:
            local, epoch = step.local_keys, clock.epoch
            for ref, value in outcome.writes.items():
                if ref in local:  # the other workers apply their own keys
                    self.store.apply(ref, step.partitions[local.index(ref)], value, epoch)
        if step.reporter is not None:
            reported[step.reporter].append(outcome)


def _count_parts(steps: Sequence[Step], ran: dict[PartitionId, int]) -> None:
    """Count each step once in each local partition it takes part in (as :meth:`run_alone`
    does inline)."""
    for step in steps:
        parts = step.partitions
        if len(parts) == 1:
            ran[parts[0]] += 1
        else:
            for p in set(parts):
                ran[p] += 1


class _Chains:
    """Per-key operation chains of an epoch's steps (TStream): a step is ready once it heads the
    chain of every one of its local keys. Each step is looked at once per key, however many
    exchange rounds the epoch takes."""

    def __init__(self, steps: Sequence[Step]) -> None:
        self.blockers = [0] * len(steps)
        self.next: list[list[int]] = [[] for _ in steps]
        last: dict[KeyRef, int] = {}
        for index, step in enumerate(steps):
            for ref in step.local_keys:
                before = last.get(ref)
                if before is not None and before != index:  # a key named twice: one link
                    self.next[before].append(index)
                    self.blockers[index] += 1
                last[ref] = index
        self.ready = [i for i, n in enumerate(self.blockers) if n == 0]  # sorted: a heap
        self.left = len(steps)

    def done(self, index: int) -> None:
        """Step ``index`` ran: the next step of each of its chains may now be ready."""
        self.left -= 1
        blockers = self.blockers
        for after in self.next[index]:
            blockers[after] -= 1
            if blockers[after] == 0:
                heapq.heappush(self.ready, after)
