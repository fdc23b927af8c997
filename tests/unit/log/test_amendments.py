"""Amendments applied to epochs as they are read: skipped transactions and re-coded epochs."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from epochal.actors.engine import EpochResult, LocalEngine
from epochal.actors.outcome import AbortKind
from epochal.actors.plan import ensure_same_code, plan_epoch
from epochal.errors import ConfigError, RecoveryError
from epochal.log.amendments import Amendments, skipped_dead_letters
from epochal.log.command_log import MemoryCommandLog, chunk_epoch
from epochal.schemas.codec import decode, encode
from epochal.schemas.commands import (
    SKIPPED_REASON,
    Amendment,
    AmendmentKind,
    EpochRecord,
    InputPosition,
)
from epochal.skip import parse_input
from tests.unit.actors.workload import Deposit, Transfer, app, command_log


def _skip(epoch: int, seq: int) -> Amendment:
    return Amendment(AmendmentKind.SKIP, epoch, epoch, seq=seq)


def _recode(first: int, last: int, code: str) -> Amendment:
    return Amendment(AmendmentKind.RECODE, first, last, code_hash=code)


def test_no_amendment_leaves_every_epoch_as_logged() -> None:
    records = command_log([[Deposit(1, 5)], [Transfer(1, 2, 3)]])
    amendments = Amendments.of([_skip(7, 0), _recode(5, 6, "new")])
    assert all(amendments.apply(r) is r for r in records)  # the hot path allocates nothing
    assert all(Amendments().apply(r) is r for r in records)


def test_an_amended_epoch_is_archived_as_amended_and_a_logged_one_as_logged() -> None:
    (record,) = command_log([[Deposit(1, 5), Deposit(2, 6)]])
    (logged,) = MemoryCommandLog(chunk_bytes=64, chunks=chunk_epoch(record, 64)).epochs()
    assert logged.logged is not None and bytes(logged.msgpack()) == encode(record)  # as logged
    amended = Amendments.of([_skip(0, 1)]).amend(logged)
    assert decode(bytes(amended.msgpack()), EpochRecord) == amended.record != record


def test_a_recode_covers_its_epochs_only_and_a_later_one_wins() -> None:
    records = command_log([[Deposit(1, 5)]] * 5)
    amendments = Amendments.of([_recode(1, 3, "v2"), _recode(3, 3, "v3")])
    assert [amendments.apply(r).code_hash for r in records] == [
        app.code_hash(), "v2", "v2", "v3", app.code_hash(),
    ]  # fmt: skip
    # the events of a re-coded epoch were checked by other code: they are checked again
    assert [amendments.apply(r).recoded for r in records] == [False, True, True, True, False]
    ensure_same_code(amendments.apply(records[2]), "v2")  # no refusal under the code recorded
    with pytest.raises(RecoveryError, match="other application code"):
        ensure_same_code(amendments.apply(records[3]), "v2")


def test_a_skipped_transaction_aborts_as_planned_and_changes_nothing() -> None:
    ops = [Deposit(1, 50), Transfer(1, 2, 20), Deposit(2, 7)]
    (record,) = command_log([ops])
    amended = Amendments.of([_skip(0, 1)]).apply(record)
    plan = plan_epoch(app, amended, [])
    assert [(p.seq, p.error) for p in plan] == [(0, ""), (1, SKIPPED_REASON), (2, "")]

    def run(r: EpochRecord) -> tuple[str, EpochResult]:
        engine = LocalEngine(app, 3)
        result = asyncio.run(engine.run_epoch(r))
        return engine.digest(), result

    without = msgspec.structs.replace(record, txns=(record.txns[0], record.txns[2]))
    digest, result = run(amended)
    assert digest == run(without)[0] != run(record)[0]
    (skipped,) = [o for o in result.outcomes if o.seq == 1]
    assert not skipped.committed and skipped.reason == SKIPPED_REASON
    assert (skipped.abort, skipped.abort_label) == (AbortKind.SKIPPED, "skipped")


def test_a_skipped_transaction_becomes_one_dead_letter_naming_its_input() -> None:
    (record,) = command_log([[Deposit(1, 5), Deposit(2, 6)]])
    amended = Amendments.of([_skip(0, 1)]).apply(record)
    (letter,) = skipped_dead_letters(amended)
    source = record.txns[1].source
    assert source is not None
    assert (letter.topic, letter.partition, letter.offset) == (
        source.topic, source.partition, source.offset,
    )  # fmt: skip
    assert letter.reason == SKIPPED_REASON and letter.value == record.txns[1].event
    assert skipped_dead_letters(record) == []


def test_an_amendment_written_twice_is_one_amendment() -> None:
    twice = [_skip(3, 1), _skip(3, 1)]
    assert {a.key for a in twice} == {b"skip:3:1"}
    assert _recode(1, 2, "a").key != _skip(1, 2).key


def test_a_handler_the_code_no_longer_has_is_named() -> None:
    (record,) = command_log([[Deposit(1, 5)]])
    gone = msgspec.structs.replace(
        record, txns=(msgspec.structs.replace(record.txns[0], handler="refund"),)
    )
    with pytest.raises(RecoveryError, match="handler 'refund' is not in this version"):
        plan_epoch(app, gone, [])


def test_a_skipped_input_is_named_by_its_coordinates_and_amends_no_epoch() -> None:
    skip = Amendment(AmendmentKind.SKIP_INPUT, -1, -1, topic="t", partition=2, offset=7)
    assert skip.key == b"skip-input:t:2:7"
    amendments = Amendments.of([skip, _skip(3, 0)])
    assert amendments.inputs == {("t", 2, 7)} and amendments.skipped(3, 0)
    records = command_log([[Deposit(1, 5)]])
    assert Amendments.of([skip]).apply(records[0]) is records[0]


@pytest.mark.parametrize("text", ["t/0", "t@5", "/0@5", "t/x@5", "t/0@-1"])
def test_an_input_is_named_topic_partition_at_offset(text: str) -> None:
    assert parse_input("bank.in.x/3@42") == InputPosition("bank.in.x", 3, 42)
    with pytest.raises(ConfigError, match="TOPIC/PARTITION@OFFSET"):
        parse_input(text)
