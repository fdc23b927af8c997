"""Live queries against two real engines exchanging over TCP, each with its query server, while
they run epochs: every ``COMMITTED`` answer equals the serial oracle's state at the epoch it was
read at (so a multi-partition transfer is seen whole or not at all); ``LIVE`` answers the newest
values; bad queries get the documented errors."""

from __future__ import annotations

import asyncio
import random
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest

from epochal.actors.api import App
from epochal.actors.engine import Engine
from epochal.actors.oracle import SerialOracle
from epochal.actors.query_server import SCAN_BUDGET, QueryServer, aggregate_step
from epochal.actors.transport import Peers
from epochal.client import COMMITTED, LIVE, SERIALIZABLE, SNAPSHOT, QueryClient
from epochal.errors import QueryError, QueryUnavailableError
from epochal.metrics import Metrics
from epochal.schemas.canonical import decode_canonical, encode_canonical
from epochal.schemas.commands import ActorKey, EpochRecord, KeyRef
from epochal.schemas.queries import ReadLevel, Scan
from tests.conftest import free_ports
from tests.unit.actors.workload import (
    ACCOUNTS,
    Account,
    AuditLog,
    Deposit,
    Transfer,
    app,
    command_log,
)


def _records(epochs: int, seed: int = 7) -> list[EpochRecord]:
    rng = random.Random(seed)
    batches: list[list[object]] = [[Deposit(a, 100) for a in range(ACCOUNTS)]]
    for _ in range(epochs):
        batches.append([
            Transfer(rng.randrange(ACCOUNTS), rng.randrange(ACCOUNTS), rng.randrange(1, 60))
            for _ in range(20)
        ])  # fmt: skip
    return command_log(batches)


def _oracle_states(records: list[EpochRecord]) -> dict[int, dict[KeyRef, bytes]]:
    oracle, states = SerialOracle(app), {}
    for record in records:
        oracle.run_epoch(record)
        states[record.epoch] = dict(oracle.state)
    return states


@asynccontextmanager
async def _cluster(
    workers: int = 2, partitions: int = 4, token: str = "", tls: ssl.SSLContext | None = None,
    metrics: list[Metrics] | None = None, *, runs: App = app,
) -> AsyncIterator[tuple[list[Engine], list[QueryServer], list[str]]]:  # fmt: skip
    base = free_ports(2 * workers)
    peers_at = [f"127.0.0.1:{base + w}" for w in range(workers)]
    query_at = [f"127.0.0.1:{base + workers + w}" for w in range(workers)]
    engines: list[Engine] = []
    for w in range(workers):
        peers = (
            Peers(w, peers_at, generation=1, on_frame=lambda f, w=w: engines[w].on_frame(f))
            if workers > 1
            else None
        )
        engines.append(Engine(runs, partitions, w, workers, peers, queries=True))
    servers = [
        QueryServer(e, query_at, 1, token=token, tls=tls, metrics=metrics[w] if metrics else None)
        for w, e in enumerate(engines)
    ]
    await asyncio.gather(*(e.peers.start() for e in engines if e.peers))
    for server in servers:
        await server.start()
        server.ready = True
    try:
        yield engines, servers, query_at
    finally:
        for server in servers:
            await server.close()
        for engine in engines:
            if engine.peers:
                await engine.peers.close()


async def _run_all(engines: list[Engine], records: list[EpochRecord]) -> None:
    async def one(engine: Engine) -> None:
        for record in records:
            await engine.run_epoch(record)
            await asyncio.sleep(0)  # let queries in between epochs too

    await asyncio.gather(*(one(e) for e in engines))


def _balances(rows: list[tuple[Any, Any]]) -> dict[int, int]:
    return {key: value.balance for key, value in rows}


def _expected(state: dict[KeyRef, bytes]) -> dict[int, int]:
    return {
        ref.key: decode_canonical(value, Account).balance
        for ref, value in state.items()
        if ref.actor_type == "Account"
    }


async def _scans_while_running(
    level: Any, check: Callable[[int, dict[int, int]], None], epochs: int = 40
) -> int:
    records = _records(epochs)
    async with _cluster() as (engines, _, endpoints):
        client = QueryClient(app, endpoints[1], timeout_s=20)
        await client.connect()
        running = asyncio.ensure_future(_run_all(engines, records))
        scans = 0
        while not running.done():
            pages, epoch = await client._scan_pages(  # the epoch each answer was read at
                app.actor_types["Account"],
                _scan_request(level),
                None,
            )
            epochs_read = {page.epoch for page in pages}
            assert epochs_read == {epoch}, epochs_read  # one cut across both workers, said
            scanned = await client.scan(Account, isolation=COMMITTED)
            check(scanned.epoch, _balances(scanned))  # what a caller sees: rows and their cut
            rows = [
                (k, decode_canonical(v, Account))
                for p in pages
                for k, v in zip(p.keys, p.values, strict=True)
            ]
            check(epochs_read.pop(), _balances(rows))
            scans += 1
        await running
        await client.close()
    return scans


