"""Version 2: the balance widened to ``float``, a field added with its default, the audit
actor type gone: a start over version 1's snapshot needs no migration."""

from __future__ import annotations

import msgspec

from epochal.actors.api import App
from epochal.actors.context import Context
from tests.integration.evolving.s1 import Deposit

app = App("ledger")


@app.actor(key=int)
class Account(msgspec.Struct):
    balance: float = 0.0
    deposits: int = 0


@app.transaction(topic="deposits", event=Deposit, keys=lambda e: {Account: [e.account]})
def deposit(ctx: Context, e: Deposit) -> None:
    account = ctx.get(Account, e.account)
    account.balance += e.amount
    account.deposits += 1
    ctx.put(e.account, account)
    ctx.egress("receipts", {"account": e.account, "balance": account.balance})
