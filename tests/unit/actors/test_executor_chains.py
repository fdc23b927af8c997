"""The executor's per-key chains across two workers: a transaction waiting for another worker's
reads holds its local keys, so a later transaction on one of them waits for it, and nothing
runs twice or is lost, whatever order the reads arrive in."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from collections.abc import Sequence

import pytest

import epochal.actors.executor as executor_module
from epochal.actors.api import App
from epochal.actors.context import run_transaction
from epochal.actors.executor import EpochExecutor, share_slices
from epochal.actors.oracle import SerialOracle
from epochal.actors.outcome import TxnOutcome
from epochal.actors.partitioning import KeyRanges
from epochal.actors.plan import EpochClock, Invocation
from epochal.actors.store import StateStore
from epochal.schemas.canonical import decode_canonical
from epochal.schemas.commands import KeyRef, PartitionId
from tests.unit.actors.workload import Account, Deposit, Split, Transfer, app, command_log

Refs = tuple[KeyRef, ...]
Values = list[bytes | None]


class HeldExchange:
    """Reads between in-process executors, delivered when the sender flushes, after the
    receiver of the late side has had ``delay`` turns of the loop: the slow peer."""

    def __init__(self, executors: list[EpochExecutor], delay: Sequence[int]) -> None:
        self.executors, self.delay = executors, delay

    def of(self, worker: int) -> HeldExchange.Side:
        return HeldExchange.Side(self, worker)

    class Side:
        def __init__(self, exchange: HeldExchange, worker: int) -> None:
            self.exchange, self.worker = exchange, worker
            self.buffered: list[tuple[bool, int, int, int, Refs, Values]] = []

        def send_reads(self, to: int, epoch: int, seq: int, refs: Refs, values: Values) -> None:
            self.buffered.append((False, to, epoch, seq, refs, list(values)))

        def send_writes(self, to: int, epoch: int, seq: int, refs: Refs, values: Values) -> None:
            self.buffered.append((True, to, epoch, seq, refs, list(values)))

        async def flush(self) -> None:
            sends, self.buffered = self.buffered, []
            for _ in range(self.exchange.delay[self.worker]):
                await asyncio.sleep(0)
            for writes, to, epoch, seq, refs, values in sends:
                executor = self.exchange.executors[to]
                receive = executor.receive_writes if writes else executor.receive_reads
                receive(epoch, seq, refs, values)


def _accounts(workers: int = 2) -> dict[int, list[int]]:
    """The accounts of each partition, when each of ``workers`` runs one."""
    ranges = KeyRanges.even(app, workers)
    on: dict[int, list[int]] = {w: [] for w in range(workers)}
    for account in range(40):
        on[ranges.partition_of(KeyRef("Account", account))].append(account)
    return on


def _run(
    batches: list[list[object]], delay: Sequence[int], size: int = 512
) -> list[dict[KeyRef, bytes]]:
    """Run ``batches`` on one worker per entry of ``delay`` (its partition: its number), each
    epoch in slices of ``size`` transactions, as the engine does."""
    records = command_log(batches)
    workers = range(len(delay))
    ranges = KeyRanges.even(app, len(delay))
    executors = [EpochExecutor(app, w, [PartitionId(w)], StateStore([PartitionId(w)]))
                 for w in workers]  # fmt: skip
    exchange = HeldExchange(executors, delay)

    async def worker(w: int) -> None:
        for record in records:
            for steps in share_slices(
                app, record, [], ranges, worker_of=list(workers), worker=w, size=size
            ):
                await executors[w].run_epoch(
                    EpochClock.of(record), steps, exchange.of(w), defaultdict(int)
                )  # no barrier between epochs: a lent transaction holds its keys into the next

    async def both() -> None:
        await asyncio.gather(*(worker(w) for w in workers))

    asyncio.run(asyncio.wait_for(both(), 10))  # a read lost or waited for twice: it fails
    assert not any(e.unanswered for e in executors)
    return [dict(e.store.items()) for e in executors]


SLICES = pytest.mark.parametrize("size", [512, 1, 2], ids=lambda n: f"slices of {n}")
"""Whole epochs, and slices that end while a transaction lent to another worker waits for its
writes: the next slice's transactions on its keys wait for them."""


