"""Version 1 of a ledger: accounts with an ``int`` balance, and an audit counter (a second
actor type, which version 2 drops)."""

from __future__ import annotations

import msgspec

from epochal.actors.api import App
from epochal.actors.context import Context

app = App("ledger")


@app.actor(key=int)
class Account(msgspec.Struct):
    balance: int = 0


@app.actor(key=int)
class Audit(msgspec.Struct):
    deposits: int = 0


class Deposit(msgspec.Struct, frozen=True):
    account: int
    amount: int


@app.transaction(topic="deposits", event=Deposit,
                 keys=lambda e: {Account: [e.account], Audit: [0]})  # fmt: skip
def deposit(ctx: Context, e: Deposit) -> None:
    account = ctx.get(Account, e.account)
    account.balance += e.amount
    ctx.put(e.account, account)
    audit = ctx.get(Audit, 0)
    audit.deposits += 1
    ctx.put(0, audit)
    ctx.egress("receipts", {"account": e.account, "balance": account.balance})
