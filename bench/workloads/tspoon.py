"""TSpoon's bank (JPDC 2020): transfers between two of 100,000 accounts, uniform, serializable.

TSpoon measured what transactions cost a stream processor: its bank moved money between
accounts drawn uniformly from 100,000, at its strongest isolation level (PL4, serializable),
and ran about **7x** slower than the same job on plain Flink without transactions. The same
ratio here is epochal's default cluster against the plain-Python baseline of this workload (the
same rules over a dict, on the same exactly-once Kafka batches, recovering nothing).

Every account opens with :data:`OPENING` cents (an account never written holds that, so no load
records precede the transfers). A transfer draws two distinct accounts uniformly from
``--accounts`` (spread over the whole key space, so over every partition's range: most
transfers cross partitions, as in TSpoon) and an amount up to half the opening balance; one that
would overdraw its source breaks ``balance >= 0`` and aborts, both accounts unchanged. A
committed transfer writes a receipt, an aborted one its abort report: one record each.

    epochal bench tspoon-bank --accounts 100000
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import ClassVar

import msgspec

from bench.workloads.base import Backlog, Record, Workload, encode
from epochal.actors.api import App
from epochal.actors.context import Context

__all__ = ["KEY_SPACE", "OPENING", "Account", "PlainTSpoonBank", "TSpoonBank", "Transfer", "app"]

KEY_SPACE = 100_000  # TSpoon's accounts: the app's key sample, and the most --accounts takes
OPENING = 1_000
TSPOON_SLOWDOWN = 7.0  # TSpoon's transactional bank against plain Flink without transactions

app = App("tspoon")


@app.actor(
    key=int, key_sample=range(KEY_SPACE), constraints={"balance >= 0": lambda a: a.balance >= 0}
)
class Account(msgspec.Struct):
    balance: int = OPENING


class Transfer(msgspec.Struct, frozen=True):
    """Move ``amount`` from ``source`` to ``target``, all or nothing."""

    source: int
    target: int
    amount: int


class Receipt(msgspec.Struct, frozen=True):
    source: int
    target: int
    amount: int
    source_balance: int
    target_balance: int


@app.transaction(
    topic="txns",
    event=Transfer,
    keys=lambda e: {Account: [e.source, e.target]},
    aborts_to="errors",
)
def transfer(ctx: Context, e: Transfer) -> None:
    source, target = ctx.get(Account, e.source), ctx.get(Account, e.target)
    source.balance -= e.amount  # below zero breaks ``balance >= 0``: the transfer aborts
    target.balance += e.amount
    ctx.put(e.source, source)
    ctx.put(e.target, target)
    ctx.egress("receipts", Receipt(e.source, e.target, e.amount, source.balance, target.balance))


@dataclass(frozen=True)
class TSpoonBank(Workload):
    """TSpoon's bank: how many accounts the transfers are drawn from, uniformly."""

    name: ClassVar[str] = "tspoon-bank"
    app: ClassVar[str] = "bench.workloads.tspoon:app"
    outputs: ClassVar[tuple[str, ...]] = ("receipts", "errors")
    summary: ClassVar[str] = (
        "TSpoon's bank: each transaction moves money between two of 100,000 accounts drawn "
        "uniformly (most on two partitions), aborting on an overdraft; serializable, as "
        "TSpoon's PL4. The plain-Python baseline runs the same transfers over a dict without "
        "transactions: the ratio TSpoon reports against Flink."
    )
    anchor: ClassVar[str] = (
        "TSpoon (JPDC 2020): bank transfers over 100,000 accounts, uniform, PL4 (serializable), "
        "ran about **7x** slower than plain Flink without transactions (its cluster, not this "
        "machine); the slowdown here is the plain-Python baseline's rate over epochal's"
    )
    anchor_slowdown: ClassVar[float | None] = TSPOON_SLOWDOWN

    accounts: int = KEY_SPACE

    def __post_init__(self) -> None:
        if not 2 <= self.accounts <= KEY_SPACE:
            raise ValueError(
                f"accounts: 2 to {KEY_SPACE:,} (the app's key space), not {self.accounts:,}"
            )

    def backlog(self, transactions: int, partitions: int, seed: int) -> Backlog:
        rng = random.Random(seed)
        keys = [i * KEY_SPACE // self.accounts for i in range(self.accounts)]
        records = []
        for _ in range(transactions):
            source, target = rng.sample(keys, 2)
            transfer = Transfer(source, target, rng.randrange(1, OPENING // 2))
            records.append(Record("txns", b"%d" % source, encode(transfer)))
        return Backlog(records, transactions)

    def plain(self) -> PlainTSpoonBank:
        return PlainTSpoonBank()


class PlainTSpoonBank:
    """The same rules over a dict of balances."""

    def __init__(self) -> None:
        self.state: dict[int, int] = {}
        self._decoder = msgspec.msgpack.Decoder(Transfer)

    def __call__(self, topic: str, value: bytes) -> tuple[str, bytes] | None:
        e = self._decoder.decode(value)
        balances = self.state
        source = balances.get(e.source, OPENING) - e.amount
        if source < 0:
            return "errors", encode(e)
        target = balances.get(e.target, OPENING) + e.amount
        balances[e.source], balances[e.target] = source, target
        return "receipts", encode(Receipt(e.source, e.target, e.amount, source, target))
