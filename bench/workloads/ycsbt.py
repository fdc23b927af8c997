"""YCSB-T as Styx (SIGMOD 2025) runs it: transactions of 2 reads and 2 writes over 10,000 keys.

Each transaction reads two distinct rows and writes both: it moves one unit from the first to the
second, and aborts if the first has none left (so reads decide what is written, and the
constraint is checked on every write). Keys are uniform or Zipf-skewed (``--zipf 0.99``); a share
``--multi-partition`` of the transactions (0, 0.25, 0.5, 1) has its two keys on two partitions
of the cluster's layout, the others on one. Every row starts with ``--start`` units, loaded by one
``Load`` record per row before the measured transactions.

    epochal bench ycsbt --zipf 0.99 --multi-partition 0.25
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import ClassVar

import msgspec

from bench.workloads.base import Backlog, KeyChooser, Record, Workload, encode
from epochal.actors.api import App
from epochal.actors.context import Context

__all__ = ["Load", "Row", "Txn", "YcsbT", "app"]

KEYS = 10_000

app = App("ycsbt")


@app.actor(key=int, key_sample=range(KEYS), constraints={"value >= 0": lambda r: r.value >= 0})
class Row(msgspec.Struct):
    value: int = 0


class Load(msgspec.Struct, frozen=True, tag=True):
    """Set a row's starting value (before the measured transactions)."""

    key: int
    value: int


class Txn(msgspec.Struct, frozen=True, tag=True):
    """Read ``a`` and ``b``, write both: one unit from ``a`` to ``b``."""

    a: int
    b: int


class Result(msgspec.Struct, frozen=True):
    a: int
    b: int
    a_value: int
    b_value: int


@app.transaction(topic="txns", event=Load, keys=lambda e: {Row: [e.key]})
def load(ctx: Context, e: Load) -> None:
    ctx.put(e.key, Row(e.value))


@app.transaction(topic="txns", event=Txn, keys=lambda e: {Row: [e.a, e.b]}, aborts_to="errors")
def txn(ctx: Context, e: Txn) -> None:
    a, b = ctx.get(Row, e.a), ctx.get(Row, e.b)
    a.value -= 1  # below zero breaks ``value >= 0``: the transaction aborts, nothing changes
    b.value += 1
    ctx.put(e.a, a)
    ctx.put(e.b, b)
    ctx.egress("results", Result(e.a, e.b, a.value, b.value))


@dataclass(frozen=True)
class YcsbT(Workload):
    """YCSB-T's parameters: key space, skew, multi-partition share, starting value."""

    name: ClassVar[str] = "ycsbt"
    app: ClassVar[str] = "bench.workloads.ycsbt:app"
    outputs: ClassVar[tuple[str, ...]] = ("results", "errors")
    summary: ClassVar[str] = (
        "YCSB-T as Styx runs it: each transaction reads two of 10,000 rows and writes both (one "
        "unit from the first to the second, aborting when the first has none left)."
    )
    anchor: ClassVar[str] = (
        "Styx (SIGMOD 2025): 15,517 TPS on 2 one-CPU workers (its coordinator and Kafka on "
        "other machines); ~6.2k TPS per core at 0 % multi-partition, ~3.3k at 100 % (32 "
        "workers); p50/p99 19/34 ms at 2k TPS"
    )
    anchor_rate: ClassVar[int | None] = 2_000

    keys: int = KEYS
    zipf: float = 0.0
    multi_partition: float = 0.0
    start: int = 100

    def backlog(self, transactions: int, partitions: int, seed: int) -> Backlog:
        rng = random.Random(seed)
        choose = KeyChooser(app, "Row", range(self.keys), partitions, theta=self.zipf, rng=rng)
        records = [
            Record("txns", b"%d" % key, encode(Load(key, self.start))) for key in range(self.keys)
        ]
        for _ in range(transactions):
            a, b = choose.distinct(2, rng.random() < self.multi_partition)
            records.append(Record("txns", b"%d" % a, encode(Txn(a, b))))
        return Backlog(records, transactions)

    def anchor_per_core(self) -> float | None:
        """Styx's per core: 15,517 TPS on 2 workers at 0 % multi-partition (the setup nearest
        this machine's), ~3.3k at 100 %; none in between."""
        return {0.0: 15_517 / 2, 1.0: 3_300.0}.get(self.multi_partition)

    def plain(self) -> PlainYcsbT:
        return PlainYcsbT()


class PlainYcsbT:
    """The same rules over a dict of row values."""

    def __init__(self) -> None:
        self.state: dict[int, int] = {}
        self._decoder = msgspec.msgpack.Decoder(Load | Txn)

    def __call__(self, topic: str, value: bytes) -> tuple[str, bytes] | None:
        event = self._decoder.decode(value)
        if isinstance(event, Load):
            self.state[event.key] = event.value
            return None
        rows = self.state
        a_value = rows.get(event.a, 0) - 1
        if a_value < 0:
            return "errors", encode(event)
        b_value = rows.get(event.b, 0) + 1
        rows[event.a], rows[event.b] = a_value, b_value
        return "results", encode(Result(event.a, event.b, a_value, b_value))
