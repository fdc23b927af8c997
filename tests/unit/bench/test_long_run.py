"""The long run's judgement: the RSS samples set against the transfers drained, a least-squares
slope through the later half of those after the warm-up, and flat only when that slope, drawn
from the warm-up to the end, grows less than the bound over a run long enough to tell a leak
from buffers filling."""

from __future__ import annotations

from typing import Any

import pytest

from bench.long_run import (
    FLAT_MB,
    MIN_SPAN,
    describe,
    drained_at,
    flatness,
    memory,
    passed,
    slope,
    verdict,
)

WARM = 1_000_000  # 10 % of 10M


def _points(mb_at: Any, end: int = 10_000_000, step: int = 250_000) -> list[tuple[int, float]]:
    return [(x, float(mb_at(x))) for x in range(0, end + 1, step)]


def test_the_slope_is_a_least_squares_fit_not_the_ends() -> None:
    assert slope([0, 1, 2, 3], [10, 12, 14, 16]) == pytest.approx(2.0)
    assert slope([0, 1, 2, 3], [10, 13, 13, 16]) == pytest.approx(1.8)  # noise fitted, not ends
    with pytest.raises(ValueError, match="two different x"):
        slope([5, 5], [1, 2])


def test_a_sample_counts_the_transfers_out_when_it_was_taken() -> None:
    timeline = [(10.0, 500), (11.0, 1_500), (12.5, 3_000)]
    assert [drained_at(timeline, t) for t in (9.0, 10.0, 10.9, 12.0, 99.0)] == [
        0,
        500,
        500,
        1_500,
        3_000,
    ]
    assert drained_at([], 5.0) == 0


def test_memory_that_settles_after_the_warm_up_is_flat_despite_its_noise() -> None:
    # fills to 250 MB during the warm-up, then +-3 MB of noise around it: no trend
    judged = flatness(
        _points(lambda x: min(250, 100 + x / 5_000) + (3 if x // 250_000 % 2 else -3)), WARM
    )
    assert judged["flat"] is True
    assert judged["after_warmup_mb"] == 247.0 and judged["end_mb"] == 247.0
    assert judged["peak_mb"] == 253.0 and judged["span"] == 9_000_000
    assert abs(judged["growth_mb"]) < 2 and abs(judged["slope_mb_per_m"]) < 0.2


def test_a_leak_of_a_few_bytes_a_transfer_is_not_flat() -> None:
    judged = flatness(_points(lambda x: 200 + 4 * x / 1e6), WARM)  # 4 bytes a transfer
    assert judged["slope_mb_per_m"] == pytest.approx(4.0)
    assert judged["growth_mb"] == pytest.approx(36.0) and judged["flat"] is False
    line = describe("worker0", judged, FLAT_MB)
    assert "NOT flat: +36.0 MB over 9.00M transfers (bound 20 MB)" in line, line
    assert line.startswith("worker0: 204 MB after the warm-up, 240 at the end, peak 240")


def test_a_working_set_that_fills_after_the_warm_up_then_stops_is_flat() -> None:
    # as worker 0's snapshot process over 30M transfers: +40 MB over the first 6M, then level
    judged = flatness(_points(lambda x: 260 + 40 * min(x, 6e6) / 6e6, end=30_000_000), 3_000_000)
    assert judged["flat"] is True and abs(judged["slope_mb_per_m"]) < 1e-9
    assert judged["end_mb"] - judged["after_warmup_mb"] == pytest.approx(20.0)


def test_a_leak_that_starts_late_is_not_flat() -> None:
    # level until 5M, then 8 bytes a transfer: the later half's slope, drawn over the whole span
    judged = flatness(_points(lambda x: 200 + 8 * max(0, x - 5e6) / 1e6), WARM)
    assert judged["slope_mb_per_m"] == pytest.approx(8.0)
    assert judged["growth_mb"] == pytest.approx(72.0) and judged["flat"] is False


def test_a_run_too_short_to_tell_a_leak_from_filling_gives_its_figures_but_no_verdict() -> None:
    judged = flatness(_points(lambda x: 200 + x / 1_000, end=300_000, step=10_000), 30_000)
    assert judged["growth_mb"] == pytest.approx(270.0) and judged["span"] < MIN_SPAN
    assert judged["flat"] is None
    assert "too short to judge: 1M needed" in describe("snapshots0", judged, FLAT_MB)
    nothing_after = flatness([(0, 50.0), (100, 60.0)], 1_000)
    assert nothing_after["flat"] is None and nothing_after["growth_mb"] is None
    assert "not judged (0 sample(s) after the warm-up)" in describe("x", nothing_after, FLAT_MB)


def test_every_role_is_judged_but_the_broker_and_the_verdict_is_the_worst() -> None:
    series = [
        {"transfers": x, "rss_mb": {"broker": 400 + x / 1e5, "worker0": 200.0, "sequencer": 90.0}}
        for x in range(0, 10_000_001, 500_000)
    ]
    judged = memory(series, 10_000_000, 0.1, FLAT_MB)
    assert sorted(judged) == ["broker", "sequencer", "worker0"]
    assert judged["broker"]["growth_mb"] == pytest.approx(90.0) and judged["broker"]["flat"] is None
    assert "(Kafka's JVM: not judged)" in describe("broker", judged["broker"], FLAT_MB)
    assert verdict(judged) is True
    assert verdict({**judged, "worker1": {**judged["worker0"], "flat": False}}) is False
    assert verdict({"worker0": {**judged["worker0"], "flat": None}}) is None


def test_a_long_run_passes_without_rollback_with_each_outcome_money_and_flat_memory() -> None:
    good = {
        "rollbacks": 0,
        "transfers": 1_000,
        "egress": 1_000,
        "conservation": {"holds": True},
        "flat": True,
    }
    assert passed(good) and passed({**good, "flat": None})  # too short to judge is no failure
    assert not passed({**good, "rollbacks": 1})
    assert not passed({**good, "egress": 1_001})  # an outcome twice
    assert not passed({**good, "conservation": {"holds": False}})
    assert not passed({**good, "flat": False})
