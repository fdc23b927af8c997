"""A test app whose one transaction reads a topic epochal did not create, by its full name
(``external_topic=``): the name comes from ``$EPOCHAL_TEST_EXTERNAL_TOPIC``, so that each test
gets its own topic while the cluster's processes import this module by name."""

from __future__ import annotations

import os

import msgspec

from epochal.actors.api import App
from epochal.actors.context import Context

__all__ = ["Add", "Tally", "Total", "app"]

KEYS = 8
app = App("extapp")


@app.actor(key=int, key_sample=range(KEYS))
class Tally(msgspec.Struct):
    total: int = 0


class Add(msgspec.Struct, frozen=True):
    key: int
    amount: int


class Total(msgspec.Struct, frozen=True):
    key: int
    total: int


@app.transaction(
    event=Add,
    keys=lambda e: {Tally: [e.key]},
    external_topic=os.environ.get("EPOCHAL_TEST_EXTERNAL_TOPIC", "payments.external"),
)
def add(ctx: Context, e: Add) -> None:
    tally = ctx.get(Tally, e.key)
    tally.total += e.amount
    ctx.put(e.key, tally)
    ctx.egress("totals", Total(e.key, tally.total))
