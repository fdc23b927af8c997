"""The versioned store: values as of any epoch since the floor, the changes a snapshot takes
(O(changed actors)), and digest deltas that add up to the state's digest."""

from __future__ import annotations

import gc
from collections.abc import Sequence

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from epochal.actors.digest import DigestSum, hash_sum, item_hash, state_digest
from epochal.actors.store import (
    Change,
    ChangedSince,
    ChangeEnds,
    StateStore,
    changes_by_type,
)
from epochal.schemas.commands import KeyRef, PartitionId

P = PartitionId(0)
A, B = KeyRef("T", "a"), KeyRef("T", "b")


def test_values_as_of_each_epoch_since_the_floor() -> None:
    store = StateStore([P], versioned=True)
    store.apply(A, P, b"1", epoch=1)
    store.apply(B, P, b"x", epoch=2)
    store.apply(A, P, b"2", epoch=3)
    store.apply(A, P, b"3", epoch=3)  # the end of epoch 3 is what counts
    store.apply(B, P, None, epoch=4)
    assert [store.value_at(A, e) for e in (0, 1, 2, 3, 4)] == [None, b"1", b"1", b"3", b"3"]
    assert [store.value_at(B, e) for e in (1, 2, 3, 4)] == [None, b"x", b"x", None]
    store.raise_floor(3)
    assert store.value_at(A, 3) == b"3" and store.value_at(B, 3) == b"x"
    assert store.value_at(B, 4) is None


def test_a_snapshot_takes_exactly_what_changed_since_the_last_one() -> None:
    store = StateStore([P], versioned=True)
    store.apply(A, P, b"1", epoch=1)
    store.apply(B, P, b"x", epoch=1)
    first = {c.ref: (c.before, c.after) for c in store.take_changes(1)}
    assert first == {A: (None, b"1"), B: (None, b"x")}
    store.apply(A, P, b"2", epoch=2)
    store.apply(A, P, b"1", epoch=3)  # back where it was: no change to snapshot
    store.apply(B, P, None, epoch=3)
    assert {c.ref: (c.before, c.after) for c in store.take_changes(3)} == {B: (b"x", None)}
    assert list(store.take_changes(4)) == []


def test_the_changes_taken_are_those_of_the_snapshot_whenever_they_are_read() -> None:
    """The snapshot writer reads them on its thread while the loop goes on writing: what it
    reads is the state at the snapshot, not after."""
    store = StateStore([P], versioned=True)
    store.apply(A, P, b"1", epoch=1)
    taken = store.take_changes(1)
    store.apply(A, P, b"2", epoch=2)
    store.apply(B, P, b"x", epoch=2)
    assert [(c.ref, c.before, c.after) for c in taken] == [(A, None, b"1")]
    assert len(taken) == 1 and store.value_at(A, 1) == b"1" and store.value_at(A, 2) == b"2"
    assert [(c.ref, c.before, c.after) for c in store.take_changes(2)] == [
        (A, b"1", b"2"), (B, None, b"x"),
    ]  # fmt: skip


def test_an_unversioned_store_keeps_no_history() -> None:
    store = StateStore([P])
    store.apply(A, P, b"1", epoch=1)
    assert list(store.take_changes(1)) == [] and store.values == {A: b"1"}


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([A, B, KeyRef("T", "c")]),
                          st.one_of(st.none(), st.binary(max_size=3))), max_size=30))  # fmt: skip
def test_snapshot_digest_deltas_add_up_to_the_state_digest(writes: list) -> None:  # type: ignore[type-arg]
    store = StateStore([P], versioned=True)
    digest = DigestSum()

    def add(changes: Sequence[Change]) -> None:  # as a snapshot part hashes its changes
        for name, c in changes_by_type(changes).items():
            delta = hash_sum(name, c.keys, c.after) - hash_sum(name, c.keys, c.before)
            digest.total = (digest.total + delta) % 2**256

    for epoch, (ref, value) in enumerate(writes):
        store.apply(ref, P, value, epoch)
        if epoch % 4 == 3:
            add(store.take_changes(epoch))
    add(store.take_changes(len(writes)))
    assert digest.hex() == state_digest(store.items())


_VALUES = st.one_of(st.none(), st.sampled_from([b"1", b"2"]))  # written back to a value, often


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([A, B, KeyRef("T", "c")]), _VALUES), max_size=30))
def test_what_crosses_to_the_snapshot_process_makes_the_same_changes(
    writes: list[tuple[KeyRef, bytes | None]],
) -> None:
    """Each epoch's writes go as columns, made without hashing a key here: merged there, they
    give the changes taken here, an actor written back to its value included."""
    store = StateStore([P], versioned=True)
    for epoch, (ref, value) in enumerate(writes):
        store.apply(ref, P, value, epoch // 3)
    taken = store.take_changes(len(writes))
    assert isinstance(taken, ChangedSince)
    for size in (1, 2, 5):  # sent a few epochs at a time: the same columns, in order
        chunks = list(taken.column_chunks(size))
        assert all(0 < len(chunk) <= size for chunk in chunks)
        assert [c for chunk in chunks for c in chunk] == taken.columns()
    assert [c for chunk in taken.column_chunks(2) for c in chunk] == taken.columns()  # cached
    sent = msgspec.msgpack.encode(taken.columns())
    columns = msgspec.msgpack.decode(sent, type=list[ChangeEnds])
    assert all(len(c.refs) == len(c.partitions) == len(c.before) == len(c.after) for c in columns)
    again = ChangedSince.of_columns(columns)
    assert list(again) == list(taken)
    by_type = again.by_type()  # what a part writes and hashes: the same changes, per type
    assert by_type == changes_by_type(list(taken))
    assert sorted(by_type) == sorted({c.ref.actor_type for c in taken})
    for name, columns_of_type in by_type.items():
        mine = [c for c in taken if c.ref.actor_type == name]
        assert columns_of_type.keys == [c.ref.key for c in mine]
        assert columns_of_type.before == [c.before for c in mine]
        assert columns_of_type.after == [c.after for c in mine]
        hashed = hash_sum(name, columns_of_type.keys, columns_of_type.after) - hash_sum(
            name, columns_of_type.keys, columns_of_type.before
        )
        gone = sum(item_hash(c.ref, c.before) for c in mine if c.before is not None)
        assert hashed == sum(item_hash(c.ref, c.after) for c in mine if c.after is not None) - gone


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([A, B, KeyRef("T", "c")]), _VALUES), max_size=30),
       st.integers(min_value=0, max_value=30))  # fmt: skip
