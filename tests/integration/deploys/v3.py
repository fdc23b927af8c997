"""Version 3 of the wallet app: ``top_up`` renamed ``credit``, a handler the command log of
earlier versions still names."""

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


@app.transaction(topic="topups", event=TopUp, keys=lambda e: {Wallet: [e.wallet]})
def credit(ctx: Context, e: TopUp) -> None:
    wallet = ctx.get(Wallet, e.wallet)
    wallet.balance += e.amount
    ctx.put(e.wallet, wallet)
