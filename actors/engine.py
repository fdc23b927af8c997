"""Several partitions on one asyncio loop, executing command-log epochs one after another.

The partitions exchange reads through :class:`LocalExchange` (direct delivery, no copies: a
stored value is never mutated, writes replace it). A worker process runs one of these; the
exchange between workers is the same protocol over TCP.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import msgspec

from epochal.actors.api import App
from epochal.actors.digest import state_digest
from epochal.actors.executor import PartitionExecutor, Reads
from epochal.actors.outcome import TxnOutcome
from epochal.actors.partitioning import KeyRanges
from epochal.actors.plan import Emitted, EpochClock, emitted_by, plan_epoch
from epochal.schemas.commands import EpochRecord, KeyRef, PartitionId

__all__ = ["EpochResult", "LocalEngine", "LocalExchange"]


class LocalExchange:
    """Delivers reads straight to partitions of the same process."""

    def __init__(self, partitions: dict[PartitionId, PartitionExecutor]) -> None:
        self._partitions = partitions

    def send(self, to: PartitionId, epoch: int, seq: int, reads: Reads) -> None:
        self._partitions[to].receive(epoch, seq, reads)

    async def flush(self) -> None:
        await asyncio.sleep(0)  # let the receivers run


@dataclass(frozen=True)
class EpochResult:
    """The outcomes of one epoch in timestamp order, and the state digest after it."""

    epoch: int
    outcomes: tuple[TxnOutcome, ...]
    digest: str


class LocalEngine:
    """All partitions of a cluster in one process.

    >>> engine = LocalEngine(app, partitions=4)
    >>> results = asyncio.run(engine.run(epoch_records))
    """

    def __init__(self, app: App, partitions: int) -> None:
        self.app = app
        self.ranges = KeyRanges.even(app, partitions)
        self.partitions = {
            PartitionId(p): PartitionExecutor(PartitionId(p), app, self.ranges)
            for p in range(partitions)
        }
        self.exchange = LocalExchange(self.partitions)
        self.carried: list[Emitted] = []

    async def run_epoch(self, record: EpochRecord) -> EpochResult:
        clock = EpochClock.of(record)
        plan = plan_epoch(self.app, record, self.carried)
        reported = await asyncio.gather(
            *(p.run_epoch(clock, plan, self.exchange) for p in self.partitions.values())
        )
        outcomes = tuple(sorted((o for part in reported for o in part), key=lambda o: o.seq))
        self.carried = emitted_by(outcomes)
        return EpochResult(record.epoch, outcomes, self.digest())

    async def run(self, records: Iterable[EpochRecord]) -> list[EpochResult]:
        return [await self.run_epoch(record) for record in records]

    def items(self) -> Iterator[tuple[KeyRef, msgspec.Struct]]:
        for partition in self.partitions.values():
            yield from partition.store.items()

    def digest(self) -> str:
        return state_digest(self.items())
