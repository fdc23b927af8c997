"""Two workers exchanging reads and emits over real TCP on loopback equal the serial oracle."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings

from epochal.actors.digest import state_digest
from epochal.actors.engine import Engine
from epochal.actors.oracle import SerialOracle
from epochal.actors.transport import Peers
from epochal.schemas.commands import EpochRecord
from tests.conftest import free_port_pair
from tests.unit.actors.workload import app, batches, command_log


async def _cluster(records: list[EpochRecord], partitions: int, workers: int) -> tuple[str, list]:  # type: ignore[type-arg]
    base = free_port_pair()
    addresses = [f"127.0.0.1:{base + w}" for w in range(workers)] if workers == 2 else []
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
    try:
        per_worker = await asyncio.gather(*(e.run(records) for e in engines))
    finally:
        for e in engines:
            if e.peers:
                await e.peers.close()
    outcomes = sorted(
        (r.epoch, o.seq, o.committed, o.reason, o.egress)
        for results in per_worker
        for r in results
        for o in r.outcomes
    )
    return state_digest(item for e in engines for item in e.store.items()), outcomes


@pytest.mark.parametrize(("partitions", "workers"), [(2, 2), (4, 2)])
@settings(max_examples=50, deadline=None)
@given(batches=batches)
def test_two_workers_over_tcp_match_the_serial_oracle(
    partitions: int, workers: int, batches: list
) -> None:  # type: ignore[type-arg]
    records = command_log(batches)
    oracle = SerialOracle(app)
    expected = oracle.run(records)
    digest, outcomes = asyncio.run(_cluster(records, partitions, workers))
    assert digest == expected[-1].digest
    assert outcomes == sorted(
        (r.epoch, o.seq, o.committed, o.reason, o.egress) for r in expected for o in r.outcomes
    )
