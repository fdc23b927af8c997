"""The layout a snapshot was taken under goes into its manifest row and comes back as it was;
skew is judged from it, as often as the schedule says."""

from __future__ import annotations

from epochal.config import RebalanceConfig
from epochal.recovery.layouts import RebalanceSchedule, recorded_layout, skew_of
from epochal.recovery.snapshots import _manifest_of, _manifest_row
from epochal.schemas.snapshots import Manifest
from tests.unit.actors.test_partitioning import shop


def _manifest(points: dict[str, list[int | str]], shares: list[int]) -> Manifest:
    return Manifest(7, 7, 1_700_000_000_000, 42, {"shop.in.orders:0": 9}, {"Stock": 3}, {},
                    {"Stock": 30}, "00", b"", 2, "hash", points=points,
                    partition_actors=shares)  # fmt: skip


def test_the_layout_and_partition_shares_round_trip_through_a_manifest_row() -> None:
    manifest = _manifest({"Stock": ["sku-0100"], "Counter": [45]}, [10, 20])
    back = _manifest_of(_manifest_row(manifest).to_pylist()[0])
    assert back == manifest
    ranges = recorded_layout(shop, back)
    assert ranges is not None and ranges.points["Counter"] == [45]


def test_a_manifest_row_of_an_older_epochal_has_no_layout() -> None:
    row = _manifest_row(_manifest({}, [])).to_pylist()[0]
    assert row["points"] is None
    del row["points"], row["partition_actors"]  # a table without the columns
    back = _manifest_of(row)
    assert back.points == {} and back.partition_actors == []
    assert recorded_layout(shop, back) is None


def test_skew_is_judged_only_for_a_snapshot_taken_under_the_layout_in_force() -> None:
    skewed = _manifest({"Stock": ["sku-0100"], "Counter": [45]}, [2, 28])
    current = recorded_layout(shop, skewed)
    assert current is not None
    assert skew_of(shop, current, skewed) == [2, 28]
    assert skew_of(shop, current, _manifest(current.recorded(), [14, 16])) is None
    assert skew_of(shop, current, _manifest({"Stock": ["a"]}, [2, 28])) is None  # another layout


def test_skew_checks_come_at_their_interval_judge_each_snapshot_once_and_slow_down() -> None:
    rebalancer = RebalanceSchedule(RebalanceConfig(check_interval_ms=1000), now=0.0)
    assert not rebalancer.due(0.5) and rebalancer.due(1.0) and not rebalancer.due(1.5)
    assert rebalancer.fresh(7) and not rebalancer.fresh(7) and not rebalancer.fresh(3)
    rebalancer.slow_down(now=2.0)  # the next check waits twice as long, then four times
    assert not rebalancer.due(3.9) and rebalancer.due(4.0)
    rebalancer.slow_down(now=4.0)
    assert not rebalancer.due(7.9) and rebalancer.due(8.0)
    for _ in range(10):
        rebalancer.slow_down(now=8.0)
    assert rebalancer.interval_s == 32.0  # at most 32 times the interval
    assert not RebalanceSchedule(RebalanceConfig(check_interval_ms=0), now=0.0).due(1e9)