def test_a_digest_kept_from_any_moment_is_the_one_kept_all_along(
    writes: list[tuple[KeyRef, bytes | None]], start: int
) -> None:
    """A replay's store hashes its actors once, at the end: the digest it then keeps is the one
    a store that hashed every write has."""
    always, late = StateStore([P]), StateStore([P], track_digest=False)
    for epoch, (ref, value) in enumerate(writes):
        if epoch == start:
            late.track_digest()
        always.apply(ref, P, value, epoch)
        late.apply(ref, P, value, epoch)
    late.track_digest()
    assert late.digest_total() == always.digest_total()
    assert DigestSum(always.digest_total() or 0).hex() == state_digest(always.items())


def test_versions_kept_for_a_snapshot_give_the_cycle_collector_nothing_to_walk() -> None:
    """A worker keeps two values per transfer until its next snapshot: objects the collector
    tracks, each counted towards its next young collection, cost a worker a tenth of its time.
    An epoch's writes cost it three dicts (never tracked); a write, nothing."""
    store = StateStore([P], versioned=True)
    refs = [KeyRef("T", f"k{i}") for i in range(10)]
    for ref in refs:
        store.apply(ref, P, b"0", epoch=0)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        before = gc.get_count()[0]
        for write in range(1, 5001):
            store.apply(refs[write % 10], P, write.to_bytes(2, "big"), 1 + write // 500)
        tracked = gc.get_count()[0] - before
    finally:
        if was_enabled:
            gc.enable()
    assert store.value_at(refs[3], 10) == (4993).to_bytes(2, "big")
    assert store.value_at(refs[3], 1) == (493).to_bytes(2, "big")
    assert tracked < 50, f"{tracked} tracked objects for 5,000 writes in 11 epochs"


_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.sampled_from([A, B, KeyRef("T", "c")]), _VALUES),
        st.tuples(st.just("next"), st.integers(min_value=1, max_value=3)),
        st.tuples(st.just("snapshot"), st.integers(min_value=0, max_value=2)),
        st.tuples(st.just("floor"), st.integers(min_value=0, max_value=2)),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(_STEPS)
def test_reads_and_snapshots_match_the_whole_history(steps: list[tuple]) -> None:  # type: ignore[type-arg]
    """Against a model that keeps every write: the value as of each epoch since the floor, and
    each snapshot's changes (taken at the newest epoch or one before it, as a query-only store
    raises its floor behind the one it runs)."""
    store = StateStore([P], versioned=True)
    history: list[tuple[int, KeyRef, bytes | None]] = []
    epoch, floor = 0, -1

    def at(ref: KeyRef, cut: int) -> bytes | None:
        values = [v for e, r, v in history if r == ref and e <= cut]
        return values[-1] if values else None

    for step in steps:
        if step[0] == "write":
            epoch = max(epoch, floor + 1)  # an engine writes only in epochs after the floor
            store.apply(step[1], P, step[2], epoch)
            history.append((epoch, step[1], step[2]))
        elif step[0] == "next":
            epoch += step[1]
        else:
            cut = max(floor, epoch - step[1])
            if step[0] == "snapshot":
                taken = store.take_changes(cut)
                expected = {r: (at(r, floor), at(r, cut)) for _, r, _ in history}
                got = {c.ref: (c.before, c.after) for c in taken}
                assert got == {r: ends for r, ends in expected.items() if ends[0] != ends[1]}
            else:
                store.raise_floor(cut)
            floor = cut
        for ref in (A, B, KeyRef("T", "c")):
            for cut in range(floor, epoch + 2):
                assert store.value_at(ref, cut) == at(ref, cut), (ref, cut)
        keys, _ = store.keys_from("T", None)  # every actor that existed since the floor
        lived = {r.key for _, r, _ in history if any(at(r, c) for c in range(floor, epoch + 1))}
        assert set(keys) >= lived


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(["Account", "é", "x" * 40]),
    st.lists(
        st.tuples(
            st.one_of(st.integers(-(2**63), 2**64 - 1), st.text(max_size=40)),
            st.one_of(st.none(), st.binary(max_size=40)),
        ),
        max_size=20,
    ),
)
def test_a_sum_of_hashes_of_one_type_is_the_sum_of_its_item_hashes(
    actor_type: str, items: list[tuple[int | str, bytes | None]]
) -> None:
    """A part hashes its changed actors type by type, without building each item's msgpack;
    the sum is the one the item hashes give (every key type, every length of name)."""
    keys, values = [k for k, _ in items], [v for _, v in items]
    expected = sum(item_hash(KeyRef(actor_type, k), v) for k, v in items if v is not None)
    assert hash_sum(actor_type, keys, values) == expected
