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
no two runs ever share a value. Transactions wait in per-key chains built once per epoch, so a
transaction is looked at again only when one of its chains moves, however many exchange rounds
the epoch takes; sends are buffered and flushed once per round, when nothing more can run.
There is no deadlock: every worker follows the same global order, so each wait is on a
transaction that every participant reaches.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

import msgspec

from epochal.actors.api import App
from epochal.actors.context import run_transaction
from epochal.actors.outcome import BY_SEQ, TxnOutcome
from epochal.actors.partitioning import KeyRanges
from epochal.actors.plan import EpochClock, Invocation
from epochal.actors.store import StateStore
from epochal.actors.watchdog import RUNNING
from epochal.schemas.commands import KeyRef, PartitionId

__all__ = ["EpochExecutor", "Exchange", "Reads", "Step", "runs_on", "split_plan"]

Reads = dict[KeyRef, bytes | None]


class Exchange(Protocol):
    """Carries read values to other workers (TCP, or nothing for a single worker)."""

    def send(self, to: int, epoch: int, seq: int, reads: Reads) -> None: ...

    async def flush(self) -> None: ...


class Step(msgspec.Struct):
    """One transaction as one worker sees it: the participating workers and its own keys.

    ``partitions[i]`` owns ``local_keys[i]``; ``reporter`` is the partition that reports the
    outcome if this worker owns it, else None. A struct: one is made per transaction.
    """

    invocation: Invocation
    workers: tuple[int, ...]
    local_keys: tuple[KeyRef, ...]
    partitions: tuple[PartitionId, ...]
    reporter: PartitionId | None
    sent: bool = False


def runs_on(
    ranges: KeyRanges, worker_of: Sequence[int], worker: int
) -> Callable[[tuple[KeyRef, ...]], bool] | None:
    """Whether a transaction with these keys runs on ``worker`` (one that touches a key of its
    partitions, or partition 0's worker for one without keys); None when it runs everything."""
    if all(w == worker for w in worker_of):
        return None
    points, mine = ranges.partition_of, {p for p, w in enumerate(worker_of) if w == worker}

    def runs_here(keys: tuple[KeyRef, ...]) -> bool:
        if not keys:
            return worker_of[0] == worker
        return any(points(ref) in mine for ref in keys)

    return runs_here


def split_plan(
    plan: Sequence[Invocation], ranges: KeyRanges, worker_of: Sequence[int], worker: int
) -> list[Step]:
    """This worker's share of an epoch, in timestamp order; ``worker_of[p]`` owns partition p."""
    steps: list[Step] = []
    partitions_of = ranges.partitions_of_keys
    for invocation in plan:
        keys = invocation.keys
        parts = partitions_of(keys)
        lowest = min(parts) if parts else PartitionId(0)
        workers = tuple(sorted({worker_of[p] for p in parts})) if parts else (worker_of[0],)
        if worker not in workers:
            continue
        if len(workers) == 1:
            local, local_parts = keys, parts
        else:
            mine = [i for i, p in enumerate(parts) if worker_of[p] == worker]
            local, local_parts = tuple(keys[i] for i in mine), tuple(parts[i] for i in mine)
        reporter = lowest if worker_of[lowest] == worker else None
        steps.append(Step(invocation, workers, local, local_parts, reporter))
    return steps


