"""Version 4: version 3's rename, with the migration that carries each balance over."""

from __future__ import annotations

from typing import Any

import msgspec

from epochal.actors.api import App
from epochal.actors.context import Context
from tests.integration.evolving.s1 import Deposit

app = App("ledger")


@app.actor(key=int)
class Account(msgspec.Struct):
    funds: float = 0.0
    deposits: int = 0


@app.migration(Account)
def balance_to_funds(old: dict[str, Any]) -> Account:
    return Account(funds=old["balance"], deposits=old.get("deposits", 0))


@app.transaction(topic="deposits", event=Deposit, keys=lambda e: {Account: [e.account]})
def deposit(ctx: Context, e: Deposit) -> None:
    account = ctx.get(Account, e.account)
    account.funds += e.amount
    account.deposits += 1
    ctx.put(e.account, account)
    ctx.egress("receipts", {"account": e.account, "balance": account.funds})
