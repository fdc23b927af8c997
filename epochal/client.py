"""The query client library: live reads from the workers, client transactions, snapshot reads.

::

    async with QueryClient(app, "127.0.0.1:7700", kafka=KafkaConfig(...)) as client:
        account = await client.get(Account, "acct-1", isolation=COMMITTED)
        total = await client.aggregate(Account, "sum:balance")
        outcome = await client.submit(deposit, Deposit("acct-1", 10))

``Client`` is the same with plain (blocking) methods; its ``submit`` returns a
``concurrent.futures.Future`` of the outcome. A service needs the app's module (its actor
types and handlers) and this package — no Spark, and no Kafka unless it submits transactions or
reads ``SERIALIZABLE``.

The client learns the layout — which worker serves which key range, in which generation — from
any worker it can reach, keeps one pipelined connection per worker, and follows the cluster
across rollbacks: a lost connection, a reply of another generation or a replaying worker makes
it learn the layout again and retry, until the call's timeout. Isolation levels (docs/queries.md):

- ``LIVE``: the newest value on the worker (it may include the running epoch, and a crash may
  roll it back). Reads of several workers are not one cut.
- ``COMMITTED``: as of an epoch every partition has completed; one consistent cut across all the
  workers a call reads (a multi-partition transaction is seen whole or not at all), never
  blocking nor blocked by transactions.
- ``SERIALIZABLE``: sequenced through the command log like a transaction (read-your-writes,
  linearizable), one epoch's latency; point reads only (a transaction declares its keys).
- ``SNAPSHOT(ssid)``: a retained snapshot, read from Delta: no load on the workers.
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import contextlib
import itertools
import os
import ssl
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import msgspec

from epochal.actors.api import ActorType, App, named
from epochal.actors.framing import FrameBuffer, framed, split_address
from epochal.actors.serializable import READ_HANDLER, ReadKeys
from epochal.config import ClusterConfig, KafkaConfig, SnapshotConfig
from epochal.errors import (
    QueryError,
    QueryTimeoutError,
    QueryUnavailableError,
    SchemaError,
)
from epochal.log.replies import RequestChannel
from epochal.schemas.canonical import decode_canonical
from epochal.schemas.codec import decode, encode
from epochal.schemas.commands import ActorKey, ClientRequest
from epochal.schemas.egress import ClientReply
from epochal.schemas.queries import (
    Condition,
    Failed,
    Get,
    Hello,
    Layout,
    QueryCode,
    ReadLevel,
    Reply,
    Scan,
    Values,
)

__all__ = [
    "COMMITTED",
    "LIVE",
    "SERIALIZABLE",
    "SNAPSHOT",
    "Client",
    "Isolation",
    "Outcome",
    "QueryClient",
    "ReadDict",
    "ReadList",
    "SnapshotSource",
]

T = TypeVar("T")
R = TypeVar("R", Get, Scan)
_R = TypeVar("_R", "ReadDict", "ReadList")
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Reply)
_MAX_REPLY_BYTES = 256 * 1024 * 1024


class ReadDict(dict[Any, Any]):
    """What ``get_many`` and ``aggregate`` return: a dict that also says the ``epoch`` it was
    read at, so that a client shared by threads or tasks knows which epoch each result is of:
    ``COMMITTED``, the cut every worker answered at; ``SERIALIZABLE``, the epoch the read ran
    in; ``SNAPSHOT(ssid)``, the snapshot's (its ssid); ``LIVE``, -1 (no one cut)."""

    epoch: int

    def __init__(self, items: Mapping[Any, Any], epoch: int) -> None:
        super().__init__(items)
        self.epoch = epoch


class ReadList(list[tuple[Any, Any]]):
    """What ``scan`` returns: ``(key, state)`` pairs, and the ``epoch`` they were read at (as
    :class:`ReadDict` says)."""

    epoch: int

    def __init__(self, items: Iterable[tuple[Any, Any]], epoch: int) -> None:
        super().__init__(items)
        self.epoch = epoch


