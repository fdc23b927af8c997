"""Two or three workers exchanging reads and emits over real TCP on loopback equal the serial
oracle."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from hypothesis import given, settings

from epochal.actors.digest import state_digest
from epochal.actors.engine import Engine, EpochResult
from epochal.actors.oracle import SerialOracle
from epochal.actors.partitioning import KeyRanges
from epochal.actors.transport import Peers, TransportError
from epochal.schemas.commands import EpochRecord, KeyRef
from tests.conftest import free_ports
from tests.unit.actors.workload import (
    Deposit,
    Transfer,
    app,
    batches,
    command_log,
    several_slices,
)


async def _engines(
    records: list[EpochRecord],
    partitions: int,
    workers: int,
    tamper: Callable[[list[Engine]], None] = lambda engines: None,
) -> tuple[list[Engine], list[list[EpochResult]]]:
    """Every worker's engine after running ``records`` (``tamper`` may break them first), and
    each one's results."""
    base = free_ports(workers)
    addresses = [f"127.0.0.1:{base + w}" for w in range(workers)]
    engines: list[Engine] = []
    for w in range(workers):
        engine: Engine
        if workers == 1:
            engine = Engine(app, partitions)
        else:
            peers = Peers(
                w, addresses, generation=1, on_frame=lambda f, w=w: engines[w].on_frame(f)
            )
            engine = Engine(app, partitions, w, workers, peers)
        engines.append(engine)
    if workers > 1:
        await asyncio.gather(*(e.peers.start() for e in engines if e.peers))
    tamper(engines)
    try:
        running = asyncio.gather(*(e.run(records) for e in engines))
        per_worker = await asyncio.wait_for(running, 60)  # a read lost or never sent: a failure
    finally:
        for e in engines:
            if e.peers:
                await e.peers.close()
    return engines, per_worker


async def _cluster(records: list[EpochRecord], partitions: int, workers: int) -> tuple[str, list]:  # type: ignore[type-arg]
    engines, per_worker = await _engines(records, partitions, workers)
    outcomes = sorted(
        (r.epoch, o.seq, o.committed, o.reason, o.egress)
        for results in per_worker
        for r in results
        for o in r.outcomes
    )
    return state_digest(item for e in engines for item in e.store.items()), outcomes


@pytest.mark.parametrize(("partitions", "workers"), [(2, 2), (4, 2), (3, 3)])
@settings(max_examples=50, deadline=None)
@given(batches=batches)
def test_workers_over_tcp_match_the_serial_oracle(
    partitions: int, workers: int, batches: list[list[object]]
) -> None:
    records = command_log(batches)
    oracle = SerialOracle(app)
    expected = oracle.run(records)
    digest, outcomes = asyncio.run(_cluster(records, partitions, workers))
    assert digest == expected[-1].digest
    assert outcomes == sorted(
        (r.epoch, o.seq, o.committed, o.reason, o.egress) for r in expected for o in r.outcomes
    )


@pytest.mark.parametrize(("partitions", "workers"), [(4, 2), (3, 3)])
def test_workers_running_epochs_of_several_slices_match_the_serial_oracle(
    partitions: int, workers: int
) -> None:
    """Each worker plans and runs its share a slice of the epoch at a time, exchanging reads
    within each: epochs of several slices (one opening with more interior transactions than
    a slice) give the oracle's state and outcomes."""
    records = several_slices()
    expected = SerialOracle(app).run(records)
    digest, outcomes = asyncio.run(_cluster(records, partitions, workers))
    assert digest == expected[-1].digest
    assert outcomes == sorted(
        (r.epoch, o.seq, o.committed, o.reason, o.egress) for r in expected for o in r.outcomes
    )


@settings(max_examples=30, deadline=None)
@given(batches=batches)
def test_one_worker_reports_counts_and_keeps_actors_in_the_partitions_two_workers_do(
    batches: list,  # type: ignore[type-arg]
) -> None:
    """The lowest partition among a transaction's keys reports it (egress writers and layout
    changes rely on it), each partition counts the transactions it took part in, and each
    actor is its key's partition's: one worker (which runs epochs without exchange) as two."""
    records = command_log(batches)

    def seen(engines: list[Engine], results: list[list[EpochResult]]) -> tuple[dict, dict, dict]:  # type: ignore[type-arg]
        reporters = {
            (r.epoch, o.seq): partition
            for per_worker in results
            for r in per_worker
            for partition, outcomes in r.by_partition.items()
            for o in outcomes
        }
        ran = {p: n for e in engines for p, n in e.ran.items()}
        actors = {p: n for e in engines for p, n in e.store.actors.items()}
        return reporters, ran, actors

    one = seen(*asyncio.run(_engines(records, 4, 1)))
    two = seen(*asyncio.run(_engines(records, 4, 2)))
    assert one == two


def test_no_worker_ends_an_epoch_without_the_writes_of_a_transaction_it_lent_its_reads_to() -> None:
    """The worker that runs a cross-worker transaction sends the others its writes before it
    says it ended the epoch; one that did not (a bug, a frame lost) fails the worker that lent
    its reads, rather than leave it at a cut without them."""
    ranges = KeyRanges.even(app, 2)
    a = next(k for k in range(40) if ranges.partition_of(KeyRef("Account", k)) == 0)
    b = next(k for k in range(40) if ranges.partition_of(KeyRef("Account", k)) == 1)
    records = command_log([[Deposit(a, 10), Deposit(b, 10)], [Transfer(a, b, 3)]])

    def lose_writes(engines: list[Engine]) -> None:
        engines[0].send_writes = lambda *args: None  # type: ignore[method-assign]

    asyncio.run(_engines(records, 2, 2))  # as it is: no error
    with pytest.raises(TransportError, match="writes of transactions this worker lent"):
        asyncio.run(_engines(records, 2, 2, tamper=lose_writes))