def _scan_request(level: Any) -> Any:
    from epochal.schemas.queries import Scan

    return Scan(0, 0, "Account", None, None, level)


def test_committed_scans_equal_the_oracle_at_their_epoch_while_epochs_run() -> None:
    records = _records(40)
    states = _oracle_states(records)
    total = 100 * ACCOUNTS
    seen: list[int] = []

    def check(epoch: int, balances: dict[int, int]) -> None:
        if epoch >= 0:
            assert balances == _expected(states[epoch]), f"epoch {epoch}"
            assert sum(balances.values()) == total
            seen.append(epoch)

    from epochal.schemas.queries import ReadLevel

    scans = asyncio.run(_scans_while_running(ReadLevel.COMMITTED, check))
    assert scans >= 5 and len(set(seen)) >= 3, (scans, seen)  # many cuts, not one at the end


def test_committed_point_reads_and_aggregates_follow_the_oracle() -> None:
    records = _records(10)
    states = _oracle_states(records)

    async def main() -> None:
        async with _cluster() as (engines, _, endpoints), QueryClient(app, endpoints) as client:
            for record in records:
                await asyncio.gather(*(e.run_epoch(record) for e in engines))
                expected = _expected(states[record.epoch])
                keys = list(range(ACCOUNTS))
                found = await client.get_many(Account, keys, isolation=COMMITTED)
                assert {k: v.balance for k, v in found.items() if v} == expected
                totals = await client.aggregate(
                    Account, "count", "sum:balance", "min:balance", "max:balance"
                )
                assert totals == {
                    "count": len(expected),
                    "sum:balance": sum(expected.values()),
                    "min:balance": min(expected.values()),
                    "max:balance": max(expected.values()),
                }
                rich = await client.scan(Account, where=[("balance", ">=", 150)])
                assert _balances(rich) == {k: b for k, b in expected.items() if b >= 150}
                some = await client.scan(Account, 5, 25, isolation=LIVE)
                assert _balances(some) == {k: b for k, b in expected.items() if 5 <= k < 25}
            assert await client.get(Account, 999_999) is None

    asyncio.run(main())


def test_queries_are_counted_and_timed_per_kind_and_isolation_level() -> None:
    records = _records(3)
    metrics = [Metrics(worker=str(w)) for w in range(2)]

    async def main() -> None:
        async with (
            _cluster(metrics=metrics) as (engines, _, endpoints),
            QueryClient(app, endpoints) as client,
        ):
            for record in records:
                await asyncio.gather(*(e.run_epoch(record) for e in engines))
            for _ in range(3):
                await client.get(Account, 1, isolation=COMMITTED)
            await client.scan(Account, 0, 10, isolation=LIVE)

    asyncio.run(main())

    def total(name: str, **labels: str) -> float:
        return sum(m.get(name, **labels) for m in metrics)

    assert total("epochal_queries_total", kind="get", level="committed") == 3
    assert total("epochal_queries_total", kind="scan", level="live") >= 1  # one per worker asked
    assert total("epochal_query_seconds_sum", kind="get", level="committed") > 0
    assert total("epochal_query_seconds_sum", kind="scan", level="live") > 0
    assert total("epochal_queries_total", kind="get", level="live") == 0


def test_scans_beyond_one_request_page_through() -> None:
    async def main() -> None:
        async with _cluster(workers=1, partitions=2) as (engines, _, endpoints):
            engine = engines[0]
            many = SCAN_BUDGET * 2 + 10
            value = msgspec.msgpack.encode({"balance": 1, "touched": 0})
            for key in range(many):
                ref = KeyRef("Account", key)
                engine.store.apply(ref, engine.ranges.partition_of(ref), value, epoch=0)
            engine.executed = engine.completed = 0
            async with QueryClient(app, endpoints) as client:
                rows = await client.scan(Account, isolation=LIVE)
                assert [k for k, _ in rows] == list(range(many))
                totals = await client.aggregate(Account, "count", "sum:balance", lo=10, hi=many)
                assert totals == {"count": many - 10, "sum:balance": many - 10}
                assert len(await client.scan(Account, limit=7)) == 7

    asyncio.run(main())