@dataclass(frozen=True)
class Isolation:
    """An isolation level: ``LIVE``, ``COMMITTED``, ``SERIALIZABLE`` or ``SNAPSHOT(ssid)``."""

    level: str
    ssid: int | None = None

    def __repr__(self) -> str:
        return f"SNAPSHOT({self.ssid})" if self.level == "snapshot" else self.level.upper()


LIVE = Isolation("live")
COMMITTED = Isolation("committed")
SERIALIZABLE = Isolation("serializable")


def SNAPSHOT(ssid: int) -> Isolation:
    """The state of snapshot ``ssid`` (``epochal snapshots APP`` lists them)."""
    return Isolation("snapshot", ssid)


@dataclass(frozen=True)
class Outcome:
    """What became of a client transaction: committed at ``(epoch, seq)`` with what its handler
    returned (``result``, decoded msgpack; None if it returned nothing), or aborted with
    ``reason``."""

    request_id: str
    committed: bool
    epoch: int
    seq: int
    reason: str
    result: Any

    @classmethod
    def of(cls, reply: ClientReply) -> Outcome:
        result = msgspec.msgpack.decode(reply.result) if reply.result else None
        return cls(reply.request_id, reply.committed, reply.epoch, reply.seq, reply.reason, result)


class SnapshotSource(Protocol):
    """Reads a retained snapshot's actors (``recovery.snapshot_reads.SnapshotReader``)."""

    def get(
        self, actor_type: str, keys: Iterable[ActorKey], ssid: int
    ) -> Mapping[ActorKey, bytes | None]: ...

    def scan(
        self, actor_type: str, lo: ActorKey | None, hi: ActorKey | None, ssid: int
    ) -> Sequence[tuple[ActorKey, bytes]]: ...


class _Retry(Exception):
    """A reason to learn the layout again and retry (a lost worker, a rollback)."""


class _Connection:
    """One pipelined connection to a worker's query server: requests in flight by id."""

    def __init__(self, address: str, token: str, tls: ssl.SSLContext | None) -> None:
        self.address = address
        self.token = token
        self.tls = tls
        self.layout: Layout | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Reply]] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self.broken = False

    async def open(self, timeout_s: float) -> Layout:
        host, port = split_address(self.address)
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port, ssl=self.tls), timeout_s
            )
        except (TimeoutError, OSError) as exc:
            raise _Retry(f"{self.address}: {exc!r}") from exc
        self._writer = writer
        buffer = FrameBuffer(_MAX_REPLY_BYTES)
        try:
            first = await self._greet(reader, buffer, timeout_s)
        except BaseException:
            await self.close()
            raise
        self.layout = first
        self._reader_task = asyncio.create_task(self._read(reader, buffer))
        return first

    async def _greet(
        self, reader: asyncio.StreamReader, buffer: FrameBuffer, timeout_s: float
    ) -> Layout:
        """Say Hello with the token; the layout, or why the server refused."""
        assert self._writer is not None
        self._writer.write(framed(_encoder.encode(Hello(self.token))))
        payloads: list[bytes] = []
        try:
            while not payloads:
                data = await asyncio.wait_for(reader.read(65536), timeout_s)
                if not data:
                    raise _Retry(f"{self.address} closed the connection")
                payloads = buffer.feed(data)
        except (TimeoutError, OSError) as exc:
            raise _Retry(f"{self.address}: {exc!r}") from exc
        first = _decoder.decode(payloads[0])
        if isinstance(first, Failed):
            raise QueryError(f"the query server refused the connection: {first.message}",
                             address=self.address, code=first.code)  # fmt: skip
        assert isinstance(first, Layout)
        return first

    def send(self, make: Callable[[int], Get | Scan]) -> asyncio.Future[Reply]:
        """Send the request ``make(id)`` and return the future of its reply."""
        if self.broken or self._writer is None:
            raise _Retry(f"the connection to {self.address} is lost")
        request_id = next(self._ids)
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        self._writer.write(framed(_encoder.encode(make(request_id))))
        return future

    async def _read(self, reader: asyncio.StreamReader, buffer: FrameBuffer) -> None:
        try:
            while True:
                data = await reader.read(256 * 1024)
                if not data:
                    break
                for payload in buffer.feed(data):
                    reply = _decoder.decode(payload)
                    future = self._pending.pop(getattr(reply, "id", 0), None)
                    if future is not None and not future.done():
                        future.set_result(reply)
        except (OSError, msgspec.DecodeError, asyncio.IncompleteReadError):
            pass
        finally:
            self.broken = True
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(_Retry(f"the connection to {self.address} was lost"))
                    future.exception()  # seen: a caller that gave up on it must not be warned
            self._pending.clear()

    async def close(self) -> None:
        self.broken = True
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader_task


