"""A user's app as a new user writes it: str keys (``sku-0042``, ``o-17``), no ``key_sample``.

Every key starts with ``o`` or ``s``: the default split points put them all in the last
partitions, so a cluster of this app starts skewed, and must learn its split points.
"""

from __future__ import annotations

import msgspec

from epochal.actors.api import App
from epochal.actors.context import Context

app = App("shop")


@app.actor()
class Stock(msgspec.Struct):
    units: int = 0
    sold: int = 0


@app.actor()
class Order(msgspec.Struct):
    sku: str = ""
    units: int = 0


class Restock(msgspec.Struct, frozen=True, tag=True):
    sku: str
    units: int


class Buy(msgspec.Struct, frozen=True, tag=True):
    order: str
    sku: str
    units: int


class Receipt(msgspec.Struct, frozen=True):
    order: str
    sku: str
    units: int


@app.transaction(topic="orders", event=Restock, keys=lambda e: {Stock: [e.sku]})
def restock(ctx: Context, e: Restock) -> None:
    stock = ctx.get(Stock, e.sku)
    stock.units += e.units
    ctx.put(e.sku, stock)


@app.transaction(
    topic="orders",
    event=Buy,
    keys=lambda e: {Stock: [e.sku], Order: [e.order]},
    aborts_to="errors",
)
def buy(ctx: Context, e: Buy) -> None:
    stock = ctx.get(Stock, e.sku)
    if stock.units < e.units:
        raise ValueError("out of stock")
    stock.units -= e.units
    stock.sold += e.units
    ctx.put(e.sku, stock)
    ctx.put(e.order, Order(e.sku, e.units))
    ctx.egress("receipts", Receipt(e.order, e.sku, e.units))
