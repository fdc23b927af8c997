"""TStream's four workloads: each app, on a 4-partition engine, ends where its plain rules end,
writes the egress they write, and replays alike on 1 and 3 partitions; the backlogs have the
mixes their parameters ask for."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from bench.workloads.base import Workload
from bench.workloads.tstream import (
    Account,
    Asset,
    GrepSum,
    Item,
    OnlineBidding,
    Row,
    Segment,
    StreamingLedger,
    TollProcessing,
    gs_app,
)
from epochal.actors.partitioning import KeyRanges
from epochal.schemas.commands import KeyRef
from epochal.testing import AppTest

TRANSACTIONS = 1_500

State = Callable[[AppTest], dict[Any, Any]]


def gs_state(test: AppTest) -> dict[Any, Any]:
    return {k: (v.text, v.number) for k, v in test.state(Row).items()}


def sl_state(test: AppTest) -> dict[Any, Any]:
    accounts = {("Account", k): v.balance for k, v in test.state(Account).items()}
    return accounts | {("Asset", k): v.balance for k, v in test.state(Asset).items()}


def ob_state(test: AppTest) -> dict[Any, Any]:
    return {k: (v.price, v.quantity) for k, v in test.state(Item).items()}


def tp_state(test: AppTest) -> dict[Any, Any]:
    return {k: (v.cars, v.speeds) for k, v in test.state(Segment).items()}


# (workload, its app state as the plain rules keep it, aborts: True some, False none, None either)
CASES = [
    pytest.param(GrepSum(), gs_state, False, id="gs"),
    pytest.param(GrepSum(read_ratio=0.2, zipf=0.99, multi_partition=1.0), gs_state, False,
                 id="gs-skewed-multi"),
    pytest.param(StreamingLedger(), sl_state, None, id="sl"),
    # balances of 3 and amounts up to 10: many aborts, and sources left at exactly 0
    pytest.param(StreamingLedger(start=3, zipf=0.99, multi_partition=1.0), sl_state, True,
                 id="sl-skewed-multi"),
    pytest.param(OnlineBidding(), ob_state, True, id="ob"),
    pytest.param(OnlineBidding(start=5, zipf=0.99, multi_partition=1.0), ob_state, True,
                 id="ob-skewed-multi"),
    pytest.param(TollProcessing(), tp_state, False, id="tp"),
    pytest.param(TollProcessing(cars=200, zipf=0.99), tp_state, False, id="tp-skewed"),
]  # fmt: skip


@pytest.mark.parametrize(("workload", "app_state", "aborts"), CASES)
def test_the_app_ends_where_the_plain_rules_end(
    workload: Workload, app_state: State, aborts: bool | None
) -> None:
    backlog = workload.backlog(TRANSACTIONS, partitions=4, seed=7)
    plain = workload.plain()
    outputs: Counter[str] = Counter()
    results = []
    for record in backlog.records:
        out = plain(record.topic, record.value)
        if out is not None:
            outputs[out[0]] += 1
            if out[0] == "results":
                results.append(msgspec.msgpack.decode(out[1]))
    assert sum(outputs.values()) == backlog.measured
    if aborts is not None:
        assert (outputs["errors"] > 0) == aborts

    test = AppTest(workload.load_app(), partitions=4)
    for record in backlog.records:
        test.send(record.topic, record.value, key=record.key)
    run = test.run()
    assert app_state(test) == plain.state
    egressed = Counter({name: len(run.egress_records(name)) for name in workload.outputs})
    assert +egressed == outputs
    assert run.egress("results") == results  # what reads saw, and the tolls, in order
    test.check_determinism(partitions=(3,))


def test_online_bidding_mixes_bids_alters_and_tops_6_1_1() -> None:
    backlog = OnlineBidding().backlog(8_000, partitions=4, seed=1)
    decode = msgspec.msgpack.Decoder().decode
    kinds = Counter(decode(r.value)["type"] for r in backlog.records[-backlog.measured :])
    assert kinds.keys() == {"Bid", "Alter", "Top"}
    assert abs(kinds["Bid"] / 8_000 - 6 / 8) < 0.02
    assert abs(kinds["Alter"] / 8_000 - 1 / 8) < 0.015
    assert abs(kinds["Top"] / 8_000 - 1 / 8) < 0.015


@pytest.mark.parametrize("read_ratio", [0.5, 0.8])
def test_grep_sum_reads_its_share_and_spreads_its_multi_partition_share(read_ratio: float) -> None:
    backlog = GrepSum(read_ratio=read_ratio).backlog(4_000, partitions=4, seed=2)
    decode = msgspec.msgpack.Decoder().decode
    events = [decode(r.value) for r in backlog.records[-backlog.measured :]]
    reads = sum(e["type"] == "ReadRows" for e in events)
    assert abs(reads / 4_000 - read_ratio) < 0.03
    ranges = KeyRanges.even(gs_app, 4)
    spans = [len({ranges.partition_of(KeyRef("Row", k)) for k in e["keys"]}) for e in events]
    assert all(len(e["keys"]) == 10 for e in events)
    assert abs(sum(s > 1 for s in spans) / 4_000 - 0.25) < 0.03


def _keys(event: dict[str, Any]) -> list[int]:
    """A decoded GS, SL or OB transaction's keys (SL's account ``i`` and asset ``i`` share a
    partition, OB's bids have one key)."""
    for field in ("keys", "items"):
        if field in event:
            return list(event[field])
    return [v for k, v in event.items() if k.endswith(("account", "asset", "item"))]


