from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from epochal.actors.executor import runs_on, split_plan
from epochal.actors.outcome import Emitted, TxnOutcome
from epochal.actors.partitioning import KeyRanges
from epochal.actors.plan import emitted_by, plan_epoch
from epochal.schemas.canonical import encode_canonical
from epochal.schemas.commands import EpochRecord, InputPosition, KeyRef, Origin
from tests.unit.actors.workload import Audit, Deposit, Transfer, app, command_log


def _emitted(epoch: int, seq: int, index: int, event: Audit) -> Emitted:
    keys = app.declared_keys(app.handlers["audit"], event)
    return Emitted(epoch, seq, index, "audit", encode_canonical(event), keys,
                   InputPosition("testbank.in.ops", 0, seq), "")  # fmt: skip


def test_interior_transactions_run_first_ordered_by_parent_timestamp_and_emit_index() -> None:
    outcomes = [
        TxnOutcome(3, 5, "transfer", True, emits=[_emitted(3, 5, 0, Audit(1, 31)),
                                                   _emitted(3, 5, 1, Audit(2, 32))]),
        TxnOutcome(3, -1, "audit", True, emits=[_emitted(3, -1, 0, Audit(3, 33))]),
        TxnOutcome(3, 2, "transfer", True, emits=[_emitted(3, 2, 0, Audit(4, 34))]),
        TxnOutcome(3, 1, "transfer", False, emits=[_emitted(3, 1, 0, Audit(9, 99))]),  # aborted
    ]  # fmt: skip
    logged = command_log([[], [Deposit(1, 5)]])[1]
    record = EpochRecord(4, logged.now_ms, logged.seed, logged.code_hash, logged.txns)
    plan = plan_epoch(app, record, emitted_by(outcomes))

    assert [(p.seq, p.origin) for p in plan] == [
        (-4, Origin.INTERIOR), (-3, Origin.INTERIOR), (-2, Origin.INTERIOR), (-1, Origin.INTERIOR),
        (0, Origin.BORDER),
    ]  # fmt: skip
    assert [p.event for p in plan[:4]] == [Audit(3, 33), Audit(4, 34), Audit(1, 31), Audit(2, 32)]
    assert plan[0].keys == (KeyRef("Account", 3), KeyRef("AuditLog", "audit"))
    assert [p.source.offset for p in plan[:4] if p.source] == [-1, 2, 5, 5]  # the chain's input
    assert {p.epoch for p in plan} == {4}


def test_each_plan_decodes_its_own_events() -> None:
    (record,) = command_log([[Transfer(1, 2, 3)]])
    first, second = plan_epoch(app, record, []), plan_epoch(app, record, [])
    assert first[0].event == second[0].event and first[0].event is not second[0].event


def test_logged_transactions_keep_the_sequencer_order() -> None:
    (record,) = command_log([[Transfer(1, 2, 3), Deposit(4, 5), Transfer(6, 7, 8)]])
    assert [(p.seq, p.handler.name) for p in plan_epoch(app, record, [])] == [
        (0, "transfer"), (1, "deposit"), (2, "transfer"),
    ]  # fmt: skip


def test_an_event_that_no_longer_decodes_is_a_planned_abort() -> None:
    (record,) = command_log([[Deposit(1, 5)]])
    txn = record.txns[0]
    broken = EpochRecord(0, 0, 0, "", (type(txn)(0, "deposit", b"\xc1", txn.keys),))
    (invocation,) = plan_epoch(app, broken, [])
    assert invocation.error.startswith("event no longer decodes as Deposit")


@given(
    st.lists(st.lists(st.integers(0, 39), max_size=4), max_size=20),
    st.sampled_from([(0, 1, 0, 1), (1, 0, 0, 1), (0, 0, 1, 1), (1, 1, 1, 0)]),
)
def test_a_worker_plans_exactly_the_transactions_it_runs(
    key_sets: list[list[int]], worker_of: tuple[int, ...]
) -> None:
    """What a worker decodes (``runs_on``) is what its split keeps, keyless transactions (which
    partition 0's worker runs) included."""
    ranges = KeyRanges.even(app, len(worker_of))
    for worker in (0, 1):
        runs_here = runs_on(ranges, worker_of, worker)
        assert runs_here is not None
        for accounts in key_sets:
            keys = tuple(sorted({KeyRef("Account", a) for a in accounts}))
            (invocation,) = plan_epoch(app, command_log([[], [Deposit(1, 5)]])[1], [])
            step = split_plan(
                [msgspec.structs.replace(invocation, keys=keys)], ranges, worker_of, worker
            )
            assert runs_here(keys) == bool(step), (keys, worker)
    assert runs_on(ranges, (0, 0, 0, 0), 0) is None  # one worker runs everything
