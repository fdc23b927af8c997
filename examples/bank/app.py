"""TSpoon's bank: deposits and transfers between 10,000 accounts, never overdrawn.

Run it with ``epochal run examples.bank.app:app``. Both event types share the input topic
``bank.in.transfers``: they are msgspec *tagged* structs, so a record says what it is
(``{"type": "Transfer", "source": "acct-0001", "target": "acct-0002", "amount": 5}``).

Why it is a good first example: a transfer reads and writes two accounts that usually live on
different partitions, and the constraint ``balance >= 0`` makes an overdraft abort the whole
transfer (neither account changes). Money is conserved whatever the interleaving, which is the
invariant the tests check against the serial oracle.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from epochal.actors.api import App
from epochal.actors.context import Context

__all__ = [
    "ACCOUNTS",
    "Account",
    "Deposit",
    "Receipt",
    "Transfer",
    "account_key",
    "app",
    "deposit",
    "transfer",
]

ACCOUNTS = 10_000

# Schema-level validation: a record that breaks these never becomes a transaction, it goes to the
# dead-letter topic with the reason (docs/concepts.md). Business rules (no overdraft) are aborts.
AccountKey = Annotated[str, msgspec.Meta(pattern=r"^acct-\d{4}$")]
Amount = Annotated[int, msgspec.Meta(gt=0)]


def account_key(number: int) -> str:
    """``acct-0042``: fixed width, so the string order of keys is their numeric order."""
    return f"acct-{number:04d}"


app = App("bank")


@app.actor(
    key=str,
    constraints={"balance >= 0": lambda a: a.balance >= 0},
    # every key, so the ranges split evenly over any number of partitions
    key_sample=[account_key(i) for i in range(ACCOUNTS)],
)
class Account(msgspec.Struct):
    """One account's balance, in cents."""

    balance: int = 0


class Deposit(msgspec.Struct, frozen=True, tag=True):
    """Money from outside the bank into one account."""

    account: AccountKey
    amount: Amount


class Transfer(msgspec.Struct, frozen=True, tag=True):
    """Money from one account to another; all or nothing."""

    source: AccountKey
    target: AccountKey
    amount: Amount


class Receipt(msgspec.Struct, frozen=True):
    """What ``bank.out.receipts`` says about a committed transfer."""

    source: str
    target: str
    amount: int
    source_balance: int
    target_balance: int
    at_ms: int


@app.transaction(topic="transfers", event=Deposit, keys=lambda e: {Account: [e.account]})
def deposit(ctx: Context, e: Deposit) -> None:
    """Credit one account."""
    account = ctx.get(Account, e.account)
    account.balance += e.amount
    ctx.put(e.account, account)


@app.transaction(
    topic="transfers",
    event=Transfer,
    keys=lambda e: {Account: [e.source, e.target]},
    aborts_to="errors",
    client=True,
)
def transfer(ctx: Context, e: Transfer) -> None:
    """Move money; an overdraft breaks ``balance >= 0`` and aborts the whole transfer."""
    if e.source == e.target:
        raise ValueError(f"transfer from {e.source} to itself")
    source, target = ctx.get(Account, e.source), ctx.get(Account, e.target)
    source.balance -= e.amount
    target.balance += e.amount
    ctx.put(e.source, source)
    ctx.put(e.target, target)
    ctx.egress(
        "receipts",
        Receipt(e.source, e.target, e.amount, source.balance, target.balance, ctx.now()),
    )
