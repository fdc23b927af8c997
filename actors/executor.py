"""The epoch executor of one worker: Calvin-style, deterministic, no locks, no 2PC.

Every worker receives the same ordered transactions; each one runs **once** in the cluster, on
the worker that owns the lowest partition it touches (its *runner*, which also reports its
outcome: egress, emits, aborts), however many partitions and workers it touches:

* a transaction's turn on a worker comes once none of its local keys is held by an earlier
  transaction of this worker that has not finished yet (per-key operation chains, TStream):
  each key sees its operations in timestamp order, while unrelated later transactions pass a
  blocked one;
* a transaction spanning several workers: at their turn, the other participants send the
  canonical bytes of their local keys to the runner (they are final now) and hold those keys;
  the runner, once it has them all, runs the handler, applies its own keys' writes and sends
  the others the writes to theirs (nothing, if it aborted), which they apply and go on.

Partitions of one worker never exchange anything, and only the runner decodes the event: the
others neither decode nor run it (a cross-worker transaction costs one handler run, not one per
worker). A worker plans and runs an epoch a slice of its timestamp order at a time (so that the
slice's objects stay in cache); transactions wait in per-key chains built once per slice, so a
transaction is looked at again only when one of its chains moves, however many exchange rounds
the slice takes; sends are buffered and flushed once per round, when nothing more can run.
There is no deadlock: every worker follows the same global order, and a slice is a prefix of
what is left of it, so the earliest unfinished transaction heads the chains of its keys on
every participant: their reads go out, it runs, and its writes come back.
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
    handler_of,
    invocation_of,
)
from epochal.actors.store import StateStore
from epochal.actors.transport import TransportError
from epochal.actors.watchdog import RUNNING
from epochal.schemas.commands import EpochRecord, KeyRef, PartitionId

__all__ = ["EpochExecutor", "Exchange", "Reads", "Step", "share_slices"]

Reads = dict[KeyRef, bytes | None]


class Exchange(Protocol):
    """Carries values to other workers (TCP, or nothing for a single worker): a participant's
    reads to the runner of a transaction, and the runner's writes back."""

    def send_reads(
        self, to: int, epoch: int, seq: int, refs: tuple[KeyRef, ...], values: list[bytes | None]
    ) -> None: ...

    def send_writes(
        self, to: int, epoch: int, seq: int, refs: tuple[KeyRef, ...], values: list[bytes | None]
    ) -> None: ...

    async def flush(self) -> None: ...


class Step(msgspec.Struct):
    """One transaction as one worker sees it: the participating workers, the one that runs it,
    and its own keys.

    ``partitions[i]`` owns ``local_keys[i]``; ``reporter`` is the partition that reports the
    outcome if this worker runs it, else None (another worker, ``runner``, runs it: this one
    sends its reads there and applies the writes that come back; its invocation is not decoded,
    ``event`` is None). ``reads`` of a cross-worker step this worker runs: its values, from its
    first turn (the other workers' join them as they come). A struct: one is made per
    transaction.
    """

    invocation: Invocation
    workers: tuple[int, ...]
    local_keys: tuple[KeyRef, ...]
    partitions: tuple[PartitionId, ...]
    reporter: PartitionId | None
    runner: int
    reads: Reads | None = None


_Shape = tuple[tuple[int, ...], tuple[int, ...] | None, PartitionId | None, int]
"""How a transaction on some partitions falls to one worker: the workers it touches, the
indices of its keys on this worker (None: all of them), the partition that reports it here
(None: another worker runs it) and the worker that runs it."""

_SHAPES: dict[tuple[tuple[int, ...], int], dict[tuple[PartitionId, ...], _Shape | None]] = {}
"""The shapes worked out so far, per (``worker_of``, worker): a process plans under one layout
at a time, and an epoch's transactions fall on a few distinct tuples of partitions."""
_MAX_SHAPES = 4_096  # per layout: more are forgotten at once and worked out again


