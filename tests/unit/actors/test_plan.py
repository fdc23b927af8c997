from __future__ import annotations

from collections import Counter

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from epochal.actors.executor import share_slices
from epochal.actors.outcome import Emitted, TxnOutcome
from epochal.actors.partitioning import KeyRanges
from epochal.actors.plan import Invocation, emitted_by, plan_epoch, plan_slices
from epochal.schemas.canonical import encode_canonical
from epochal.schemas.commands import CommandTxn, EpochRecord, InputPosition, KeyRef, Origin
from examples.bank.app import Deposit as BankDeposit
from examples.bank.app import app as bank
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


def _bank_deposit(amount: int, code_hash: str, recoded: bool = False) -> EpochRecord:
    """An epoch of one bank deposit of ``amount`` (its constructor checks nothing: 0 breaks
    the schema's ``gt=0``, as a log written by other code could)."""
    event = msgspec.msgpack.encode(BankDeposit("acct-0001", amount))
    txn = CommandTxn(0, "deposit", event, (KeyRef("Account", "acct-0001"),))
    return EpochRecord(0, 0, 0, code_hash, (txn,), recoded=recoded)


def _bank_plans(record: EpochRecord, carried: list[Emitted] | None = None) -> list[Invocation]:
    """The invocations one worker and each of two make of ``record``."""
    invocations = plan_epoch(bank, record, carried or [])
    ranges = KeyRanges.even(bank, 2)
    for worker in (0, 1):
        slices = share_slices(bank, record, carried or [], ranges, worker_of=[0, 1], worker=worker)
        steps = [step for part in slices for step in part]
        invocations += [s.invocation for s in steps]
    return invocations


def test_events_logged_by_the_running_code_are_not_checked_again() -> None:
    for invocation in _bank_plans(_bank_deposit(0, bank.code_hash())):
        assert invocation.error == ""
        assert invocation.event == BankDeposit("acct-0001", 0)


@pytest.mark.parametrize(
    "record",
    [_bank_deposit(0, "other code"), _bank_deposit(0, bank.code_hash(), recoded=True)],
    ids=["logged by other code", "re-coded by a deploy"],
)
def test_events_checked_by_other_code_are_checked_by_the_running_schema(
    record: EpochRecord,
) -> None:
    invocations = _bank_plans(record)
    assert len(invocations) == 2  # one worker's and the one of two that runs the key
    for invocation in invocations:
        assert invocation.error.startswith("event no longer decodes as Deposit")


def test_interior_events_are_checked_again_they_may_come_from_older_code() -> None:
    event = msgspec.msgpack.encode(BankDeposit("acct-0001", 0))
    emitted = Emitted(
        0,
        0,
        0,
        "deposit",
        event,
        (KeyRef("Account", "acct-0001"),),
        InputPosition("bank.in.transfers", 0, 0),
        "",
    )
    record = EpochRecord(1, 0, 0, bank.code_hash())
    invocations = _bank_plans(record, [emitted])
    assert len(invocations) == 2
    for invocation in invocations:
        assert invocation.error.startswith("event no longer decodes as Deposit")


@given(
    st.lists(st.lists(st.integers(0, 39), max_size=4), max_size=20),
    st.lists(st.lists(st.integers(0, 39), max_size=3), max_size=4),
    st.sampled_from([(0, 1, 0, 1), (1, 0, 0, 1), (0, 0, 1, 1), (1, 1, 1, 0)]),
)
def test_a_worker_plans_the_transactions_on_its_keys_and_one_worker_reports_each(
    key_sets: list[list[int]], emitted_sets: list[list[int]], worker_of: tuple[int, ...]
) -> None:
    """A worker's share is every transaction, interior ones included, with a key on one of its
    partitions (one without keys: partition 0's worker's), in timestamp order; its local keys
    are those on its partitions; the owner of the lowest partition reports it, so each
    transaction is reported exactly once: it runs there, and only there."""
    ranges = KeyRanges.even(app, len(worker_of))

    def refs(accounts: list[int]) -> tuple[KeyRef, ...]:
        return tuple(sorted({KeyRef("Account", a) for a in accounts}))

    event = encode_canonical(Deposit(1, 5))
    txns = tuple(CommandTxn(seq, "deposit", event, refs(a)) for seq, a in enumerate(key_sets))
    record = EpochRecord(4, 0, 0, "", txns)
    carried = [Emitted(3, i, 0, "deposit", event, refs(a)) for i, a in enumerate(emitted_sets)]
    everything = [(inv.seq, inv.keys) for inv in plan_epoch(app, record, carried)]
    reported: Counter[int] = Counter()
    for worker in (0, 1):
        slices = share_slices(app, record, carried, ranges, worker_of=worker_of, worker=worker)
        steps = [step for part in slices for step in part]
        owners = {seq: {worker_of[ranges.partition_of(r)] for r in keys} or {worker_of[0]}
                  for seq, keys in everything}  # fmt: skip
        mine = [(seq, keys) for seq, keys in everything if worker in owners[seq]]
        assert [(step.invocation.seq, step.invocation.keys) for step in steps] == mine
        for step in steps:
            parts = [ranges.partition_of(ref) for ref in step.invocation.keys]
            here = [i for i, p in enumerate(parts) if worker_of[p] == worker]
            assert step.local_keys == tuple(step.invocation.keys[i] for i in here)
            assert step.partitions == tuple(parts[i] for i in here)
            assert step.workers == tuple(sorted(owners[step.invocation.seq]))
            assert step.runner == worker_of[min(parts, default=0)]
            assert (step.reporter is None) == (step.runner != worker)
            if step.reporter is None:
                assert step.invocation.event is None  # another worker decodes and runs it
            else:
                assert step.reporter == min(parts, default=0)
                reported[step.invocation.seq] += 1
    assert reported == Counter(seq for seq, _ in everything)


@given(
    st.integers(0, 12),
    st.integers(0, 5),
    st.one_of(st.none(), st.integers(1, 7)),
)
def test_an_epoch_planned_in_slices_is_its_plan_cut_in_order(
    logged: int, interior: int, size: int | None
) -> None:
    """Slices of ``size`` (the last one shorter, none empty) that joined are the whole plan:
    interior transactions first, each planned once."""
    event = encode_canonical(Deposit(1, 5))
    keys = (KeyRef("Account", 1),)
    txns = tuple(CommandTxn(seq, "deposit", event, keys) for seq in range(logged))
    carried = [Emitted(3, i, 0, "deposit", event, keys) for i in range(interior)]
    record = EpochRecord(4, 0, 0, app.code_hash(), txns)
    slices = list(plan_slices(app, record, carried, size))
    assert [len(s) for s in slices[:-1]] == [size or 0] * (len(slices) - 1)
    assert all(slices) and all(len(s) <= (size or logged + interior) for s in slices)
    joined = [(inv.seq, inv.origin, inv.event) for s in slices for inv in s]
    assert joined == [(inv.seq, inv.origin, inv.event) for inv in plan_epoch(app, record, carried)]
    assert [seq for seq, _, _ in joined] == list(range(-interior, logged))
