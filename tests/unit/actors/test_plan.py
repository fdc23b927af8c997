from __future__ import annotations

from epochal.actors.outcome import TxnOutcome
from epochal.actors.plan import emitted_by, plan_epoch
from epochal.schemas.commands import EpochRecord, KeyRef, Origin
from tests.unit.actors.workload import Audit, Deposit, Transfer, app, command_log


def test_interior_transactions_run_first_ordered_by_parent_timestamp_and_emit_index() -> None:
    outcomes = [
        TxnOutcome(3, 5, "transfer", True, emits=[Audit(1, 31), Audit(2, 32)]),
        TxnOutcome(3, -1, "audit", True, emits=[Audit(3, 33)]),
        TxnOutcome(3, 2, "transfer", True, emits=[Audit(4, 34)]),
        TxnOutcome(3, 1, "transfer", False, emits=[Audit(9, 99)]),  # aborted: its emits vanish
    ]
    logged = command_log([[], [Deposit(1, 5)]])[1]
    record = EpochRecord(4, logged.now_ms, logged.seed, logged.code_hash, logged.txns)
    plan = plan_epoch(app, record, emitted_by(outcomes))

    assert [(p.seq, p.origin) for p in plan] == [
        (-4, Origin.INTERIOR), (-3, Origin.INTERIOR), (-2, Origin.INTERIOR), (-1, Origin.INTERIOR),
        (0, Origin.BORDER),
    ]  # fmt: skip
    assert [p.event for p in plan[:4]] == [Audit(3, 33), Audit(4, 34), Audit(1, 31), Audit(2, 32)]
    assert plan[0].keys == (KeyRef("Account", 3), KeyRef("AuditLog", "audit"))
    assert {p.epoch for p in plan} == {4}


def test_logged_transactions_keep_the_sequencer_order() -> None:
    (record,) = command_log([[Transfer(1, 2, 3), Deposit(4, 5), Transfer(6, 7, 8)]])
    assert [(p.seq, p.handler.name) for p in plan_epoch(app, record, [])] == [
        (0, "transfer"), (1, "deposit"), (2, "transfer"),
    ]  # fmt: skip
