"""Two worker *processes* exchanging canonical reads and emits over TCP equal the serial oracle.

Unlike two engines in one process, nothing can be shared between the participants of a
transaction here but bytes: each process decodes its own events and reads, as workers on two
hosts would. The workload includes handlers that change their event in place, store ill-typed
values, emit events that share a list with the state, and use aliased keys.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
from collections.abc import Iterator
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

import pytest
from hypothesis import HealthCheck, given, settings

from epochal.actors.digest import DigestSum
from epochal.actors.engine import Engine
from epochal.actors.oracle import SerialOracle
from epochal.actors.transport import Peers
from epochal.schemas.codec import decode, encode
from epochal.schemas.commands import EpochRecord
from tests.conftest import free_port_pair
from tests.unit.actors.workload import app, batches, command_log

Summary = list[tuple[int, int, bool, str, list[tuple[str, bytes]]]]


async def _run(
    records: list[EpochRecord], partitions: int, worker: int, base: int
) -> tuple[int, Summary]:
    addresses = [f"127.0.0.1:{base + w}" for w in range(2)]
    peers = Peers(worker, addresses, generation=1)
    engine = Engine(app, partitions, worker, 2, peers)
    await peers.start()
    try:
        results = await engine.run(records)
    finally:
        await peers.close()
    outcomes = [
        (r.epoch, o.seq, o.committed, o.reason, o.egress) for r in results for o in r.outcomes
    ]
    return engine.store.digest_total() or 0, outcomes


def _serve(conn: Connection, worker: int) -> None:
    """A worker process: runs each command log it is sent on a fresh engine, answers results."""
    while (job := conn.recv()) is not None:
        raw, partitions, base = job
        records = [decode(r, EpochRecord) for r in raw]
        conn.send(asyncio.run(_run(records, partitions, worker, base)))


@pytest.fixture(scope="module")
def worker_pair() -> Iterator[list[Connection]]:
    context = multiprocessing.get_context("spawn")
    previous = os.environ.get("PYTHONHASHSEED")
    os.environ["PYTHONHASHSEED"] = "0"  # as every real worker runs
    try:
        pipes = [context.Pipe() for _ in range(2)]
        processes: list[BaseProcess] = [
            context.Process(target=_serve, args=(child, w), daemon=True)
            for w, (_, child) in enumerate(pipes)
        ]
        for process in processes:
            process.start()
    finally:
        if previous is None:
            del os.environ["PYTHONHASHSEED"]
        else:
            os.environ["PYTHONHASHSEED"] = previous
    yield [parent for parent, _ in pipes]
    for parent, _ in pipes:
        parent.send(None)
    for process in processes:
        process.join(10)


@pytest.mark.parametrize("partitions", [2, 4])
@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batches=batches)
def test_two_worker_processes_over_tcp_match_the_serial_oracle(
    worker_pair: list[Connection],
    partitions: int,
    batches: list,  # type: ignore[type-arg]
) -> None:
    records = command_log(batches)
    expected = SerialOracle(app).run(records)
    base = free_port_pair()
    for conn in worker_pair:
        conn.send(([encode(r) for r in records], partitions, base))
    answers = [conn.recv() for conn in worker_pair]
    assert DigestSum(sum(total for total, _ in answers)).hex() == expected[-1].digest
    outcomes = sorted(o for _, summary in answers for o in summary)
    assert outcomes == sorted(
        (r.epoch, o.seq, o.committed, o.reason, o.egress) for r in expected for o in r.outcomes
    )
