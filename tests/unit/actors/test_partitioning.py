from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from epochal.actors.partitioning import KeyRanges
from epochal.schemas.commands import KeyRef
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


def test_participants_are_sorted_and_default_to_partition_zero() -> None:
    ranges = KeyRanges.even(app, 4)
    refs = (KeyRef("Account", 35), KeyRef("Account", 1), KeyRef("Account", 2))
    assert ranges.participants(refs) == (0, 3)
    assert ranges.participants(()) == (0,)
