"""Version 6: version 4's rename with a migration that fails on one account (a bug in it)."""

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


@app.migration(Account)
def buggy(old: dict[str, Any]) -> Account:
    if old["balance"] == 30:
        return Account(funds=old["balance"] / 0)
    return Account(funds=old["balance"])


@app.transaction(topic="deposits", event=Deposit, keys=lambda e: {Account: [e.account]})
def deposit(ctx: Context, e: Deposit) -> None:
    account = ctx.get(Account, e.account)
    account.funds += e.amount
    ctx.put(e.account, account)