@pytest.mark.parametrize("length", [2, 3, 8])
@pytest.mark.parametrize(
    ("kind", "actor"), [(GrepSum, "Row"), (StreamingLedger, "Account"), (OnlineBidding, "Item")]
)
def test_a_multi_partition_transaction_spans_two_partitions_up_to_the_length(
    kind: type[GrepSum | StreamingLedger | OnlineBidding], actor: str, length: int
) -> None:
    """On 8 partitions, half multi-partition: those span 2 to ``--multi-partition-length``
    partitions (GS's 10 keys and OB's 20 reach it), the others one."""
    workload = kind(multi_partition=0.5, multi_partition_length=length)
    backlog = workload.backlog(1_000, partitions=8, seed=3)
    assert backlog == workload.backlog(1_000, partitions=8, seed=3)
    ranges = KeyRanges.even(workload.load_app(), 8)
    decode = msgspec.msgpack.Decoder().decode
    spans = Counter(
        len({ranges.partition_of(KeyRef(actor, k)) for k in keys})
        for r in backlog.records[-backlog.measured :]
        if len(keys := _keys(decode(r.value))) > 1
    )
    assert set(spans) <= {1, *range(2, length + 1)}, spans
    assert 0.4 < sum(n for span, n in spans.items() if span > 1) / spans.total() < 0.6
    if kind is not StreamingLedger:
        assert max(spans) == length


@pytest.mark.parametrize("kind", [GrepSum, StreamingLedger, OnlineBidding])
def test_a_multi_partition_length_below_two_is_refused(
    kind: type[GrepSum | StreamingLedger | OnlineBidding],
) -> None:
    with pytest.raises(ValueError, match=r"multi_partition_length: .* 2 or more, not 1"):
        kind(multi_partition_length=1)


def test_the_cli_says_a_multi_partition_length_below_two_is_out_of_range(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bench import cli

    with pytest.raises(SystemExit) as exited:
        cli.main(["tstream-ob", "--multi-partition-length", "1"])
    assert exited.value.code == 2
    assert "error: multi_partition_length: " in capsys.readouterr().err


def test_toll_processing_charges_congested_segments() -> None:
    workload = TollProcessing(cars=200, zipf=0.99)
    plain = workload.plain()
    tolls = []
    for record in workload.backlog(TRANSACTIONS, partitions=4, seed=7).records:
        out = plain(record.topic, record.value)
        if out is not None:
            tolls.append(msgspec.msgpack.decode(out[1])["toll"])
    assert 0 < sum(t > 0 for t in tolls) < len(tolls)