@SLICES
def test_a_later_local_transaction_waits_for_a_cross_worker_one_on_its_key(size: int) -> None:
    on = _accounts()
    a, c, b = on[0][0], on[0][1], on[1][0]  # a, c on worker 0; b on worker 1
    batches: list[list[object]] = [
        [Deposit(a, 100), Deposit(b, 100), Deposit(c, 100)],
        # a → b spans both workers; a → c, later, is worker 0's alone but on a's key: it must
        # see a's balance after a → b, however late worker 1's read of b comes
        [Transfer(a, b, 70), Transfer(a, c, 50), Transfer(c, a, 5), Transfer(b, a, 1)],
    ]
    oracle = SerialOracle(app)
    oracle.run(command_log(batches))
    for delay in ([0, 0], [0, 5], [5, 0]):
        stores = _run(batches, delay, size)
        merged = {ref: value for store in stores for ref, value in store.items()}
        assert merged == oracle.state, delay
        balances = {
            ref.key: decode_canonical(value, Account).balance
            for ref, value in merged.items()
            if ref.actor_type == "Account"
        }
        assert balances == {a: 100 - 70 + 5 + 1, b: 100 + 70 - 1, c: 100 - 5}, delay


@SLICES
def test_a_transaction_on_three_workers_runs_once_the_reads_of_both_others_came(
    size: int,
) -> None:
    """With three workers, one peer's reads may come before the other's: the transaction waits
    for both (each worker in turn hears from a slow peer last)."""
    on = _accounts(3)
    a, b, c = on[0][0], on[1][0], on[2][0]
    batches: list[list[object]] = [
        [Deposit(a, 100), Deposit(b, 100), Deposit(c, 100)],
        [Split(a, b, c, 40), Transfer(b, a, 5), Split(c, a, b, 10), Transfer(a, c, 1)],
    ]
    oracle = SerialOracle(app)
    oracle.run(command_log(batches))
    for delay in ([0, 0, 5], [0, 5, 0], [5, 0, 0], [0, 3, 6]):
        stores = _run(batches, delay, size)
        merged = {ref: value for store in stores for ref, value in store.items()}
        assert merged == oracle.state, delay
        balances = {ref.key: decode_canonical(value, Account).balance
                    for ref, value in merged.items() if ref.actor_type == "Account"}  # fmt: skip
        assert balances == {a: 100 - 40 + 5 + 5 - 1, b: 100 + 20 - 5 + 5, c: 100 + 20 - 10 + 1}


@SLICES
def test_each_transaction_runs_once_in_the_cluster(
    monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    """A transaction on keys of two or three workers runs its handler once (on the worker that
    owns the lowest of its partitions: test_plan); the others only lend their reads and apply
    its writes, and the state is the serial oracle's."""
    on = _accounts(3)
    a, b, c = on[0][0], on[1][0], on[2][0]
    batches: list[list[object]] = [
        [Deposit(a, 100), Deposit(b, 100), Deposit(c, 100)],
        [Transfer(b, c, 7), Split(c, b, a, 10), Transfer(c, a, 300), Transfer(a, b, 3)],
    ]
    ran: Counter[tuple[int, int]] = Counter()

    def counted(app: App, inv: Invocation, reads: object, clock: EpochClock) -> TxnOutcome:
        ran[(inv.epoch, inv.seq)] += 1
        return run_transaction(app, inv, reads, clock)  # type: ignore[arg-type]

    monkeypatch.setattr(executor_module, "run_transaction", counted)
    oracle = SerialOracle(app)
    oracle.run(command_log(batches))
    for delay in ([0, 0, 0], [4, 0, 2]):
        ran.clear()
        stores = _run(batches, delay, size)
        assert {ref: value for store in stores for ref, value in store.items()} == oracle.state
        timestamps = {(r.epoch, txn.seq) for r in command_log(batches) for txn in r.txns}
        assert ran == Counter(timestamps), delay  # each once, none lost