class EpochExecutor:
    """Runs this worker's share of each epoch on its :class:`StateStore`."""

    def __init__(self, app: App, worker: int, partitions: Iterable[PartitionId], store: StateStore):
        self.app = app
        self.worker = worker
        self.partitions = tuple(partitions)
        self.store = store
        self._inbox: dict[tuple[int, int], Reads] = {}
        self._arrived = asyncio.Event()

    def receive(self, epoch: int, seq: int, reads: Reads) -> None:
        """Values another worker read for transaction ``(epoch, seq)``."""
        self._inbox.setdefault((epoch, seq), {}).update(reads)
        self._arrived.set()

    def run_alone(
        self,
        clock: EpochClock,
        plan: Sequence[Invocation],
        ranges: KeyRanges,
        ran: dict[PartitionId, int],
    ) -> dict[PartitionId, list[TxnOutcome]]:
        """Run a whole epoch on a worker that owns every partition (one worker; replay): in
        timestamp order, with no chains, no exchange and no :class:`Step` per transaction.
        Counts in ``ran`` the transactions each partition took part in."""
        reported: dict[PartitionId, list[TxnOutcome]] = {p: [] for p in self.partitions}
        app, values, apply, epoch = self.app, self.store.values, self.store.apply, clock.epoch
        partitions_of = ranges.partitions_of_keys
        for invocation in plan:
            keys = invocation.keys
            parts = partitions_of(keys)
            if len(parts) == 1:
                reporter = parts[0]
                ran[reporter] += 1
            elif parts:
                reporter = min(parts)
                for p in set(parts):
                    ran[p] += 1
            else:  # no keys: partition 0 reports it
                reporter = PartitionId(0)
            RUNNING.invocation = invocation  # for the watchdog of a handler that hangs
            try:
                outcome = run_transaction(app, invocation, values, clock)
            finally:
                RUNNING.invocation = None
            if outcome.committed:  # the handler read the store itself: apply after it ran
                for ref, value in outcome.writes.items():
                    apply(ref, parts[keys.index(ref)], value, epoch)
            reported[reporter].append(outcome)
        return reported

    async def run_epoch(
        self,
        clock: EpochClock,
        steps: list[Step],
        exchange: Exchange,
        ran: dict[PartitionId, int],
    ) -> dict[PartitionId, list[TxnOutcome]]:
        """Run this worker's share of an epoch; the outcomes each local partition reports.
        Counts in ``ran`` the transactions each local partition takes part in."""
        reported: dict[PartitionId, list[TxnOutcome]] = {p: [] for p in self.partitions}
        _count_parts(steps, ran)
        if all(len(step.workers) == 1 for step in steps):  # nothing to wait for: in order
            for step in steps:
                self._execute(clock, step, {}, reported)
            return reported
        chains = _Chains(steps)
        waiting: list[int] = []  # cross-worker steps whose local keys are final, reads sent
        while chains.left:
            while chains.ready:
                index = heapq.heappop(chains.ready)
                step = steps[index]
                if len(step.workers) > 1:
                    self._send_reads(step, exchange)
                    remote = self._remote(step)
                    if remote is None:
                        waiting.append(index)
                        continue
                else:
                    remote = {}
                self._execute(clock, step, remote, reported)
                chains.done(index)
            await exchange.flush()
            if chains.left and not chains.ready:
                await self._arrived.wait()
                self._arrived.clear()
                still: list[int] = []
                for index in waiting:
                    if self._has_reads(steps[index]):
                        heapq.heappush(chains.ready, index)
                    else:
                        still.append(index)
                waiting = still
        for outcomes in reported.values():  # in timestamp order, whatever the arrival order
            outcomes.sort(key=BY_SEQ)
        return reported

    def _has_reads(self, step: Step) -> bool:
        remote = self._inbox.get((step.invocation.epoch, step.invocation.seq), {})
        return len(remote) + len(step.local_keys) >= len(step.invocation.keys)

    def _remote(self, step: Step) -> Mapping[KeyRef, bytes | None] | None:
        """The other workers' reads of ``step``, taken from the inbox; None until all came."""
        if not self._has_reads(step):
            return None
        return self._inbox.pop((step.invocation.epoch, step.invocation.seq), {})

    def _send_reads(self, step: Step, exchange: Exchange) -> None:
        if step.sent:
            return
        values = self.store.values
        reads = {ref: values.get(ref) for ref in step.local_keys}
        for other in step.workers:
            if other != self.worker:
                exchange.send(other, step.invocation.epoch, step.invocation.seq, reads)
        step.sent = True

    def _execute(
        self,
        clock: EpochClock,
        step: Step,
        remote: Mapping[KeyRef, bytes | None],
        reported: dict[PartitionId, list[TxnOutcome]],
    ) -> None:
        values = self.store.values
        reads: Mapping[KeyRef, bytes | None]
        if len(step.workers) == 1:  # every key is here: the handler reads the store as it is
            reads = values  # (it writes to its context; the writes are applied below)
        else:
            reads = {ref: values.get(ref) for ref in step.local_keys}
            reads.update(remote)
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
