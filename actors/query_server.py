"""Each worker's live query server: point reads, range scans and aggregates over its partitions.

It runs on the worker's own event loop and answers every request at once, without awaiting
anything in between: the executor applies a transaction's writes without yielding, so no read
sees half of one, and the store's floor never rises under a read (``actors/store.py``). A query
never waits for an epoch and an epoch never waits for a query beyond the one request being
answered; a scan examines at most :data:`SCAN_BUDGET` actors per request and says where to go on.

``LIVE`` reads the newest values. ``COMMITTED`` reads at one epoch that every worker has run —
the request's, or this worker's last completed one — so that a client reading several workers at
the same epoch gets one consistent cut (``schemas/queries.py`` has the protocol).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import hmac
import logging
import operator
import reprlib
import ssl
import time
from collections.abc import Callable
from typing import Any

import msgspec

from epochal.actors.api import ActorType, App
from epochal.actors.engine import Engine
from epochal.actors.framing import FrameBuffer, framed, split_address
from epochal.config import Listener
from epochal.errors import BindError, ConfigError, EpochalError, QueryError, SchemaError
from epochal.metrics import Metrics
from epochal.schemas.canonical import decode_canonical
from epochal.schemas.commands import ActorKey, KeyRef
from epochal.schemas.queries import (
    Aggregated,
    Condition,
    Failed,
    Get,
    Hello,
    Layout,
    QueryCode,
    ReadLevel,
    Reply,
    Request,
    Rows,
    Scan,
    Values,
)

__all__ = [
    "SCAN_BUDGET",
    "QueryServer",
    "aggregate_step",
    "check_binding",
    "check_range",
    "condition_test",
    "describe_query_metrics",
]

logger = logging.getLogger(__name__)

SCAN_BUDGET = 20_000
"""The most actors one scan request examines: a scan of a million actors takes many requests,
and epochs run between them."""

MAX_REQUEST_BYTES = 16 * 1024 * 1024
_HELLO_TIMEOUT_S = 10.0
_LOOPBACK = ("127.", "localhost", "::1")

_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
    ">": operator.gt, ">=": operator.ge,
}  # fmt: skip

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Request)


def check_binding(address: str, token: str) -> None:
    """Refuse to serve queries beyond this host without a shared token."""
    host, _ = split_address(address)
    if not token and not host.startswith(_LOOPBACK):
        raise ConfigError(
            "a query server bound beyond 127.0.0.1 needs a token (--query-token or "
            "EPOCHAL_QUERY_TOKEN)", address=address,
        )  # fmt: skip


class _BadRequest(QueryError):
    """A request this server refuses: a :class:`QueryCode` and what was wrong."""

    def __init__(self, code: str, message: str, **context: Any) -> None:
        super().__init__(message, **context)
        self.code = code


def describe_query_metrics(metrics: Metrics) -> None:
    """The query server's metrics, described from a worker's start (before its server is up)."""
    metrics.describe("epochal_queries_total", "counter", "query requests answered")
    metrics.describe("epochal_query_seconds_sum", "counter", "time answering them, in the worker")


class QueryServer:
    """``await QueryServer(engine, ...).start()`` on the worker's loop; ``ready`` once the
    worker has caught up with the log (a replaying worker answers ``recovering``).

    ``endpoints[w]`` is worker w's query address; this worker listens on its own.
    """

    def __init__(
        self,
        engine: Engine,
        endpoints: list[str],
        generation: int,
        *,
        token: str = "",
        tls: ssl.SSLContext | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        check_binding(endpoints[engine.worker], token)
        self.engine = engine
        self.app: App = engine.app
        self.endpoints = endpoints
        self.generation = generation
        self.token = token
        self.tls = tls
        self.metrics = metrics
        self.ready = False
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.StreamWriter] = set()
        self.served = 0
        if metrics is not None:
            describe_query_metrics(metrics)

    async def start(self) -> None:
        host, port = split_address(self.endpoints[self.engine.worker])
        try:
            self._server = await asyncio.start_server(
                self._serve, host, port, ssl=self.tls, reuse_address=True
            )
        except OSError as exc:
            address = self.endpoints[self.engine.worker]
            owner = f"worker {self.engine.worker}"
            raise BindError.of(exc, address, Listener.QUERIES, owner) from exc
        logger.info("query server listening worker=%d address=%s:%d tls=%s",
                    self.engine.worker, host, port, self.tls is not None)  # fmt: skip

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for writer in list(self._connections):
            writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 1.0)

    def layout(self) -> Layout:
        engine = self.engine
        points = engine.ranges.points
        return Layout(self.generation, engine.worker, list(self.endpoints),
                      list(engine.worker_of), {t: list(p) for t, p in points.items()},
                      engine.completed, self.ready)  # fmt: skip

    # --- connections -----------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections.add(writer)
        buffer = FrameBuffer(MAX_REQUEST_BYTES)
        try:
            if not await self._greet(reader, writer, buffer):
                return
            while True:
                data = await reader.read(256 * 1024)
                if not data:
                    return
                replies = [self._reply(payload) for payload in buffer.feed(data)]
                writer.write(b"".join(replies))
                if writer.transport.get_write_buffer_size() > 4 * 1024 * 1024:
                    await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, EpochalError) as exc:
            logger.debug("query connection closed: %r", exc)
        finally:
            self._connections.discard(writer)
            writer.close()

    async def _greet(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, buffer: FrameBuffer
    ) -> bool:
        """The first frame must be a Hello with the token; the answer is the layout."""
        payloads: list[bytes] = []
        while not payloads:
            data = await asyncio.wait_for(reader.read(4096), _HELLO_TIMEOUT_S)
            if not data:
                return False
            payloads = buffer.feed(data)
        try:
            hello = _decoder.decode(payloads[0])
        except msgspec.DecodeError:
            hello = None
        if not isinstance(hello, Hello) or not hmac.compare_digest(
            hello.token.encode(), self.token.encode()
        ):
            failed = Failed(0, self.generation, QueryCode.BAD_TOKEN, "wrong or missing token")
            writer.write(framed(_encoder.encode(failed)))
            await writer.drain()
            return False
        writer.write(framed(_encoder.encode(self.layout())))
        writer.write(b"".join(self._reply(payload) for payload in payloads[1:]))
        return True

    def _reply(self, payload: bytes) -> bytes:
        request_id = 0
        try:
            request = _decoder.decode(payload)
            if isinstance(request, Hello):
                return framed(_encoder.encode(self.layout()))
            request_id = request.id
            reply = self.answer(request)
        except _BadRequest as exc:
            reply = Failed(request_id, self.generation, exc.code, str(exc), self.engine.completed)
        except (msgspec.DecodeError, SchemaError) as exc:
            reply = Failed(request_id, self.generation, QueryCode.BAD_REQUEST,
                           f"request does not decode: {exc}")  # fmt: skip
        self.served += 1
        return framed(_encoder.encode(reply))

    # --- answers ---------------------------------------------------------------------------

    def answer(self, request: Get | Scan) -> Reply:
        """The reply to one request, computed at once (no await: nothing changes meanwhile)."""
        engine = self.engine
        if request.generation != self.generation:
            raise _BadRequest(QueryCode.STALE_GENERATION, "the cluster is in another generation",
                              generation=self.generation)  # fmt: skip
        if not self.ready:
            raise _BadRequest(QueryCode.RECOVERING, "this worker is still replaying the log")
        started = time.perf_counter()
        actor_type = self._actor_type(request.actor_type)
        epoch = self._epoch(request.level, request.epoch)
        reply: Reply
        if isinstance(request, Get):
            values = self._values(actor_type, request.keys, epoch)
            reply = Values(request.id, self.generation, epoch, values, engine.completed)
        else:
            reply = self._scan(actor_type, request, epoch)
        if self.metrics is not None:
            kind = "get" if isinstance(request, Get) else "scan"
            level = request.level.name.lower()
            self.metrics.inc("epochal_queries_total", kind=kind, level=level)
            seconds = time.perf_counter() - started
            self.metrics.inc("epochal_query_seconds_sum", seconds, kind=kind, level=level)
        return reply

    def _actor_type(self, name: str) -> ActorType:
        actor_type = self.app.actor_types.get(name)
        if actor_type is None:
            known = ", ".join(sorted(self.app.actor_types))
            raise _BadRequest(QueryCode.BAD_REQUEST,
                              f"unknown actor type {name!r} (this app has {known})")  # fmt: skip
        return actor_type

    def _epoch(self, level: ReadLevel, asked: int) -> int:
        """The epoch a read is at: -1 for ``LIVE``; for ``COMMITTED`` the one asked, checked."""
        engine = self.engine
        if level == ReadLevel.LIVE:
            return -1
        if asked < 0:
            return engine.completed
        if asked < engine.store.floor:
            raise _BadRequest(QueryCode.CUT_TOO_OLD, "this worker no longer keeps that epoch",
                              epoch=asked, oldest=engine.store.floor)  # fmt: skip
        if asked > engine.executed:
            raise _BadRequest(QueryCode.CUT_AHEAD, "this worker has not run that epoch yet",
                              epoch=asked, executed=engine.executed)  # fmt: skip
        return asked

    def _check_key(self, actor_type: ActorType, key: object) -> None:
        if type(key) is not actor_type.key_type:
            raise _BadRequest(
                QueryCode.BAD_REQUEST,
                f"key {key!r} of {actor_type.name} has type {type(key).__name__}; "
                f"{actor_type.name} keys are {actor_type.key_type.__name__}",
            )  # fmt: skip

    def _values(
        self, actor_type: ActorType, keys: list[ActorKey], epoch: int
    ) -> list[bytes | None]:
        engine, store, name = self.engine, self.engine.store, actor_type.name
        mine = engine.partitions
        found: list[bytes | None] = []
        for key in keys:
            self._check_key(actor_type, key)
            ref = KeyRef(name, key)
            if engine.ranges.partition_of(ref) not in mine:
                raise _BadRequest(QueryCode.NOT_OWNER, "another worker owns this key",
                                  actor_type=name, key=key)  # fmt: skip
            found.append(store.values.get(ref) if epoch < 0 else store.value_at(ref, epoch))
        return found

    def _scan(self, actor_type: ActorType, request: Scan, epoch: int) -> Rows | Aggregated:
        for bound in (request.lo, request.hi):
            if bound is not None:
                self._check_key(actor_type, bound)
        check_range(actor_type.name, request.lo, request.hi)
        conditions = [condition_test(c) for c in request.where]
        steps = [aggregate_step(spec) for spec in request.aggregates]
        store, name, state = self.engine.store, actor_type.name, actor_type.state
        keys, at = store.keys_from(name, request.lo)
        hi: Any = request.hi
        stop = len(keys) if hi is None else bisect.bisect_left(keys, hi, at)
        end = min(stop, at + SCAN_BUDGET)
        out_keys: list[ActorKey] = []
        out_values: list[bytes] = []
        results: list[Any] = [None] * len(steps)
        values, decode = store.values, conditions or steps
        i = at
        while i < end and len(out_keys) < request.limit:
            key = keys[i]
            i += 1
            ref = KeyRef(name, key)
            data = values.get(ref) if epoch < 0 else store.value_at(ref, epoch)
            if data is None:
                continue
            if decode:
                value = decode_canonical(data, state)
                if not all(test(value) for test in conditions):
                    continue
                if steps:
                    results = [step(r, value) for step, r in zip(steps, results, strict=True)]
                    continue
            out_keys.append(key)
            out_values.append(data)
        more = keys[i] if i < stop else None
        completed = self.engine.completed
        if steps:
            return Aggregated(request.id, self.generation, epoch, results, more, completed)
        return Rows(request.id, self.generation, epoch, out_keys, out_values, more, completed)


def _field(value: Any, path: str) -> Any:
    for name in path.split("."):
        value = value[name] if isinstance(value, dict) else getattr(value, name)
    return value


def check_range(actor_type: str, lo: Any, hi: Any) -> None:
    """``[lo, hi)`` with ``lo`` after ``hi`` is a mistake (bounds swapped), refused at every
    isolation level; ``lo == hi`` is an empty range and answers nothing."""
    if lo is not None and hi is not None and lo > hi:
        reversed_range = (
            f"the key range [{lo!r}, {hi!r}) of {actor_type} is reversed: lo is after hi"
        )
        raise _BadRequest(QueryCode.BAD_REQUEST, reversed_range)


def condition_test(condition: Condition) -> Callable[[Any], bool]:
    """``condition`` as a test of a decoded actor state."""
    test = _OPS.get(condition.op)
    if test is None:
        raise _BadRequest(QueryCode.BAD_REQUEST, f"unknown operator {condition.op!r}",
                          allowed=sorted(_OPS))  # fmt: skip
    path, wanted = condition.field, condition.value

    def check(value: Any) -> bool:
        try:
            return test(_field(value, path), wanted)
        except (AttributeError, KeyError, TypeError) as exc:
            raise _BadRequest(
                QueryCode.BAD_REQUEST, f"condition {path} {condition.op} {wanted!r}: {exc}"
            ) from exc

    return check


def aggregate_step(spec: str) -> Callable[[Any, Any], Any]:
    """``count``, ``sum:f``, ``min:f``, ``max:f`` as ``step(partial, value) -> partial`` (None
    starts it); combining two partials is the same step on the client (see ``combine``). A field
    that is None is skipped; a sum of something else than numbers is refused."""
    kind, _, path = spec.partition(":")
    if kind == "count" and not path:
        return lambda partial, value: (partial or 0) + 1
    if kind not in ("sum", "min", "max") or not path:
        raise _BadRequest(QueryCode.BAD_REQUEST, f"unknown aggregate {spec!r}",
                          allowed="count, sum:<field>, min:<field>, max:<field>")  # fmt: skip
    picks: dict[str, Callable[[Any, Any], Any]] = {"sum": operator.add, "min": min, "max": max}
    pick = picks[kind]

    def step(partial: Any, value: Any) -> Any:
        try:
            item = _field(value, path)
        except (AttributeError, KeyError) as exc:
            raise _BadRequest(QueryCode.BAD_REQUEST, f"aggregate {spec!r}: {exc}") from exc
        if item is None:  # skipped, as SQL skips NULL: else its place in key order would matter
            return partial
        if kind == "sum" and not isinstance(item, int | float):
            said = (
                f"aggregate {spec!r}: {path} is a {type(item).__name__} ({reprlib.repr(item)}), "
                "and sum adds numbers only"
            )
            raise _BadRequest(QueryCode.BAD_REQUEST, said)
        try:
            return item if partial is None else pick(partial, item)
        except TypeError as exc:  # min or max of values that do not compare (an int and None)
            said = f"aggregate {spec!r}: {exc}"
            raise _BadRequest(QueryCode.BAD_REQUEST, said) from exc

    return step
