"""What a worker a handler stopped leaves for its supervisor, and the crash-loop line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from epochal.config import FailureConfig
from epochal.errors import ConfigError
from epochal.poison import Cause, CrashLoop, FailedAt, crash_loop_line, failed_worker_file


def test_the_record_round_trips_and_is_read_once(tmp_path: Path) -> None:
    path = failed_worker_file(tmp_path, "bank", 1)
    assert path == tmp_path / "bank" / "failed-worker-1.json"
    record = FailedAt(5, 812, worker=1, seq=4, handler="deposit", cause=Cause.HANG)
    record.write(path)
    assert json.loads(path.read_text())["cause"] == "hang"  # data, not a sentence to parse
    assert FailedAt.read(path) == record
    assert not path.exists() and FailedAt.read(path) is None


def test_an_older_record_of_the_epoch_alone_still_reads(tmp_path: Path) -> None:
    path = tmp_path / "failed-worker-0.json"
    path.write_text(json.dumps({"generation": 2, "epoch": 812}))
    assert FailedAt.read(path) == FailedAt(2, 812)
    path.write_text("{not json")
    assert FailedAt.read(path) is None


def test_failures_at_one_transaction_count_in_a_row_per_worker() -> None:
    loop = CrashLoop()
    at = [FailedAt(g, 812, worker=1, seq=4, handler="deposit") for g in range(1, 5)]
    assert [loop.observe([record]) for record in at[:3]] == [
        [(at[0], 1)],
        [(at[1], 2)],
        [(at[2], 3)],
    ]
    other = FailedAt(4, 812, worker=1, seq=5, handler="deposit")  # another seq: a new streak
    assert loop.observe([other]) == [(other, 1)]
    assert loop.observe([]) == []  # a rollback for another reason ends it
    assert loop.observe([at[3]]) == [(at[3], 1)]


def test_two_workers_keep_their_own_streaks() -> None:
    loop = CrashLoop()
    zero, one = FailedAt(1, 7, worker=0, seq=1), FailedAt(1, 9, worker=1, seq=2)
    loop.observe([zero, one])
    zero2, one2 = FailedAt(2, 7, worker=0, seq=1), FailedAt(2, 9, worker=1, seq=2)
    assert loop.observe([one2, zero2]) == [(zero2, 2), (one2, 2)]
    assert loop.observe([FailedAt(3, 9, worker=1, seq=2)])[0][1] == 3  # worker 0's ended


def test_the_crash_loop_line_names_the_transaction_and_the_ways_out() -> None:
    record = FailedAt(5, 812, worker=1, seq=4, handler="deposit")
    assert crash_loop_line(record, 3) == (
        "generation 5: worker 1 failed 3 times in a row at epoch 812 (handler 'deposit', seq 4; "
        "its handler crashed): deploy a fixed version or skip it with epochal skip APP "
        "--epoch 812 --seq 4"
    )
    hung = FailedAt(5, 812, worker=1, seq=4, handler="deposit", cause=Cause.HANG)
    assert "its handler hung" in crash_loop_line(hung, 2)


def test_the_hang_bound_is_half_the_failure_bound_unless_set_and_never_more() -> None:
    assert FailureConfig().hang_bound_ms == 3000
    assert FailureConfig(failure_timeout_ms=1500).hang_bound_ms == 750
    assert FailureConfig(hang_timeout_ms=1000).hang_bound_ms == 1000
    with pytest.raises(ConfigError, match="at most half the failure timeout"):
        FailureConfig(hang_timeout_ms=30_000)
    with pytest.raises(ConfigError):
        FailureConfig(hang_timeout_ms=-1)
