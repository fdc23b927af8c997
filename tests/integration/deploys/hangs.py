"""A version of the wallet app whose top-up of 13 never returns (a loop, like a real poison
input that hangs its worker) and whose top-up of 7 is slow but finite (2 s: under the default
hang bound of 3 s, and not taken for a hang)."""

from __future__ import annotations

import time

import msgspec

from epochal.actors.api import App
from epochal.actors.context import Context

app = App("wallets")
SLOW_S = 2.0


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
    while e.amount == 13:
        pass
    if e.amount == 7:
        time.sleep(SLOW_S)
    wallet = ctx.get(Wallet, e.wallet)
    wallet.balance += e.amount
    ctx.put(e.wallet, wallet)
    ctx.egress("receipts", Receipt(e.wallet, wallet.balance))