def test_bad_queries_get_clear_errors() -> None:
    async def main() -> None:
        async with _cluster(workers=1, partitions=2, token="s3cret") as (_, _, endpoints):
            async with QueryClient(app, endpoints, token="s3cret") as client:
                with pytest.raises(QueryError, match="unknown actor type 'Nope'"):
                    await client.get("Nope", 1)
                with pytest.raises(QueryError, match="keys are int"):
                    await client.get(Account, "one")
                with pytest.raises(QueryError, match="unknown operator"):
                    await client.scan(Account, where=[("balance", "~", 1)])
                with pytest.raises(QueryError, match="point reads"):
                    await client.scan(Account, isolation=SERIALIZABLE)
                with pytest.raises(QueryError, match="need Kafka"):
                    await client.get(AuditLog, "audit", isolation=SERIALIZABLE)
            with pytest.raises(QueryError, match="refused the connection: wrong or missing token"):
                await QueryClient(app, endpoints, token="wrong").connect()
            with pytest.raises(QueryError, match="refused"):
                await QueryClient(app, endpoints, token="").connect()
        gone = f"127.0.0.1:{free_ports(1)}"
        with pytest.raises(QueryUnavailableError, match="no query server answered"):
            await QueryClient(app, gone, timeout_s=0.5).connect()

    asyncio.run(main())


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl for a certificate")
def test_queries_over_tls_with_a_token(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    client_tls = ssl.create_default_context(cafile=str(cert))

    async def main() -> None:
        async with _cluster(1, 2, token="t", tls=server_tls) as (engines, _, endpoints):
            engines[0].store.apply(KeyRef("Account", 1), engines[0].ranges.partition_of(
                KeyRef("Account", 1)), msgspec.msgpack.encode({"balance": 9}), epoch=0)  # fmt: skip
            async with QueryClient(app, endpoints, token="t", tls=client_tls) as client:
                assert (await client.get(Account, 1, isolation=LIVE)).balance == 9
            with pytest.raises(QueryUnavailableError):  # plain TCP to a TLS server: no answer
                await QueryClient(app, endpoints, token="t", timeout_s=0.5).connect()

    asyncio.run(main())


shop = App("shop")


@shop.actor(key=str, key_sample=["a", "g", "n", "t"])
class Order(msgspec.Struct):
    status: str = "open"
    amount: int = 0
    note: str | None = None


class _OneSnapshot:
    """A snapshot in memory, as the warehouse's reader gives it (the SNAPSHOT level's source)."""

    def __init__(self, rows: dict[ActorKey, bytes]) -> None:
        self.rows = sorted(rows.items())

    def get(self, actor_type: str, keys: Any, ssid: int) -> dict[ActorKey, bytes | None]:
        found = dict(self.rows)
        return {k: found.get(k) for k in keys}

    def scan(
        self, actor_type: str, lo: ActorKey | None, hi: ActorKey | None, ssid: int
    ) -> list[tuple[ActorKey, bytes]]:
        return [(k, v) for k, v in self.rows if (lo is None or lo <= k) and (hi is None or k < hi)]


def test_reversed_ranges_and_sums_of_non_numbers_are_the_same_query_error_at_every_level() -> None:
    """``scan(T, "z", "a")`` failed in the client with ``max() arg is an empty sequence`` (so did
    an empty range at a split point), a sum over a str field joined the strings, a min over
    None and a str depended on which came first; a count of nothing in a snapshot was None."""
    orders = {f"{c}1": Order("open" if c < "m" else "shipped", ord(c)) for c in "bdhkpwz"}
    orders["x9"] = Order(note="gift")
    rows = {key: encode_canonical(order) for key, order in orders.items()}
    reversed_range = r"key range \['z', 'a'\) of Order is reversed"
    expected = {
        "count": len(orders),
        "sum:amount": sum(o.amount for o in orders.values()),
        "max:status": "shipped",
        "min:note": "gift",
    }

    async def main() -> None:
        async with _cluster(runs=shop) as (engines, servers, endpoints):
            for key, data in rows.items():
                ref = KeyRef("Order", key)
                partition = engines[0].ranges.partition_of(ref)
                engines[engines[0].worker_of[partition]].store.apply(ref, partition, data, 0)
            for engine in engines:
                engine.executed = engine.completed = 0
            split = engines[0].ranges.points["Order"][0]
            async with QueryClient(shop, endpoints, snapshots=_OneSnapshot(rows)) as client:
                for level in (LIVE, COMMITTED, SNAPSHOT(0)):
                    with pytest.raises(QueryError, match=reversed_range):
                        await client.scan(Order, "z", "a", isolation=level)
                    with pytest.raises(QueryError, match=reversed_range):
                        await client.aggregate(Order, lo="z", hi="a", isolation=level)
                    assert await client.scan(Order, split, split, isolation=level) == []
                    empty = await client.aggregate(Order, lo=split, hi=split, isolation=level)
                    assert empty == {"count": 0}, level
                    with pytest.raises(QueryError, match="'sum:status': status is a str"):
                        await client.aggregate(Order, "sum:status", isolation=level)
                    totals = await client.aggregate(Order, *expected, isolation=level)
                    assert totals == expected, level
            with pytest.raises(QueryError, match=reversed_range):  # to any client
                servers[0].answer(Scan(1, 1, "Order", "z", "a", ReadLevel.LIVE))

    asyncio.run(main())
    with pytest.raises(QueryError, match="'min:x': '<' not supported"):
        aggregate_step("min:x")(1, {"x": "one"})  # values of one field that do not compare
