"""Run an example app in memory: records -> epochs (the sequencer's pure core) -> engine, oracle.

No Kafka: the input records are built here, spread over input partitions with per-partition
offsets as Kafka would number them, and cut into epochs of a fixed size.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from epochal.actors.api import App
from epochal.actors.engine import EpochResult, LocalEngine
from epochal.actors.oracle import SerialOracle
from epochal.actors.outcome import TxnOutcome
from epochal.log.ordering import EpochStamp, order
from epochal.schemas.codec import decode
from epochal.schemas.commands import DeadLetter, EpochRecord, InputRecord

__all__ = ["Log", "Run", "command_log", "outcomes", "run_engine", "run_oracle", "summary"]


@dataclass(frozen=True)
class Log:
    """A command log and what the sequencer sent to the dead letters on the way."""

    records: list[EpochRecord]
    dead: list[DeadLetter]

    def events(self, event_type: Any) -> list[Any]:
        """Every logged event decoded as ``event_type``, in timestamp order."""
        return [decode(t.event, event_type) for r in self.records for t in r.txns]


@dataclass(frozen=True)
class Run:
    """An engine after a run, and the epoch results it gave."""

    engine: LocalEngine
    results: list[EpochResult]

    def state(self, actor_type: str) -> dict[object, msgspec.Struct]:
        return {ref.key: v for ref, v in self.engine.items() if ref.actor_type == actor_type}

    def keys_per_partition(self, actor_type: str) -> Counter[int]:
        ranges = self.engine.ranges
        return Counter(
            int(ranges.partition_of(ref))
            for ref, _ in self.engine.store.items()
            if ref.actor_type == actor_type
        )


def command_log(
    app: App,
    topic: str,
    values: Sequence[bytes],
    epoch_size: int = 500,
    input_partitions: int = 3,
) -> Log:
    """Sequence ``values`` (record bytes, in produce order) into epochs of ``epoch_size``."""
    full_topic = app.topics.input(topic)
    offsets = [0] * input_partitions
    records: list[EpochRecord] = []
    dead: list[DeadLetter] = []
    code_hash = app.code_hash()
    for epoch, start in enumerate(range(0, len(values), epoch_size)):
        inputs = []
        for i, value in enumerate(values[start : start + epoch_size], start):
            partition = i % input_partitions
            inputs.append(InputRecord(full_topic, partition, offsets[partition], value))
            offsets[partition] += 1
        stamp = EpochStamp(epoch, 1_700_000_000_000 + 20 * epoch, 99 + epoch, code_hash)
        sequenced = order(app, stamp, inputs)
        records.append(sequenced.record)
        dead.extend(sequenced.dead)
    return Log(records, dead)


def run_engine(app: App, log: Log, partitions: int) -> Run:
    engine = LocalEngine(app, partitions)
    return Run(engine, asyncio.run(engine.run(log.records)))


def run_oracle(app: App, log: Log) -> list[EpochResult]:
    return SerialOracle(app).run(log.records)


def outcomes(results: Sequence[EpochResult]) -> list[TxnOutcome]:
    return [o for r in results for o in r.outcomes]


def summary(results: Sequence[EpochResult]) -> list[tuple[object, ...]]:
    """What must be equal between engine and oracle: digests, outcomes, reasons and egress."""
    return [
        (r.epoch, r.digest, [(o.seq, o.committed, o.reason, o.egress) for o in r.outcomes])
        for r in results
    ]
