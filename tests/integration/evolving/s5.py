"""Version 5: ``deposits`` changed from a count to a struct, without a migration: refused."""

from __future__ import annotations

import msgspec

from epochal.actors.api import App
from epochal.actors.context import Context
from tests.integration.evolving.s1 import Deposit

app = App("ledger")


class Deposits(msgspec.Struct):
    count: int = 0
    total: float = 0.0


@app.actor(key=int)
class Account(msgspec.Struct):
    balance: float = 0.0
    deposits: Deposits = msgspec.field(default_factory=Deposits)


@app.transaction(topic="deposits", event=Deposit, keys=lambda e: {Account: [e.account]})
def deposit(ctx: Context, e: Deposit) -> None:
    account = ctx.get(Account, e.account)
    account.balance += e.amount
    ctx.put(e.account, account)
