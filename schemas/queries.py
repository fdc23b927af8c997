"""The live query protocol between the client library and each worker's query server.

Frames are length-prefixed msgpack (a 4-byte big-endian length, then the frame), in both
directions, pipelined: a client sends many requests without waiting, each with its own ``id``,
and the server answers each one (in order, per connection). A connection starts with
:class:`Hello` (the shared token) and the server answers with the cluster's :class:`Layout`.

Every reply carries the worker's cluster ``generation``: a reply of another generation than the
client's layout means the cluster rolled back, and the client learns the layout again. Values
travel as the canonical msgpack bytes the store holds; the client decodes them with the actor
type's schema.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

import msgspec

from epochal.schemas.commands import ActorKey

__all__ = [
    "Aggregated",
    "Condition",
    "Failed",
    "Get",
    "Hello",
    "Layout",
    "QueryCode",
    "ReadLevel",
    "Reply",
    "Request",
    "Rows",
    "Scan",
    "Values",
]


class ReadLevel(IntEnum):
    """How current a live read is (docs/queries.md): the two isolation levels a query server
    answers (``SERIALIZABLE`` reads go through the command log, snapshots to Delta)."""

    LIVE = 0  # the newest value in memory, perhaps of the running epoch
    COMMITTED = 1  # as of an epoch every partition has completed


class QueryCode:
    """Why a request failed; the retryable ones say the client should ask again."""

    BAD_TOKEN = "bad_token"
    BAD_REQUEST = "bad_request"  # unknown actor type, wrong key type, bad condition
    STALE_GENERATION = "stale_generation"  # retryable: the cluster rolled back
    CUT_TOO_OLD = "cut_too_old"  # retryable: a newer epoch is needed (``completed`` says which)
    CUT_AHEAD = "cut_ahead"  # retryable: this worker has not run that epoch yet
    RECOVERING = "recovering"  # retryable: the worker is still replaying the log
    NOT_OWNER = "not_owner"  # retryable: the key is another worker's (the layout changed)

    RETRYABLE = frozenset({STALE_GENERATION, CUT_TOO_OLD, CUT_AHEAD, RECOVERING, NOT_OWNER})


class Hello(msgspec.Struct, frozen=True, array_like=True, tag="hello"):
    """The first frame of a connection: the shared token ("" when the server needs none)."""

    token: str = ""


class Layout(msgspec.Struct, frozen=True, array_like=True, tag="layout"):
    """Which worker serves which keys, in one generation of the cluster.

    Partition ``p`` owns, of each actor type, the keys in ``[points[p-1], points[p])`` of
    ``ranges[type]``; ``owners[p]`` is its worker; ``endpoints[w]`` is worker w's query address.
    ``completed`` is the last epoch completed on every partition, as this worker knows it.
    """

    generation: int
    worker: int
    endpoints: list[str]
    owners: list[int]
    ranges: dict[str, list[ActorKey]]
    completed: int
    ready: bool


class Condition(msgspec.Struct, frozen=True, array_like=True):
    """``field op value``: a dotted field path, one of ``== != < <= > >=``, a plain value."""

    field: str
    op: str
    value: Any


class Get(msgspec.Struct, frozen=True, array_like=True, tag="get"):
    """Point reads of some keys of one actor type; ``epoch`` -1 reads at the worker's own
    completed epoch (``COMMITTED``) — any other value names the cut to read at."""

    id: int
    generation: int
    actor_type: str
    keys: list[ActorKey]
    level: ReadLevel
    epoch: int = -1


class Scan(msgspec.Struct, frozen=True, array_like=True, tag="scan"):
    """The actors of one type with keys in ``[lo, hi)`` (None: unbounded) that meet every
    condition, in key order, at most ``limit`` of them; or, with ``aggregates`` (``count``,
    ``sum:field``, ``min:field``, ``max:field``), their aggregates instead of the rows. A reply
    that stops early says where to go on (``Rows.more``/``Aggregated.more``)."""

    id: int
    generation: int
    actor_type: str
    lo: ActorKey | None
    hi: ActorKey | None
    level: ReadLevel
    epoch: int = -1
    where: list[Condition] = []
    aggregates: list[str] = []
    limit: int = 10_000


class Values(msgspec.Struct, frozen=True, array_like=True, tag="values"):
    """The values of a :class:`Get`, in its key order (None: no such actor), at ``epoch``."""

    id: int
    generation: int
    epoch: int
    values: list[bytes | None]
    completed: int = -1


class Rows(msgspec.Struct, frozen=True, array_like=True, tag="rows"):
    """Rows of a :class:`Scan` at ``epoch``; ``more`` is the key to resume from, if any."""

    id: int
    generation: int
    epoch: int
    keys: list[ActorKey]
    values: list[bytes]
    more: ActorKey | None = None
    completed: int = -1


class Aggregated(msgspec.Struct, frozen=True, array_like=True, tag="aggregated"):
    """A :class:`Scan`'s aggregates over this worker's share (None: no value to aggregate)."""

    id: int
    generation: int
    epoch: int
    results: list[Any]
    more: ActorKey | None = None
    completed: int = -1


class Failed(msgspec.Struct, frozen=True, array_like=True, tag="failed"):
    """A request this worker could not answer: a :class:`QueryCode` and what was wrong."""

    id: int
    generation: int
    code: str
    message: str
    completed: int = -1


Request = Hello | Get | Scan
Reply = Layout | Values | Rows | Aggregated | Failed