class QueryClient:
    """An asyncio client of one app's cluster; see the module docstring.

    ``endpoints``: one or more worker query addresses (``host:port``; any worker will do, the
    others are learnt; default ``127.0.0.1:7700``). ``token``: the servers' shared token
    (default ``$EPOCHAL_QUERY_TOKEN``). ``tls``: an SSL context to connect with. ``kafka``: for
    ``submit`` and ``SERIALIZABLE``. ``snapshots``: where the app's snapshots are, for
    ``SNAPSHOT(ssid)``: a ``SnapshotConfig(warehouse)`` (the reader is made on the first such
    read), or a reader of your own. ``config``: the :class:`ClusterConfig` the cluster runs
    with, which says the app's name, the endpoints, the token, Kafka and the warehouse for
    whatever is not given. With no ``endpoints`` (``()``) the client reads snapshots only, and
    needs no running cluster. ``timeout_s``: how long a call may take, retries included (each
    call may override it).
    """

    def __init__(
        self,
        app: App,
        endpoints: str | Sequence[str] | None = None,
        *,
        config: ClusterConfig | None = None,
        token: str | None = None,
        tls: ssl.SSLContext | None = None,
        kafka: KafkaConfig | None = None,
        snapshots: SnapshotSource | SnapshotConfig | None = None,
        timeout_s: float = 10.0,
        replies_lookback_ms: int = 10 * 60 * 1000,
    ) -> None:
        if config is not None:
            app = named(app, config.name) if config.name else app
            endpoints = config.query_endpoints(1) if endpoints is None else endpoints
            token = (config.query_token or None) if token is None else token
            kafka = kafka or config.kafka
            snapshots = snapshots or config.snapshots
        self.app = app
        endpoints = "127.0.0.1:7700" if endpoints is None else endpoints
        seeds = [endpoints] if isinstance(endpoints, str) else list(endpoints)
        self.seeds = [e for s in seeds for e in s.split(",") if e]
        self.token = os.environ.get("EPOCHAL_QUERY_TOKEN", "") if token is None else token
        self.tls = tls
        self.kafka = kafka
        self.snapshot_source = snapshots
        self.timeout_s = timeout_s
        self.replies_lookback_ms = replies_lookback_ms
        self.layout: Layout | None = None
        self.read_epoch = -1
        """The epoch the last read was answered at (its result's ``epoch``, which a client
        shared by threads should read instead)."""
        self._connections: dict[int, _Connection] = {}
        self._learning = asyncio.Lock()  # one task at a time learns or forgets the layout
        self._replies: RequestChannel | None = None

    async def __aenter__(self) -> QueryClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self, timeout_s: float | None = None) -> None:
        """Learn the layout and connect to every worker (calls do it when needed); nothing for
        a client without endpoints (snapshot reads only)."""
        if self.seeds:
            await self._retrying(lambda: asyncio.sleep(0), timeout_s)

    async def close(self) -> None:
        await self._drop_connections()
        if self._replies is not None:
            self._replies.close()

    # --- reads -------------------------------------------------------------------------------

    async def get(
        self, actor: type | str, key: ActorKey, *, isolation: Isolation = COMMITTED,
        timeout_s: float | None = None,
    ) -> Any:  # fmt: skip
        """One actor's state (a Struct of its type), or None if there is no such actor."""
        found = await self.get_many(actor, [key], isolation=isolation, timeout_s=timeout_s)
        return found[key]

    async def get_many(
        self, actor: type | str, keys: Iterable[ActorKey], *, isolation: Isolation = COMMITTED,
        timeout_s: float | None = None,
    ) -> ReadDict:  # fmt: skip
        """Several actors of one type, read at one consistent cut (``COMMITTED``,
        ``SERIALIZABLE``, ``SNAPSHOT``); None for keys with no actor. The result's ``epoch``
        says which cut (:class:`ReadDict`)."""
        actor_type = self._actor_type(actor)
        wanted = list(dict.fromkeys(keys))
        for key in wanted:
            _check_key(actor_type, key)
        if isolation.level == "serializable":
            return self._read(await self._serializable(actor_type, wanted, timeout_s))
        if isolation.level == "snapshot":
            data = await asyncio.to_thread(
                self._snapshots().get, actor_type.name, wanted, _ssid(isolation)
            )
            found = {k: _decoded(actor_type, data.get(k)) for k in wanted}
            return self._read(ReadDict(found, _ssid(isolation)))
        level = _level(isolation)

        async def attempt() -> ReadDict:
            by_worker = self._by_worker(actor_type, wanted)
            generation = self._generation()
            requests = {w: Get(0, generation, actor_type.name, ks, level)
                        for w, ks in by_worker.items()}  # fmt: skip
            replies, epoch = await self._at_one_cut(requests)
            found: dict[ActorKey, Any] = {}
            for worker, reply in replies.items():
                assert isinstance(reply, Values)
                for key, value in zip(by_worker[worker], reply.values, strict=True):
                    found[key] = _decoded(actor_type, value)
            return ReadDict(found, epoch)

        return self._read(await self._retrying(attempt, timeout_s))

    def _read(self, result: _R) -> _R:
        """A result, its epoch also kept as :attr:`read_epoch` (the last read's)."""
        self.read_epoch = result.epoch
        return result

    async def scan(
        self, actor: type | str, lo: ActorKey | None = None, hi: ActorKey | None = None, *,
        where: Iterable[tuple[str, str, Any]] = (), predicate: Callable[[Any], bool] | None = None,
        isolation: Isolation = COMMITTED, limit: int | None = None,
        timeout_s: float | None = None,
    ) -> ReadList:  # fmt: skip
        """The actors with keys in ``[lo, hi)`` meeting ``where`` (``(field, op, value)``,
        evaluated on the workers) and ``predicate`` (a function, evaluated here), in key order,
        as ``(key, state)``; at most ``limit``. One consistent cut unless ``LIVE``, whose epoch
        the result's ``epoch`` says (:class:`ReadList`)."""
        actor_type = self._actor_type(actor)
        conditions = [Condition(f, op, v) for f, op, v in where]
        for bound in (lo, hi):
            if bound is not None:
                _check_key(actor_type, bound)
        _check_range(actor_type, lo, hi)
        if isolation.level == "snapshot":
            rows = await asyncio.to_thread(
                self._snapshots().scan, actor_type.name, lo, hi, _ssid(isolation)
            )
            found = [(k, _decoded(actor_type, v)) for k, v in rows]
            found = [(k, v) for k, v in found if _meets(v, conditions)]
            epoch = _ssid(isolation)
        else:
            request = Scan(0, 0, actor_type.name, lo, hi, _level(isolation), where=conditions)
            pages, epoch = await self._scan_pages(actor_type, request, timeout_s)
            found = [(k, _decoded(actor_type, v)) for page in pages
                     for k, v in zip(page.keys, page.values, strict=True)]  # fmt: skip
        if predicate is not None:
            found = [(k, v) for k, v in found if predicate(v)]
        return self._read(ReadList(found if limit is None else found[:limit], epoch))

    async def aggregate(
        self, actor: type | str, *aggregates: str, lo: ActorKey | None = None,
        hi: ActorKey | None = None, where: Iterable[tuple[str, str, Any]] = (),
        isolation: Isolation = COMMITTED, timeout_s: float | None = None,
    ) -> ReadDict:  # fmt: skip
        """``count``, ``sum:<field>``, ``min:<field>``, ``max:<field>`` over the actors with
        keys in ``[lo, hi)`` meeting ``where``, computed on the workers over one consistent cut
        (unless ``LIVE``), whose epoch the result's ``epoch`` says. None where nothing was
        aggregated (a min of no actors); a field that is None is skipped; a sum of a field that
        is no number is a QueryError."""
        specs = list(aggregates) or ["count"]
        actor_type = self._actor_type(actor)
        conditions = [Condition(f, op, v) for f, op, v in where]
        _check_range(actor_type, lo, hi)
        partials: list[list[Any]]  # per actor (a snapshot's) or per page (the workers')
        if isolation.level == "snapshot":
            rows = await self.scan(actor_type.name, lo, hi, where=where, isolation=isolation,
                                   timeout_s=timeout_s)  # fmt: skip
            partials = [[_one(spec, value) for spec in specs] for _, value in rows]
            epoch = rows.epoch
        else:
            request = Scan(0, 0, actor_type.name, lo, hi, _level(isolation), where=conditions,
                           aggregates=specs)  # fmt: skip
            pages, epoch = await self._scan_pages(actor_type, request, timeout_s)
            partials = [page.results for page in pages]
        totals: list[Any] = [None] * len(specs)
        for partial in partials:
            for i, spec in enumerate(specs):
                totals[i] = _combine(spec, totals[i], partial[i])
        if "count" in specs and totals[specs.index("count")] is None:
            totals[specs.index("count")] = 0
        return self._read(ReadDict(dict(zip(specs, totals, strict=True)), epoch))

    async def _scan_pages(
        self, actor_type: ActorType, request: Scan, timeout_s: float | None
    ) -> tuple[list[Any], int]:
        """Every page of ``request`` (its id and generation are set here) from every worker
        owning part of its key range, all at one epoch unless ``LIVE``; and that epoch."""

        async def attempt() -> tuple[list[Any], int]:
            workers = self._workers_for_range(actor_type, request.lo, request.hi)
            if not workers:  # an empty range ([k, k) at a split point): no worker holds any of it
                return [], -1
            first = msgspec.structs.replace(request, generation=self._generation())
            replies, epoch = await self._at_one_cut(dict.fromkeys(workers, first))

            async def rest_of(worker: int, reply: Any) -> list[Any]:
                pages = [reply]
                while reply.more is not None:  # the next pages at the first one's epoch
                    page = msgspec.structs.replace(first, lo=reply.more, epoch=reply.epoch)
                    reply = self._checked(await self._send(worker, _maker(page)))
                    pages.append(reply)
                return pages

            done = await asyncio.gather(*(rest_of(w, r) for w, r in replies.items()))
            return [page for pages in done for page in pages], epoch

        return await self._retrying(attempt, timeout_s)

    # --- client transactions -----------------------------------------------------------------

    async def submit(
        self, handler: Callable[..., Any] | str, event: object, *, request_id: str | None = None,
        timeout_s: float | None = None,
    ) -> Outcome:  # fmt: skip
        """Run a client transaction (``@app.transaction(..., client=True)``) through the
        requests topic; its :class:`Outcome` once it ran. ``request_id`` is the idempotency key:
        a submit retried with the same key (within the sequencer's request-id window) is applied
        once and returns the same outcome."""
        spec = self.app.handlers.get(handler) if isinstance(handler, str) else None
        if spec is None and not isinstance(handler, str):
            spec = self.app.handler_for_fn(handler)
        if spec is None or not spec.client:
            raise QueryError("not a client transaction of this app", handler=str(handler))
        data = encode(event)
        try:
            decode(data, spec.event)
        except SchemaError as exc:
            raise QueryError(f"the event does not fit {spec.event.__name__}: {exc.message}",
                             handler=spec.name) from exc  # fmt: skip
        replies = self._replies_channel()
        request_id = request_id or uuid.uuid4().hex
        waiting = replies.expect(request_id)
        await asyncio.to_thread(replies.send, ClientRequest(request_id, spec.name, data))
        timeout = self.timeout_s if timeout_s is None else timeout_s
        try:
            reply = await asyncio.wait_for(asyncio.wrap_future(waiting), timeout)
        except TimeoutError:
            raise QueryTimeoutError("no outcome for the client transaction yet: submit again "
                                    "with the same request_id to wait for it",
                                    request_id=request_id, timeout_s=timeout) from None  # fmt: skip
        return Outcome.of(reply)

    async def _serializable(
        self, actor_type: ActorType, keys: list[ActorKey], timeout_s: float | None
    ) -> ReadDict:
        refs = [(actor_type.name, key) for key in keys]
        outcome = await self.submit(READ_HANDLER, ReadKeys(refs), timeout_s=timeout_s)
        if not outcome.committed:
            raise QueryError(f"the serializable read failed: {outcome.reason}")
        found = {
            key: None if raw is None else msgspec.convert(raw, actor_type.state)
            for key, raw in zip(keys, outcome.result, strict=True)
        }
        return ReadDict(found, outcome.epoch)

    # --- layout, connections, retries --------------------------------------------------------

    def _actor_type(self, actor: type | str) -> ActorType:
        if isinstance(actor, str):
            found = self.app.actor_types.get(actor)
        else:
            found = self.app.actor_types_by_class.get(actor)
        if found is None:
            known = ", ".join(sorted(self.app.actor_types))
            raise QueryError(f"unknown actor type {actor!r} (this app has {known})")
        return found

    def _generation(self) -> int:
        assert self.layout is not None
        return self.layout.generation

    def _by_worker(self, actor_type: ActorType, keys: list[ActorKey]) -> dict[int, list[ActorKey]]:
        assert self.layout is not None
        points, owners = self.layout.ranges[actor_type.name], self.layout.owners
        by_worker: dict[int, list[ActorKey]] = {}
        for key in keys:
            by_worker.setdefault(owners[bisect.bisect_right(points, key)], []).append(key)
        return by_worker

    def _workers_for_range(
        self, actor_type: ActorType, lo: ActorKey | None, hi: ActorKey | None
    ) -> list[int]:
        assert self.layout is not None
        points, owners = self.layout.ranges[actor_type.name], self.layout.owners
        first = 0 if lo is None else bisect.bisect_right(points, lo)
        last = len(owners) - 1 if hi is None else bisect.bisect_left(points, hi)
        return sorted({owners[p] for p in range(first, last + 1)})

    async def _at_one_cut(self, requests: dict[int, R]) -> tuple[dict[int, Reply], int]:
        """Each worker's checked reply to its request, and the epoch they were answered at (-1
        for ``LIVE``). ``COMMITTED`` requests to several workers are answered at one epoch:
        first each at its own last completed one, then those that answered at an older epoch
        again at the newest (every worker has run it)."""
        futures = {w: self._send(w, _maker(r)) for w, r in requests.items()}
        replies = {w: self._checked(await f) for w, f in futures.items()}
        if next(iter(requests.values())).level != ReadLevel.COMMITTED:
            return replies, -1
        newest = max(getattr(r, "epoch", -1) for r in replies.values())
        if len(replies) < 2:
            return replies, newest
        again = {
            w: self._send(w, _maker(msgspec.structs.replace(requests[w], epoch=newest)))
            for w, r in replies.items()
            if getattr(r, "epoch", -1) != newest
        }
        replies.update({w: self._checked(await f) for w, f in again.items()})
        return replies, newest

    def _send(self, worker: int, make: Callable[[int], Get | Scan]) -> asyncio.Future[Reply]:
        connection = self._connections.get(worker)
        if connection is None:
            raise _Retry(f"no connection to worker {worker}")
        return connection.send(make)

    def _checked(self, reply: Reply) -> Reply:
        """The reply, or the error it carries."""
        if isinstance(reply, Failed):
            if reply.code in QueryCode.RETRYABLE:
                raise _Retry(f"{reply.code}: {reply.message}")
            raise QueryError(reply.message, code=reply.code)
        return reply

    async def _retrying(self, attempt: Callable[[], Awaitable[T]], timeout_s: float | None) -> T:
        """``attempt()`` until it answers, learning the layout again after each retryable
        failure (a lost worker, a rollback, a replaying worker), until the timeout."""
        if not self.seeds:
            raise QueryError(
                "this client has no query endpoints, so it reads snapshots only "
                "(isolation=SNAPSHOT(ssid)): give it a worker's address for the others"
            )
        timeout = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        pause = 0.02
        last = "no attempt"
        while True:
            layout = self.layout
            try:
                layout = await self._current_layout(deadline)
                return await asyncio.wait_for(attempt(), max(0.001, deadline - time.monotonic()))
            except _Retry as exc:
                last = str(exc)
                if "cut_too_old" not in last:
                    await self._forget_layout(layout)
            except TimeoutError:
                raise QueryTimeoutError("the query timed out", timeout_s=timeout,
                                        last_error=last) from None  # fmt: skip
            if time.monotonic() + pause > deadline:
                if self.layout is None:
                    raise QueryUnavailableError("no query server answered", endpoints=self.seeds,
                                                timeout_s=timeout, last_error=last)  # fmt: skip
                raise QueryTimeoutError("the query timed out while the cluster recovered",
                                        timeout_s=timeout, last_error=last)  # fmt: skip
            if "cut_too_old" not in last:
                await asyncio.sleep(pause)
                pause = min(pause * 2, 0.5)

    async def _current_layout(self, deadline: float) -> Layout | None:
        """The layout calls go by, learnt again if there is none or a connection broke. Tasks
        sharing the client (threads sharing a :class:`Client`) take turns: one learns, the
        others then use what it learnt instead of closing its new connections."""
        async with self._learning:
            if self.layout is None or any(c.broken for c in self._connections.values()):
                await self._drop_connections()
                await self._learn_layout(deadline)
            return self.layout

    async def _forget_layout(self, failed: Layout | None) -> None:
        """Forget the layout a call failed with, unless another task has learnt a newer one."""
        async with self._learning:
            if self.layout is failed:
                await self._drop_connections()

    async def _drop_connections(self) -> None:
        connections, self._connections, self.layout = list(self._connections.values()), {}, None
        for connection in connections:
            await connection.close()

    async def _learn_layout(self, deadline: float) -> None:
        """Connect to every worker of one generation, starting from any endpoint that answers."""
        known = list(dict.fromkeys(self.seeds))
        errors: list[str] = []
        for address in known:
            step = max(0.05, min(2.0, deadline - time.monotonic()))
            first = _Connection(address, self.token, self.tls)
            try:
                layout = await first.open(step)
            except _Retry as exc:
                errors.append(str(exc))
                continue
            connections = {layout.worker: first}
            try:
                for worker, endpoint in enumerate(layout.endpoints):
                    if worker in connections:
                        continue
                    connection = _Connection(endpoint, self.token, self.tls)
                    theirs = await connection.open(step)
                    connections[worker] = connection
                    if theirs.generation != layout.generation or theirs.worker != worker:
                        raise _Retry("the workers are in different generations")
            except _Retry as exc:
                for connection in connections.values():
                    await connection.close()
                errors.append(str(exc))
                continue
            self._connections = connections
            self.layout = layout
            self.seeds = list(dict.fromkeys([*self.seeds, *layout.endpoints]))
            return
        raise _Retry("; ".join(errors) or "no endpoint")

    def _replies_channel(self) -> RequestChannel:
        if self._replies is None:
            if self.kafka is None:
                raise QueryError("submit and SERIALIZABLE reads need Kafka: pass kafka=KafkaConfig")
            self._replies = RequestChannel(self.app.topics, self.kafka, self.replies_lookback_ms)
        return self._replies

    def _snapshots(self) -> SnapshotSource:
        source = self.snapshot_source
        if source is None:
            raise QueryError(
                "SNAPSHOT reads need the warehouse: pass snapshots=SnapshotConfig(warehouse), or "
                "the cluster's config=ClusterConfig(...)"
            )
        if isinstance(source, SnapshotConfig):  # delta-rs loads now, not with the client
            from epochal.recovery.snapshot_reads import SnapshotReader

            source = self.snapshot_source = SnapshotReader(source, self.app.name)
        return source


