"""``SERIALIZABLE`` reads: a read-only client transaction every app has, ``epochal.read``.

A serializable read is sequenced through the command log like any client transaction
(docs/queries.md, isolation levels): it declares the keys it reads, runs at its timestamp on the
workers that own them (which exchange the values Calvin-style), and its reply on
``<app>.replies`` carries the values. So it sees every transaction sequenced before it — a
client's own committed ``submit`` included — and pays an epoch's latency.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from epochal.schemas.commands import ActorKey

if TYPE_CHECKING:
    from epochal.actors.api import App
    from epochal.actors.context import Context

__all__ = ["READ_HANDLER", "ReadKeys", "read_handler_parts"]

READ_HANDLER = "epochal.read"


class ReadKeys(msgspec.Struct, frozen=True):
    """The actors one serializable read reads: ``[actor type, key]`` pairs, in reply order."""

    refs: list[tuple[str, ActorKey]]


def read_handler_parts(app: App) -> tuple[Any, Any]:
    """The handler function and key function of ``app``'s ``epochal.read``."""
    types = app.actor_types

    def keys(event: ReadKeys) -> Mapping[type, Iterable[ActorKey]]:
        wanted: dict[type, list[ActorKey]] = {}
        for name, key in event.refs:
            wanted.setdefault(types[name].state, []).append(key)
        return wanted

    def read(ctx: Context, event: ReadKeys) -> list[msgspec.Struct | None]:
        found: list[msgspec.Struct | None] = []
        for name, key in event.refs:
            state = types[name].state
            found.append(ctx.get(state, key) if ctx.exists(state, key) else None)
        return found

    return read, keys
