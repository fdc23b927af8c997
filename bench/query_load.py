"""The query side of ``bench.queries``: a client process that runs timed cells of point reads.

A :class:`Cell` is one measurement: ``get`` (1 key) or ``get_many`` (more) of random bank
accounts at one isolation level, with ``in_flight`` queries outstanding at once (asyncio tasks
sharing one pipelined :class:`~epochal.client.QueryClient`), for ``seconds``. The
process runs its cells in order and puts each :class:`CellResult` on a queue as it finishes, so
that the benchmark's own process (which feeds transfers and watches the egress) never shares a
GIL with the client it measures.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.open_loop import percentiles
from epochal.client import COMMITTED, LIVE, SERIALIZABLE, SNAPSHOT, QueryClient
from epochal.config import KafkaConfig, SnapshotConfig
from epochal.recovery.snapshot_reads import SnapshotReader
from examples.bank.app import ACCOUNTS, Account, account_key, app

__all__ = ["LEVELS", "Cell", "CellResult", "Target", "client_process", "key_sets"]

LEVELS = ("live", "committed", "serializable", "snapshot")
KEY_SETS = 256
"""Random key sets drawn per keys-per-query, used round robin (drawing costs client time)."""


@dataclass(frozen=True)
class Target:
    """The cluster a client process queries: the app's name, a worker's query address, the
    broker (``SERIALIZABLE`` goes through Kafka) and the warehouse (``SNAPSHOT`` reads Delta)."""

    app_name: str
    endpoint: str
    bootstrap: str
    warehouse: str
    loop: str = "uvloop"


@dataclass(frozen=True)
class Cell:
    """``keys`` random accounts per query at ``level``, ``in_flight`` at once, for ``seconds``
    (or until the benchmark says stop)."""

    level: str
    keys: int
    in_flight: int
    seconds: float
    phase: str = ""

    @property
    def label(self) -> str:
        return f"{self.level} {self.keys}k x{self.in_flight}"


@dataclass
class CellResult:
    """What a cell measured; ``started_ms``/``ended_ms`` are wall-clock times (ms since the
    epoch) so that the benchmark can line the cell up with the egress it saw meanwhile."""

    cell: Cell
    queries: int
    seconds: float
    started_ms: float
    ended_ms: float
    latency_ms: dict[str, float]
    client_cpu: float
    """The client process's CPU time over the cell's wall time (1.0: one core busy)."""
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    missing: int = 0
    """Keys read as absent: every account exists, so any is a wrong answer."""
    ssid: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def qps(self) -> float:
        return self.queries / self.seconds if self.seconds > 0 else 0.0

    @property
    def keys_per_s(self) -> float:
        return self.qps * self.cell.keys

    def as_json(self) -> dict[str, Any]:
        row = dataclasses.asdict(self)
        row |= row.pop("cell") | {"qps": self.qps, "keys_per_s": self.keys_per_s}
        return row


def key_sets(keys: int, count: int = KEY_SETS, seed: int = 7) -> list[list[str]]:
    """``count`` sets of ``keys`` distinct account keys each, drawn at random."""
    rng = random.Random(seed * 100_003 + keys)
    accounts = [account_key(i) for i in range(ACCOUNTS)]
    return [rng.sample(accounts, keys) for _ in range(count)]


def client_process(target: Target, cells: list[Cell], out: Any, stop: Any) -> None:
    """The client process's main: ``("ready", pid)``, then ``("cell", CellResult)`` per cell,
    then ``("done", None)`` on ``out``; ``("error", traceback)`` if it fails. ``stop`` (an
    event) ends the running cell early and skips the rest."""
    try:
        runner = _Runner(target, cells, out, stop)
        if target.loop == "uvloop":
            import uvloop

            uvloop.run(runner.run())
        else:
            asyncio.run(runner.run())
        out.put(("done", None))
    except BaseException:
        out.put(("error", traceback.format_exc()))


class _Runner:
    def __init__(self, target: Target, cells: list[Cell], out: Any, stop: Any) -> None:
        self.target = target
        self.cells = cells
        self.out = out
        self.stop = stop
        self.stopped = False
        self.reader = SnapshotReader(SnapshotConfig(target.warehouse), target.app_name)

    async def run(self) -> None:
        named = dataclasses.replace(app, name=self.target.app_name)
        client = QueryClient(named, self.target.endpoint, kafka=KafkaConfig(self.target.bootstrap),
                             snapshots=self.reader, timeout_s=30)  # fmt: skip
        watch = asyncio.create_task(self._watch_stop())
        try:
            await client.connect(timeout_s=120)
            self.out.put(("ready", os.getpid()))
            sets = {n: key_sets(n) for n in sorted({c.keys for c in self.cells})}
            for cell in self.cells:
                if self.stopped:
                    break
                self.out.put(("cell", await self._measure(client, cell, sets[cell.keys])))
        finally:
            watch.cancel()
            await client.close()

    async def _watch_stop(self) -> None:
        while not self.stop.is_set():
            await asyncio.sleep(0.02)
        self.stopped = True

    async def _measure(self, client: QueryClient, cell: Cell, sets: list[list[str]]) -> CellResult:
        ssid = await asyncio.to_thread(self.reader.latest) if cell.level == "snapshot" else None
        isolation = {"live": LIVE, "committed": COMMITTED, "serializable": SERIALIZABLE}.get(
            cell.level
        ) or SNAPSHOT(ssid if ssid is not None else -1)
        read = _reader(client, isolation)
        errors: Counter[str] = Counter()
        await _warm_up(read, sets[0], errors)
        latencies: list[float] = []
        missing = 0
        deadline = time.perf_counter() + cell.seconds

        async def task(first: int) -> None:
            nonlocal missing
            n = first
            while time.perf_counter() < deadline and not self.stopped:
                keys = sets[n % len(sets)]
                n += cell.in_flight
                began = time.perf_counter()
                try:
                    missing += await read(keys)
                except Exception as exc:  # a bench reports every failure, and goes on
                    errors[f"{type(exc).__name__}: {exc}"[:300]] += 1
                    await asyncio.sleep(0.01)
                    continue
                latencies.append(time.perf_counter() - began)

        cpu, wall, began = time.process_time(), time.time(), time.perf_counter()
        await asyncio.gather(*(task(i) for i in range(cell.in_flight)))
        elapsed = time.perf_counter() - began
        return CellResult(
            cell, len(latencies), elapsed, wall * 1000, time.time() * 1000,
            percentiles([1000 * s for s in latencies]),
            (time.process_time() - cpu) / elapsed, sum(errors.values()),
            [f"{n} x {text}" for text, n in errors.most_common(3)], missing, ssid,
        )  # fmt: skip


def _reader(client: QueryClient, isolation: Any) -> Callable[[list[str]], Any]:
    """An async function reading some keys; it returns how many of them were absent."""

    async def read(keys: list[str]) -> int:
        if len(keys) == 1:
            return int(await client.get(Account, keys[0], isolation=isolation) is None)
        found = await client.get_many(Account, keys, isolation=isolation)
        return sum(1 for value in found.values() if value is None)

    return read


async def _warm_up(read: Callable[[list[str]], Any], keys: list[str], errors: Counter[str]) -> None:
    """One query before the clock starts (a first SERIALIZABLE read opens its Kafka channel)."""
    try:
        await read(keys)
    except Exception as exc:
        errors[f"warm-up {type(exc).__name__}: {exc}"[:300]] += 1
