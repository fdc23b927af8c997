"""What a worker a handler stopped leaves for its supervisor, and the bound of a hang."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from epochal.config import FailureConfig
from epochal.errors import ConfigError
from epochal.poison import Cause, FailedAt, failed_worker_file


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


def test_the_hang_bound_is_half_the_failure_bound_unless_set_and_never_more() -> None:
    assert FailureConfig().hang_bound_ms == 3000
    assert FailureConfig(failure_timeout_ms=1500).hang_bound_ms == 750
    assert FailureConfig(hang_timeout_ms=1000).hang_bound_ms == 1000
    with pytest.raises(ConfigError, match="at most half the failure timeout"):
        FailureConfig(hang_timeout_ms=30_000)
    with pytest.raises(ConfigError):
        FailureConfig(hang_timeout_ms=-1)
