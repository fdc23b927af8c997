from __future__ import annotations

import gc

import pytest
from hypothesis import given, settings

from epochal.actors.oracle import SerialOracle
from epochal.errors import RecoveryError
from epochal.log.command_log import MemoryCommandLog
from epochal.recovery.replay import replay_command_log
from epochal.schemas.commands import EpochRecord
from tests.unit.actors.workload import app, batches, command_log


def _log(records: list[EpochRecord]) -> MemoryCommandLog:
    log = MemoryCommandLog()
    for record in records:
        log.append(record)
    return log


@settings(max_examples=25, deadline=None)
@given(batches=batches)
def test_replay_reaches_the_oracle_state(batches: list) -> None:  # type: ignore[type-arg]
    records = command_log(batches)
    engine, replayed = replay_command_log(app, _log(records).epochs(), partitions=3)
    assert replayed == len(records)
    assert engine.digest() == SerialOracle(app).run(records)[-1].digest


def test_replay_refuses_a_log_written_by_other_code_unless_allowed() -> None:
    (record,) = command_log([[]])
    foreign = EpochRecord(record.epoch, record.now_ms, record.seed, "other-code", record.txns)
    with pytest.raises(RecoveryError, match="other application code"):
        replay_command_log(app, _log([foreign]).epochs())
    _, replayed = replay_command_log(app, _log([foreign]).epochs(), allow_code_change=True)
    assert replayed == 1


def test_replay_leaves_the_collector_as_it_found_it() -> None:
    """A replay collects less while it runs (``collecting_less``), in the caller's process: after
    it, refused or not, the collector runs as the caller had it."""
    records = command_log([[]])
    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    try:
        gc.set_threshold(1_234, 7, 9)
        replay_command_log(app, _log(records).epochs())
        assert (gc.get_threshold(), gc.get_freeze_count()) == ((1_234, 7, 9), frozen)
        foreign = EpochRecord(0, 0, 0, "other-code", ())
        with pytest.raises(RecoveryError):
            replay_command_log(app, _log([foreign]).epochs())
        assert (gc.get_threshold(), gc.get_freeze_count()) == ((1_234, 7, 9), frozen)
    finally:
        gc.set_threshold(*before)
