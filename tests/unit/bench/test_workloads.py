"""Every benchmark workload's app, on a 4-partition engine, ends where its plain-Python rules end,
and its backlog has the shape its parameters ask for (skew, multi-partition share)."""

from __future__ import annotations

import random
from collections import Counter

import msgspec
import pytest

from bench.workloads.base import KeyChooser, Workload
from bench.workloads.ycsbt import Row, YcsbT
from epochal.actors.partitioning import KeyRanges
from epochal.schemas.commands import KeyRef
from epochal.testing import AppTest

CASES: list[tuple[Workload, type[msgspec.Struct], str]] = [
    (YcsbT(start=1), Row, "value"),
    (YcsbT(zipf=0.99, multi_partition=0.5, start=1), Row, "value"),
]


@pytest.mark.parametrize(("workload", "actor", "field"), CASES, ids=lambda c: repr(c)[:60])
def test_the_app_ends_where_the_plain_rules_end(
    workload: Workload, actor: type[msgspec.Struct], field: str
) -> None:
    app = workload.load_app()
    backlog = workload.backlog(2_000, partitions=4, seed=7)
    plain = workload.plain()
    outputs = Counter()
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
