"""Version 1 of a wallet app: a top-up of 13 crashes its worker (a RecursionError is a crash,
not an abort: docs/concepts.md), every time, like a real poison input."""

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
    if e.amount == 13:
        raise RecursionError("unlucky")
    wallet = ctx.get(Wallet, e.wallet)
    wallet.balance += e.amount
    ctx.put(e.wallet, wallet)
    ctx.egress("receipts", Receipt(e.wallet, wallet.balance))