def _shape_of(
    parts: tuple[PartitionId, ...], worker_of: tuple[int, ...], worker: int
) -> _Shape | None:
    """The :data:`_Shape` of a transaction on ``parts`` for ``worker``; None if it does not
    touch it. One without keys: partition 0's worker runs and reports it."""
    if not parts:
        return ((worker,), None, PartitionId(0), worker) if worker_of[0] == worker else None
    owners = [worker_of[p] for p in parts]
    if worker not in owners:
        return None
    lowest = min(parts)
    runner = worker_of[lowest]
    reporter = lowest if runner == worker else None
    if all(owner == worker for owner in owners):
        return (worker,), None, reporter, runner
    local = tuple([i for i, owner in enumerate(owners) if owner == worker])
    return tuple(sorted(set(owners))), local, reporter, runner


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
    only the events of the transactions this worker runs are decoded."""
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
            workers, here, reporter, runner = shape
            if here is None:
                local, local_parts = keys, parts
            elif len(here) == 1:  # most cross-worker transactions: one key here
                local, local_parts = (keys[here[0]],), (parts[here[0]],)
            else:
                local = tuple([keys[i] for i in here])
                local_parts = tuple([parts[i] for i in here])
            if reporter is None:  # another worker runs it: nothing to decode here
                invocation = Invocation(epoch, seq, handler_of(app, txn.handler, epoch, seq),
                                        None, keys, origin)  # fmt: skip
            else:
                invocation = invocation_of(
                    app, epoch, seq, txn, skipped, origin=origin, checked=checked
                )
            steps.append(Step(invocation, workers, local, local_parts, reporter, runner))
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
        """(step index, its reads so far, how many reads it runs on) of each step this worker
        runs that waits for the other participants' reads."""
        self._lent: dict[tuple[int, int], tuple[Step, int, _Chains]] = {}
        """Each step another worker runs that this one sent its reads to, until its writes come
        back: the step, its index and the chains of its slice."""
        self._held: dict[KeyRef, tuple[int, int]] = {}
        """The local keys of those steps, each with its step's timestamp: a later slice's steps
        on them wait for the writes (a slice is not held up by the runner's answer)."""
        self._chains: _Chains | None = None  # the slice running now
        self._completed: list[int] = []  # waiting steps whose reads have all come
        self._arrived = asyncio.Event()  # set when reads or writes have come

    def receive_reads(
        self, epoch: int, seq: int, refs: Sequence[KeyRef], values: Sequence[bytes | None]
    ) -> None:
        """Values another worker read for transaction ``(epoch, seq)``, which this one runs:
        ``values[i]`` is ``refs[i]``'s."""
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

    def receive_writes(
        self, epoch: int, seq: int, refs: Sequence[KeyRef], values: Sequence[bytes | None]
    ) -> None:
        """What transaction ``(epoch, seq)`` wrote, from the worker that ran it (None: deleted;
        nothing: it aborted or wrote nothing): this worker applies its own keys' values at
        once (they are held: nothing else here touches them), and the steps after it on those
        keys may go. They come only after this worker sent its reads (the runner waits for
        them)."""
        timestamp = (epoch, seq)
        lent = self._lent.pop(timestamp, None)
        if lent is None:
            raise TransportError(
                "writes came for a transaction this worker did not send its reads for",
                epoch=epoch, seq=seq,
            )  # fmt: skip
        step, index, chains = lent
        local, apply, held = step.local_keys, self.store.apply, self._held
        for ref, value in zip(refs, values, strict=True):
            if ref in local:
                apply(ref, step.partitions[local.index(ref)], value, epoch)
        for ref in local:
            del held[ref]
        running = self._chains
        if running is not None:
            if chains is running:
                running.lent -= 1
                running.done(index)
            running.release(timestamp)
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
        if not self._held and all(len(step.workers) == 1 for step in steps):
            values = self.store.values  # nothing to wait for: in order, on the store as it is
            for step in steps:
                self._execute(clock, step, values, reported, exchange)
            return reported
        chains = self._chains = _Chains(steps, self._held)
        try:
            while True:
                while chains.ready:
                    index = heapq.heappop(chains.ready)
                    if self._turn(clock, steps[index], index, reported, exchange):
                        chains.done(index)
                await exchange.flush()
                if chains.left == chains.lent:  # all ran here, or lent and answered later
                    break
                while not (self._completed or chains.ready):
                    self._arrived.clear()
                    await self._arrived.wait()
                for index in self._completed:
                    heapq.heappush(chains.ready, index)
                self._completed.clear()
        finally:
            self._chains = None
        for outcomes in reported.values():  # in timestamp order, whatever the arrival order
            outcomes.sort(key=BY_SEQ)
        return reported

    @property
    def unanswered(self) -> int:
        """The transactions this worker lent its reads to whose writes have not come yet: zero
        once every runner has ended the epoch, since a runner's writes go out before it says so."""
        return len(self._lent)

    def _turn(
        self,
        clock: EpochClock,
        step: Step,
        index: int,
        reported: dict[PartitionId, list[TxnOutcome]],
        exchange: Exchange,
    ) -> bool:
        """One turn of a step that heads its chains: True if it ran here; False if it now waits
        for the other participants' reads, or was lent to its runner (whose writes finish it:
        :meth:`receive_writes`)."""
        if len(step.workers) == 1:  # this worker's alone: it reads the store as it is
            self._execute(clock, step, self.store.values, reported, exchange)
            return True
        if step.reporter is None:  # another worker runs it: lend it this worker's reads
            self._lend(step, index, exchange)
            return False
        # back from waiting (receive_reads completed its reads), or its first turn
        reads = step.reads if step.reads is not None else self._reads(step, index)
        if reads is None:  # receive_reads makes it ready when the others' have come
            return False
        self._execute(clock, step, reads, reported, exchange)
        return True

    def _reads(self, step: Step, index: int) -> Reads | None:
        """Every read of a cross-worker ``step`` this worker runs, at its first turn: its local
        keys' values and the other participants' that came before; None while some of theirs
        have not come (it waits in ``_waiting``, and :meth:`receive_reads` completes
        ``step.reads``)."""
        invocation, local, values = step.invocation, step.local_keys, self.store.values
        if len(local) == 1:  # most cross-worker transactions: no comprehension nor zip
            ref = local[0]
            reads = {ref: values.get(ref)}
        else:
            reads = {ref: values.get(ref) for ref in local}
        step.reads = reads
        keys = len(reads) + len(invocation.keys) - len(local)  # the reads it runs on, in all
        timestamp = (invocation.epoch, invocation.seq)
        remote = self._inbox.pop(timestamp, None)
        if remote is not None:
            reads.update(remote)
        if len(reads) < keys:
            self._waiting[timestamp] = (index, reads, keys)
            return None
        return reads

    def _lend(self, step: Step, index: int, exchange: Exchange) -> None:
        """A step another worker runs, at its turn: send its local keys' values (final now) to
        the runner; its keys stay held until the runner's writes come back
        (:meth:`receive_writes`)."""
        assert self._chains is not None
        invocation, values = step.invocation, self.store.values
        mine = [values.get(ref) for ref in step.local_keys]
        exchange.send_reads(step.runner, invocation.epoch, invocation.seq, step.local_keys, mine)
        timestamp = (invocation.epoch, invocation.seq)
        self._lent[timestamp] = (step, index, self._chains)
        self._chains.lent += 1
        for ref in step.local_keys:
            self._held[ref] = timestamp

    def _execute(
        self,
        clock: EpochClock,
        step: Step,
        reads: Mapping[KeyRef, bytes | None],
        reported: dict[PartitionId, list[TxnOutcome]],
        exchange: Exchange,
    ) -> None:
        """Run ``step`` on ``reads`` (the handler writes to its context; the writes to this
        worker's keys are applied after it returns, the others' sent to their workers)."""
        RUNNING.invocation = step.invocation  # for the watchdog of a handler that hangs
        try:
            outcome = run_transaction(self.app, step.invocation, reads, clock)
        finally:
            RUNNING.invocation = None
        local, epoch, writes = step.local_keys, clock.epoch, outcome.writes
        if outcome.committed:
            for ref, value in writes.items():
                if ref in local:
                    self.store.apply(ref, step.partitions[local.index(ref)], value, epoch)
        if len(step.workers) > 1:  # the others apply their keys' writes (none: it aborted)
            refs = tuple([ref for ref in writes if ref not in local]) if outcome.committed else ()
            written = [writes[ref] for ref in refs]
            for other in step.workers:
                if other != self.worker:
                    exchange.send_writes(other, epoch, step.invocation.seq, refs, written)
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
    """Per-key operation chains of a slice's steps (TStream): a step is ready once it heads the
    chain of every one of its local keys, and no step of an earlier slice still holds one of
    them (``held``: lent, its writes not back yet). Each step is looked at once per key,
    however many exchange rounds the slice takes."""

    def __init__(self, steps: Sequence[Step], held: Mapping[KeyRef, tuple[int, int]]) -> None:
        self.blockers = [0] * len(steps)
        self.next: list[list[int]] = [[] for _ in steps]
        self.after: dict[tuple[int, int], list[int]] = {}  # held step → the first steps it holds
        last: dict[KeyRef, int] = {}
        for index, step in enumerate(steps):
            for ref in step.local_keys:
                before = last.get(ref)
                if before is None:
                    holder = held.get(ref) if held else None
                    if holder is not None:
                        waiting = self.after.setdefault(holder, [])
                        if not waiting or waiting[-1] != index:  # held twice by one: one link
                            waiting.append(index)
                            self.blockers[index] += 1
                elif before != index:  # a key named twice: one link
                    self.next[before].append(index)
                    self.blockers[index] += 1
                last[ref] = index
        self.ready = [i for i, n in enumerate(self.blockers) if n == 0]  # sorted: a heap
        self.left = len(steps)  # not done yet
        self.lent = 0  # of those, lent: they are done when their writes come

    def done(self, index: int) -> None:
        """Step ``index`` ran, or its writes came: the next step of each of its chains may now
        be ready."""
        self.left -= 1
        self._unblock(self.next[index])

    def release(self, holder: tuple[int, int]) -> None:
        """The writes of a step of an earlier slice came: the steps it held may now be ready."""
        self._unblock(self.after.pop(holder, ()))

    def _unblock(self, steps: Iterable[int]) -> None:
        blockers = self.blockers
        for after in steps:
            blockers[after] -= 1
            if blockers[after] == 0:
                heapq.heappush(self.ready, after)
