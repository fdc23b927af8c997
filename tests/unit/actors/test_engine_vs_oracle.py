"""The engine equals the serial oracle: same digests every epoch, same outcomes and egress."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest
from hypothesis import given, settings

from epochal.actors.engine import EpochResult, LocalEngine
from epochal.actors.oracle import SerialOracle
from epochal.actors.outcome import TxnOutcome
from epochal.actors.plan import PLAN_SLICE
from epochal.log.command_log import MemoryCommandLog
from epochal.recovery.replay import replay_command_log
from epochal.schemas.commands import PartitionId
from tests.unit.actors.workload import (
    Account,
    Deposit,
    Transfer,
    app,
    batches,
    command_log,
    several_slices,
)


def _engine_run(partitions: int, records: list) -> list[EpochResult]:  # type: ignore[type-arg]
    return asyncio.run(LocalEngine(app, partitions).run(records))


def _summary(results: list[EpochResult]) -> list[object]:
    return [
        (
            r.epoch,
            r.digest,
            [(o.seq, o.handler, o.committed, o.reason, o.egress, o.emits) for o in r.outcomes],
        )
        for r in results
    ]


@pytest.mark.parametrize("partitions", [1, 2, 4])
@settings(max_examples=60, deadline=None)
@given(batches=batches)
def test_engine_matches_the_serial_oracle(partitions: int, batches: list) -> None:  # type: ignore[type-arg]
    records = command_log(batches)
    expected = SerialOracle(app).run(records)
    assert _summary(_engine_run(partitions, records)) == _summary(expected)


@settings(max_examples=30, deadline=None)
@given(batches=batches)
def test_two_runs_of_one_command_log_give_identical_digests_every_epoch(batches: list) -> None:  # type: ignore[type-arg]
    records = command_log(batches)
    first = [r.digest for r in _engine_run(4, records)]
    assert first == [r.digest for r in _engine_run(4, records)]
    assert first == [r.digest for r in _engine_run(2, records)]


def test_bank_invariant_money_is_conserved_and_never_negative() -> None:
    import random

    rng = random.Random(3)
    opening = [[Deposit(a, 100) for a in range(40)]]
    transfers = [
        [Transfer(rng.randrange(40), rng.randrange(40), rng.randrange(1, 150)) for _ in range(300)]
        for _ in range(10)
    ]
    engine = LocalEngine(app, 4)
    results = asyncio.run(engine.run(command_log(opening + transfers)))
    balances = {ref.key: v.balance for ref, v in engine.items() if isinstance(v, Account)}
    assert sum(balances.values()) == 40 * 100
    assert min(balances.values()) >= 0
    outcomes = [o for r in results for o in r.outcomes]
    assert any(not o.committed and "balance >= 0" in o.reason for o in outcomes)
    assert sum(o.committed for o in outcomes if o.handler == "transfer") > 1000


def test_epochs_of_several_slices_match_the_oracle_and_replay_reaches_its_state() -> None:
    """One worker plans and runs an epoch a slice at a time: epochs of several slices, one
    opening with more interior transactions (audits) than a slice holds, give the oracle's
    outcomes and digests; a replay, which keeps only the outcomes that emitted, its state."""
    records = several_slices()
    expected = SerialOracle(app).run(records)
    assert max(sum(o.seq < 0 for o in r.outcomes) for r in expected) > PLAN_SLICE
    assert _summary(_engine_run(1, records)) == _summary(expected)
    log = MemoryCommandLog()
    for record in records:
        log.append(record)
    engine, _ = replay_command_log(app, log.epochs())
    assert engine.digest() == expected[-1].digest


def test_outcomes_handed_over_slice_by_slice_are_the_epochs_outcomes() -> None:
    """With ``on_reported`` an engine hands over each slice's outcomes by partition as soon as
    it has run them, and keeps only those that emitted: joined, the slices are the outcomes
    it reports otherwise, and the state, the interior transactions carried on and what a
    snapshot archives of each epoch are the same."""
    from epochal.actors.engine import Engine

    kept, handed = Engine(app, 4, snapshots=True), Engine(app, 4, snapshots=True)
    most = 0
    for record in several_slices():
        whole = asyncio.run(kept.run_epoch(record))
        slices: list[Mapping[PartitionId, list[TxnOutcome]]] = []
        result = asyncio.run(handed.run_epoch(record, slices.append))
        most = max(most, len(slices))
        assert {p: [o for s in slices for o in s[p]] for p in whole.by_partition} == (
            whole.by_partition
        )
        assert result.outcomes == tuple(o for o in whole.outcomes if o.emits)
        assert (result.digest, handed.carried) == (whole.digest, kept.carried)
        [reported] = kept.take_reported()
        assert reported.seqs == [o.seq for o in whole.outcomes]
        assert reported.aborted == {o.seq: o.reason for o in whole.outcomes if not o.committed}
        assert handed.take_reported() == [reported]
    assert most > 2


@settings(max_examples=30, deadline=None)
@given(batches=batches)
def test_snapshots_change_nothing_and_their_changes_rebuild_each_snapshot(batches: list) -> None:  # type: ignore[type-arg]
    from epochal.actors.digest import state_digest
    from epochal.actors.engine import Engine

    records = command_log(batches, snapshot_every=2)
    plain = [r.digest for r in _engine_run(4, records)]
    results = asyncio.run(Engine(app, 4, snapshots=True).run(records))
    assert [r.digest for r in results] == plain
    rebuilt: dict = {}  # type: ignore[type-arg]
    for result in results:
        if result.changes is None:
            continue
        for change in result.changes:
            if change.after is None:
                rebuilt.pop(change.ref, None)
            else:
                rebuilt[change.ref] = change.after
        assert state_digest(rebuilt.items()) == result.digest