class Client:
    """:class:`QueryClient` with blocking methods (it runs its own event loop in a thread).

    >>> with Client(app, "127.0.0.1:7700") as client:
    ...     client.get(Account, "acct-1", isolation=LIVE)
    """

    def __init__(self, app: App, endpoints: str | Sequence[str] | None = None,
                 **options: Any) -> None:  # fmt: skip
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="epochal-client",
                                        daemon=True)  # fmt: skip
        self._thread.start()
        self.queries = QueryClient(app, endpoints, **options)

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def __enter__(self) -> Client:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self, timeout_s: float | None = None) -> None:
        self._call(self.queries.connect(timeout_s))

    @property
    def read_epoch(self) -> int:
        """The epoch the last read was answered at; a client shared by threads should read its
        result's ``epoch`` instead (:class:`ReadDict`, :class:`ReadList`)."""
        return self.queries.read_epoch

    def get(self, actor: type | str, key: ActorKey, **options: Any) -> Any:
        return self._call(self.queries.get(actor, key, **options))

    def get_many(self, actor: type | str, keys: Iterable[ActorKey],
                 **options: Any) -> ReadDict:  # fmt: skip
        return self._call(self.queries.get_many(actor, keys, **options))

    def scan(self, actor: type | str, lo: ActorKey | None = None, hi: ActorKey | None = None,
             **options: Any) -> ReadList:  # fmt: skip
        return self._call(self.queries.scan(actor, lo, hi, **options))

    def aggregate(self, actor: type | str, *aggregates: str, **options: Any) -> ReadDict:
        return self._call(self.queries.aggregate(actor, *aggregates, **options))

    def submit(self, handler: Callable[..., Any] | str, event: object,
               **options: Any) -> concurrent.futures.Future[Outcome]:  # fmt: skip
        """A future of the transaction's :class:`Outcome` (``.result()`` waits for it)."""
        return asyncio.run_coroutine_threadsafe(
            self.queries.submit(handler, event, **options), self._loop
        )

    def close(self) -> None:
        try:
            self._call(self.queries.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            if not self._thread.is_alive():
                self._loop.close()


# --- helpers -------------------------------------------------------------------------------


def _maker(request: R) -> Callable[[int], R]:
    """``request`` with the id its connection gives it."""
    return lambda request_id: msgspec.structs.replace(request, id=request_id)


def _check_key(actor_type: ActorType, key: object) -> None:
    if type(key) is not actor_type.key_type:
        raise QueryError(
            f"key {key!r} of {actor_type.name} has type {type(key).__name__}; "
            f"{actor_type.name} keys are {actor_type.key_type.__name__}"
        )


def _level(isolation: Isolation) -> ReadLevel:
    if isolation.level == "live":
        return ReadLevel.LIVE
    if isolation.level == "committed":
        return ReadLevel.COMMITTED
    raise QueryError(f"{isolation!r} reads are point reads: use get or get_many")


def _ssid(isolation: Isolation) -> int:
    assert isolation.ssid is not None
    return isolation.ssid


def _decoded(actor_type: ActorType, data: bytes | None) -> Any:
    return None if data is None else decode_canonical(data, actor_type.state)


def _check_range(actor_type: ActorType, lo: ActorKey | None, hi: ActorKey | None) -> None:
    from epochal.actors.query_server import check_range

    check_range(actor_type.name, lo, hi)


def _meets(value: Any, conditions: list[Condition]) -> bool:
    from epochal.actors.query_server import condition_test

    return all(condition_test(c)(value) for c in conditions)


def _one(spec: str, value: Any) -> Any:
    from epochal.actors.query_server import aggregate_step

    return aggregate_step(spec)(None, value)


def _combine(spec: str, a: Any, b: Any) -> Any:
    """Two partial aggregates of ``spec`` as one (None: nothing aggregated yet)."""
    if a is None:
        return b
    if b is None:
        return a
    kind = spec.partition(":")[0]
    if kind in ("count", "sum"):
        return a + b
    return min(a, b) if kind == "min" else max(a, b)
