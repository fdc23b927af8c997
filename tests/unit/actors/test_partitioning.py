from __future__ import annotations

import msgspec
from hypothesis import example, given
from hypothesis import strategies as st

from epochal.actors.api import App
from epochal.actors.partitioning import KeyRanges, quantile_points, rebalance_worth_it, skewed
from epochal.schemas.commands import KeyRef
from epochal.schemas.egress import EgressLayout
from tests.unit.actors.workload import app


@given(st.lists(st.integers(0, 10_000), min_size=2), st.integers(1, 8))
def test_partitions_own_contiguous_ranges(keys: list[int], partitions: int) -> None:
    ranges = KeyRanges.even(app, partitions)
    owners = [ranges.partition_of(KeyRef("Account", k)) for k in sorted(keys)]
    assert owners == sorted(owners)  # ascending keys never go back to a lower partition
    assert all(0 <= p < partitions for p in owners)


def test_key_sample_splits_evenly() -> None:
    ranges = KeyRanges.even(app, 4)
    counts = [0] * 4
    for key in range(40):
        counts[ranges.partition_of(KeyRef("Account", key))] += 1
    assert counts == [10, 10, 10, 10]


_refs = st.one_of(
    st.builds(KeyRef, st.just("Account"), st.integers(-5, 60)),
    st.builds(KeyRef, st.just("AuditLog"), st.text(max_size=6)),
)


@given(st.lists(_refs, max_size=5), st.integers(1, 8))
@example([KeyRef("Account", 1), KeyRef("Account", 35)], 4)
@example([KeyRef("AuditLog", "b"), KeyRef("Account", 35)], 2)
@example([KeyRef("Account", 35)], 4)
def test_the_partitions_of_keys_are_each_keys_own_in_order(
    refs: list[KeyRef], partitions: int
) -> None:
    """However many keys (none, one, two: the quick paths; more), of whichever types."""
    ranges = KeyRanges.even(app, partitions)
    expected = tuple(ranges.partition_of(ref) for ref in refs)
    assert ranges.partitions_of_keys(tuple(refs)) == expected


def test_participants_are_sorted_and_default_to_partition_zero() -> None:
    ranges = KeyRanges.even(app, 4)
    refs = (KeyRef("Account", 35), KeyRef("Account", 1), KeyRef("Account", 2))
    assert ranges.participants(refs) == (0, 3)
    assert ranges.participants(()) == (0,)


# --- layouts learned from the keys seen ------------------------------------------------------

shop = App("shop")


@shop.actor(key=str)
class Stock(msgspec.Struct):
    units: int = 0


@shop.actor(key=int)
class Counter(msgspec.Struct):
    n: int = 0


SKUS = [f"sku-{i:04d}" for i in range(200)]
ORDERS = [f"o-{i}" for i in range(300)]


@given(st.lists(st.one_of(st.integers(), st.text(max_size=4)), max_size=60), st.integers(1, 9))
def test_quantile_points_ascend_strictly_and_split_into_equal_counts(
    keys: list[int | str], partitions: int
) -> None:
    same_type = [k for k in keys if isinstance(k, str)]
    points = quantile_points(same_type, partitions)
    assert list(points) == sorted(set(points)) and len(points) <= partitions - 1
    distinct = sorted(set(same_type))
    if len(points) == partitions - 1 and distinct:
        counts = KeyRanges(partitions, {"t": points}).shares({"t": distinct})
        assert max(counts) - min(counts) <= 1  # as equal as a count of distinct keys allows


def test_learned_points_spread_keys_that_share_a_prefix_over_every_partition() -> None:
    keys = {"Stock": [*SKUS, *ORDERS], "Counter": list(range(0, 4000, 10))}
    default = KeyRanges.even(shop, 4)
    assert default.shares({"Stock": keys["Stock"]}) == [0, 0, 300, 200]  # 'o-', 'sku-'
    assert default.shares({"Counter": keys["Counter"]}) == [400, 0, 0, 0]  # all below 2**18
    learned = KeyRanges.learned(shop, 4, keys)
    assert learned.shares({"Stock": keys["Stock"]}) == [125] * 4
    assert learned.shares({"Counter": keys["Counter"]}) == [100] * 4


def test_a_rebalance_needs_skew_and_a_materially_better_layout_so_it_cannot_loop() -> None:
    keys = {"Stock": [*SKUS, *ORDERS]}
    before = KeyRanges.even(shop, 4).shares(keys)
    learned = KeyRanges.learned(shop, 4, keys)
    after = learned.shares(keys)
    assert skewed(before) and not skewed(after)
    assert rebalance_worth_it(before, after)
    again = KeyRanges.learned(shop, 4, keys).shares(keys)  # the next snapshot, same keys
    assert not rebalance_worth_it(after, again)
    assert not skewed([3, 2, 2, 1]) and skewed([9, 1, 1, 1]) and not skewed([0, 0, 0, 0])
    assert skewed([1, 9]) and not skewed([3, 7])  # of 2 partitions: over 3/4 in one
    assert not rebalance_worth_it([90, 10, 10, 10], [80, 20, 10, 10])  # hardly better
    assert rebalance_worth_it([90, 10, 10, 10], [30, 30, 30, 30])
    assert not rebalance_worth_it([9, 1, 1, 1], [3, 3, 3, 3])  # too few actors to tell


def test_few_keys_keep_the_new_apps_points_and_one_key_stays_in_one_partition() -> None:
    learned = KeyRanges.learned(shop, 4, {"Stock": ["a", "b"], "Counter": [7] * 50})
    assert learned.points == KeyRanges.even(shop, 4).points


def test_a_recorded_layout_is_taken_as_recorded_and_an_old_record_as_it_was_then() -> None:
    recorded = {"Stock": ["m"]}
    ranges = KeyRanges.of(shop, 2, recorded)
    assert ranges.points["Stock"] == ["m"]
    assert ranges.points["Counter"] == KeyRanges.even(shop, 2).points["Counter"]  # a new type
    legacy = KeyRanges.of(shop, 4, None)  # str keys split over printable ASCII, as before
    assert legacy.points["Stock"] == [chr(0x20 + 95 * i // 4) for i in (1, 2, 3)]
    assert KeyRanges.of(shop, 2, ranges.recorded()) == ranges


def test_layout_records_round_trip_with_int_and_str_points() -> None:
    ranges = KeyRanges.learned(shop, 3, {"Stock": SKUS, "Counter": list(range(90))})
    layout = EgressLayout(3, 17, ranges.recorded())
    back = msgspec.msgpack.decode(msgspec.msgpack.encode(layout), type=EgressLayout)
    assert back == layout and KeyRanges.of(shop, 3, back.points) == ranges
    assert isinstance(back.points and back.points["Counter"][0], int)
