"""Every benchmark workload's app, on a 4-partition engine, ends where its plain-Python rules end,
and its backlog has the shape its parameters ask for (skew, multi-partition share)."""

from __future__ import annotations

import random
from collections import Counter

import msgspec
import pytest

from bench.workloads import tspoon
from bench.workloads.base import KeyChooser, Workload
from bench.workloads.ycsbt import Row, YcsbT
from epochal.actors.partitioning import KeyRanges
from epochal.schemas.commands import KeyRef
from epochal.testing import AppTest

CASES: list[tuple[Workload, type[msgspec.Struct], str]] = [
    (YcsbT(start=1), Row, "value"),
    (YcsbT(zipf=0.99, multi_partition=0.5, start=1), Row, "value"),
    (tspoon.TSpoonBank(accounts=50), tspoon.Account, "balance"),  # few: overdrafts abort
    (tspoon.TSpoonBank(), tspoon.Account, "balance"),
]


@pytest.mark.parametrize(("workload", "actor", "field"), CASES, ids=lambda c: repr(c)[:60])
def test_the_app_ends_where_the_plain_rules_end(
    workload: Workload, actor: type[msgspec.Struct], field: str
) -> None:
    app = workload.load_app()
    backlog = workload.backlog(2_000, partitions=4, seed=7)
    plain = workload.plain()
    outputs: Counter[str] = Counter()
    for record in backlog.records:
        out = plain(record.topic, record.value)
        if out is not None:
            outputs[out[0]] += 1
    assert sum(outputs.values()) == backlog.measured
    test = AppTest(app, partitions=4)
    for record in backlog.records:
        test.send(record.topic, record.value, key=record.key)
    results = test.run()
    assert {k: getattr(v, field) for k, v in test.state(actor).items()} == plain.state
    egressed = Counter(name for name in workload.outputs for _ in results.egress_records(name))
    assert egressed == outputs
    test.check_determinism(partitions=(3,))


def test_ycsbt_keys_are_skewed_and_split_over_partitions_as_asked() -> None:
    backlog = YcsbT(zipf=0.99, multi_partition=0.25).backlog(4_000, partitions=4, seed=1)
    app = YcsbT.load_app(YcsbT())
    ranges = KeyRanges.even(app, 4)
    decode = msgspec.msgpack.Decoder()
    pairs = [decode.decode(r.value) for r in backlog.records[-4_000:]]
    spread = [
        ranges.partition_of(KeyRef("Row", p["a"])) != ranges.partition_of(KeyRef("Row", p["b"]))
        for p in pairs
    ]
    assert 0.2 < sum(spread) / len(spread) < 0.3
    hits = Counter(k for p in pairs for k in (p["a"], p["b"]))
    assert hits.most_common(1)[0][1] > 100 * 8_000 / 10_000  # the hottest key, far above uniform


def test_uniform_keys_cover_every_partition_evenly() -> None:
    app = YcsbT().load_app()
    choose = KeyChooser(app, "Row", range(10_000), 4, theta=0.0, rng=random.Random(3))
    ranges = KeyRanges.even(app, 4)
    counts = Counter(ranges.partition_of(KeyRef("Row", choose.one())) for _ in range(8_000))
    assert all(1_700 < n < 2_300 for n in counts.values())


@pytest.mark.parametrize("partitions", range(2, 9))
def test_a_multi_partition_set_spans_two_partitions_up_to_its_bound(partitions: int) -> None:
    """For many seeds, each bound from 2 to one past the layout (no bound left) and 2 to 20
    keys: a multi-partition set lies on 2 to ``span`` partitions, and 20 keys reach the bound;
    a single-partition set lies on one. The same seed draws the same sets."""
    app = YcsbT().load_app()
    ranges = KeyRanges.even(app, partitions)
    keys = range(0, 10_000, 5)  # spread over the layout, fewer to place

    def spanned(chosen: list[int]) -> int:
        return len({ranges.partition_of(KeyRef("Row", k)) for k in chosen})

    def draws(seed: int) -> list[list[int]]:
        theta = 0.6 if seed % 2 else 0.0
        choose = KeyChooser(app, "Row", keys, partitions, theta=theta, rng=random.Random(seed))
        return [
            choose.distinct(count, multi, span)
            for span in range(2, partitions + 2)
            for count in (2, 4, 20)
            for multi in (True, False)
        ]

    reached: Counter[int] = Counter()
    for seed in range(25):
        sets = draws(seed)
        assert sets == draws(seed)
        shapes = [
            (span, count, multi)
            for span in range(2, partitions + 2)
            for count in (2, 4, 20)
            for multi in (True, False)
        ]
        for (span, count, multi), chosen in zip(shapes, sets, strict=True):
            assert len(set(chosen)) == count
            if not multi:
                assert spanned(chosen) == 1, chosen
                continue
            assert 2 <= spanned(chosen) <= min(span, count), (span, chosen)
            if count == 20:
                reached[span] = max(reached[span], spanned(chosen))
    assert reached == {span: min(span, partitions) for span in range(2, partitions + 2)}


def test_a_bound_below_two_partitions_is_refused() -> None:
    keys = range(0, 10_000, 100)  # 25 on each of 4 partitions
    choose = KeyChooser(YcsbT().load_app(), "Row", keys, 4, theta=0.0, rng=random.Random(1))
    with pytest.raises(ValueError, match="two partitions or more"):
        choose.distinct(4, True, 1)
    with pytest.raises(ValueError, match="30 distinct keys on 1 partition"):
        choose.distinct(30, False)
    with pytest.raises(ValueError, match="60 distinct keys on 2 partition"):
        choose.distinct(60, True, 2)


def test_tspoon_accounts_spread_over_every_partition_and_most_transfers_cross() -> None:
    app = tspoon.app
    ranges = KeyRanges.even(app, 4)
    backlog = tspoon.TSpoonBank(accounts=1_000).backlog(4_000, partitions=4, seed=3)
    transfers = [msgspec.msgpack.decode(r.value, type=tspoon.Transfer) for r in backlog.records]
    assert backlog.measured == len(transfers) == 4_000  # no load records: accounts open full
    homes = Counter(ranges.partition_of(KeyRef("Account", t.source)) for t in transfers)
    assert sorted(homes) == [0, 1, 2, 3] and min(homes.values()) > 800
    crossing = sum(
        ranges.partition_of(KeyRef("Account", t.source))
        != ranges.partition_of(KeyRef("Account", t.target))
        for t in transfers
    )
    assert 0.7 < crossing / len(transfers) < 0.8  # two uniform accounts: 3/4 on two partitions
    assert all(t.source != t.target for t in transfers)


@pytest.mark.parametrize("accounts", [1, 100_001])
def test_tspoon_accounts_outside_the_key_space_are_refused(accounts: int) -> None:
    with pytest.raises(ValueError, match="accounts: 2 to 100,000"):
        tspoon.TSpoonBank(accounts=accounts)
