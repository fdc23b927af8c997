"""The executor's per-key chains across two workers: a transaction waiting for another worker's
reads holds its local keys, so a later transaction on one of them waits for it, and nothing
runs twice or is lost, whatever order the reads arrive in."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Sequence

from epochal.actors.executor import EpochExecutor, share_slices
from epochal.actors.oracle import SerialOracle
from epochal.actors.partitioning import KeyRanges
from epochal.actors.plan import EpochClock
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
            self.buffered: list[tuple[int, int, int, tuple[KeyRef, ...], list[bytes | None]]] = []

        def send(
            self,
            to: int,
            epoch: int,
            seq: int,
            refs: tuple[KeyRef, ...],
            values: list[bytes | None],
        ) -> None:
            self.buffered.append((to, epoch, seq, refs, list(values)))

        async def flush(self) -> None:
            sends, self.buffered = self.buffered, []
            for _ in range(self.exchange.delay[self.worker]):
                await asyncio.sleep(0)
            for to, epoch, seq, refs, values in sends:
                self.exchange.executors[to].receive(epoch, seq, refs, values)


def _accounts(workers: int = 2) -> dict[int, list[int]]:
    """The accounts of each partition, when each of ``workers`` runs one."""
    ranges = KeyRanges.even(app, workers)
    on: dict[int, list[int]] = {w: [] for w in range(workers)}
    for account in range(40):
        on[ranges.partition_of(KeyRef("Account", account))].append(account)
    return on


def _run(batches: list[list[object]], delay: Sequence[int]) -> list[dict[KeyRef, bytes]]:
    """Run ``batches`` on one worker per entry of ``delay`` (its partition: its number)."""
    records = command_log(batches)
    workers = range(len(delay))
    ranges = KeyRanges.even(app, len(delay))
    executors = [EpochExecutor(app, w, [PartitionId(w)], StateStore([PartitionId(w)]))
                 for w in workers]  # fmt: skip
    exchange = HeldExchange(executors, delay)

    async def worker(w: int) -> None:
        for record in records:
            slices = share_slices(app, record, [], ranges, worker_of=list(workers), worker=w)
            steps = [step for part in slices for step in part]
            await executors[w].run_epoch(
                EpochClock.of(record), steps, exchange.of(w), defaultdict(int)
            )

    async def both() -> None:
        await asyncio.gather(*(worker(w) for w in workers))

    asyncio.run(asyncio.wait_for(both(), 10))  # a read lost or waited for twice: it fails
    return [dict(e.store.items()) for e in executors]


def test_a_later_local_transaction_waits_for_a_cross_worker_one_on_its_key() -> None:
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
        stores = _run(batches, delay)
        merged = {ref: value for store in stores for ref, value in store.items()}
        assert merged == oracle.state, delay
        balances = {
            ref.key: decode_canonical(value, Account).balance
            for ref, value in merged.items()
            if ref.actor_type == "Account"
        }
        assert balances == {a: 100 - 70 + 5 + 1, b: 100 + 70 - 1, c: 100 - 5}, delay


def test_a_transaction_on_three_workers_runs_once_the_reads_of_both_others_came() -> None:
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
        stores = _run(batches, delay)
        merged = {ref: value for store in stores for ref, value in store.items()}
        assert merged == oracle.state, delay
        balances = {ref.key: decode_canonical(value, Account).balance
                    for ref, value in merged.items() if ref.actor_type == "Account"}  # fmt: skip
        assert balances == {a: 100 - 40 + 5 + 5 - 1, b: 100 + 20 - 5 + 5, c: 100 + 20 - 10 + 1}
