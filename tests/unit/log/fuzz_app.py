"""An application that takes anything: ``Any``, list, dict and nested-struct fields, several tagged
event types on one topic, a client transaction, and key functions that fail in every way a key
function can (a RecursionError on deep input, keys too wide for msgpack, an unprintable error).

The fuzz test of the sequencer's pure path and the real-broker sequencer tests both run it.
"""

from __future__ import annotations

from typing import Any

import msgspec

from epochal.actors.api import App
from epochal.actors.context import Context

__all__ = ["TOPIC", "Blob", "Deep", "Listed", "Mapped", "Odd", "Poke", "app"]

app = App("fuzz")
TOPIC = "things"


@app.actor(key=str)
class Box(msgspec.Struct):
    count: int = 0


@app.actor(key=int)
class Counter(msgspec.Struct):
    count: int = 0


class Inner(msgspec.Struct, frozen=True):
    label: str
    weights: list[float] = []


class Blob(msgspec.Struct, frozen=True, tag=True):
    key: str
    payload: Any = None


class Listed(msgspec.Struct, frozen=True, tag=True):
    key: str
    items: list[Any] = []
    inner: Inner | None = None


class Mapped(msgspec.Struct, frozen=True, tag=True):
    key: str
    table: dict[str, Any] = {}
    inners: list[Inner] = []


class Deep(msgspec.Struct, frozen=True, tag=True):
    """Its key function walks the payload: deep nesting makes it raise RecursionError."""

    payload: Any = None


class Odd(msgspec.Struct, frozen=True, tag=True):
    """Its key function returns keys msgpack cannot hold, recurses forever, or raises an
    unprintable error, depending on ``key``."""

    key: str
    n: int = 0


class Poke(msgspec.Struct, frozen=True):
    key: str
    payload: Any = None


class Unprintable(Exception):
    def __str__(self) -> str:
        raise ValueError("no text for this one")


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    return 0


def _odd_keys(e: Odd) -> dict[type, list[Any]]:
    if e.key.startswith("surrogate"):
        return {Box: [e.key + "\ud800"]}
    if e.key.startswith("wide"):
        return {Counter: [e.n << 70]}
    if e.key.startswith("unprintable"):
        raise Unprintable
    if e.key.startswith("recurse"):
        return _odd_keys(e)  # a RecursionError, whatever the event's depth
    return {Box: [e.key], Counter: [e.n]}


def _touch(ctx: Context, key: str) -> None:
    box = ctx.get(Box, key)
    box.count += 1
    ctx.put(key, box)


@app.transaction(topic=TOPIC, event=Blob, keys=lambda e: {Box: [e.key]})
def blob(ctx: Context, e: Blob) -> None:
    _touch(ctx, e.key)


@app.transaction(topic=TOPIC, event=Listed, keys=lambda e: {Box: [e.key]})
def listed(ctx: Context, e: Listed) -> None:
    _touch(ctx, e.key)


@app.transaction(topic=TOPIC, event=Mapped, keys=lambda e: {Box: [e.key]})
def mapped(ctx: Context, e: Mapped) -> None:
    _touch(ctx, e.key)


@app.transaction(topic=TOPIC, event=Deep, keys=lambda e: {Box: [str(_depth(e.payload))]})
def deep(ctx: Context, e: Deep) -> None:
    _touch(ctx, str(_depth(e.payload)))


@app.transaction(topic=TOPIC, event=Odd, keys=_odd_keys)
def odd(ctx: Context, e: Odd) -> None:
    _touch(ctx, e.key)


@app.transaction(event=Poke, keys=lambda e: {Box: [e.key]}, client=True)
def poke(ctx: Context, e: Poke) -> None:
    _touch(ctx, e.key)
