"""Version 2 of the wallet app: the fix. A top-up of 13 counts double, so that a test can tell
which version ran it."""

from __future__ import annotations

import msgspec

from epochal.actors.api import App
from epochal.actors.context import Context

app = App("wallets")


@app.actor(key=int, key_sample=range(40))
class Wallet(msgspec.Struct):
    balance: int = 0


class TopUp(msgspec.Struct, frozen=True):
    wallet: int
    amount: int


class Receipt(msgspec.Struct, frozen=True):
    wallet: int
    balance: int


@app.transaction(topic="topups", event=TopUp, keys=lambda e: {Wallet: [e.wallet]})
def top_up(ctx: Context, e: TopUp) -> None:
    wallet = ctx.get(Wallet, e.wallet)
    wallet.balance += 2 * e.amount if e.amount == 13 else e.amount
    ctx.put(e.wallet, wallet)
    ctx.egress("receipts", Receipt(e.wallet, wallet.balance))
