"""A user's app with str keys and no ``key_sample`` on 2 workers: it starts with every key on
one worker, and the cluster learns split points from its first snapshot, rebalances in a planned
rollback, and ends with both workers doing comparable work, every input applied once and every
egress record written once, as the serial oracle says."""

from __future__ import annotations

import dataclasses
import random
import re

import msgspec
import pytest

from epochal.actors.oracle import SerialOracle
from epochal.actors.partitioning import KeyRanges
from epochal.client import Client
from epochal.log.egress import read_egress_state
from epochal.schemas.canonical import decode_canonical
from epochal.schemas.codec import decode
from epochal.schemas.egress import EgressRecord
from tests.conftest import free_ports
from tests.integration.cluster import Cluster, wait_until
from tests.integration.shop import Buy, Order, Restock, Stock, app

pytestmark = pytest.mark.integration

SKUS = [f"sku-{i:04d}" for i in range(40)]


def _buys(rng: random.Random, count: int) -> list[bytes]:
    return [
        msgspec.msgpack.encode(Buy(f"o-{n}", rng.choice(SKUS), rng.randrange(1, 4)))
        for n in rng.sample(range(100_000), count)
    ]


def _worker_transactions(metrics: str) -> float:
    """The transactions a worker's partitions took part in (each once per worker)."""
    found = re.findall(r"^epochal_partition_transactions_total\{[^}]*\} (\S+)$", metrics, re.M)
    return sum(float(v) for v in found)


def _rebalanced(cluster: Cluster, rng: random.Random, *extra: str) -> int:
    """Start the shop app on 2 workers with its first 440 inputs waiting; wait for the
    rebalance its first snapshot brings. Returns the workers' metrics port base."""
    cluster.app_spec = "tests.integration.shop:app"
    metrics = free_ports(3)
    first = [msgspec.msgpack.encode(Restock(sku, 1000)) for sku in SKUS] + _buys(rng, 400)
    cluster.kafka.create_topics([f"{cluster.name}.in.orders"])  # in before the start: the
    cluster.produce_values(first, topic="in.orders")  # first snapshot holds all of it
    cluster.start(workers=2, partitions=4, metrics_port=metrics, snapshot_ms=1500,
                  extra=["--rebalance-check-ms", "500", *extra])  # fmt: skip

    wait_until(lambda: cluster.generation() == 2, 40, "no rebalance", log=cluster.log)
    logged = " ".join(cluster.log().split())  # the supervisor's lines wrap
    assert "key layout when=rebalance" in logged and "source=learned" in logged, logged
    assert "partition_actors_before=[0, 0, 400, 40]" in logged, logged  # all on worker 1
    layout = read_egress_state(cluster.kafka, cluster.name, committed=False).layout
    assert layout is not None and layout.points is not None
    assert layout.points != KeyRanges.even(app, 4).recorded()  # learned, not the default
    wait_until(lambda: _total(cluster) >= 0, 30, "the new generation serves no metrics")
    return metrics


def _second_round(cluster: Cluster, rng: random.Random, metrics: int) -> list[EgressRecord]:
    """400 more buys; both workers do comparable work on them; every buy's egress is out."""
    before = [_worker_transactions(cluster.metrics(metrics + w)) for w in (0, 1)]
    cluster.produce_values(_buys(rng, 400), topic="in.orders")
    egress = _wait_for_egress(cluster, 800)
    after = [_worker_transactions(cluster.metrics(metrics + w)) for w in (0, 1)]
    work = [a - b for a, b in zip(after, before, strict=True)]
    assert all(0.25 <= w / sum(work) <= 0.75 for w in work), work
    return egress


def test_unsampled_str_keys_end_spread_over_both_workers(cluster: Cluster) -> None:
    rng = random.Random(11)
    metrics = _rebalanced(cluster, rng)
    egress = _second_round(cluster, rng, metrics)
    sold, orders = _check_against_the_oracle(cluster, egress, produced=840)
    _check_range_scans(cluster, sold, orders)
    assert cluster.generation() == 2  # no second rebalance: the learned layout is even
    cluster.stop()


def test_a_weak_mode_cluster_rebalances_too_and_applies_every_input_once(
    cluster: Cluster,
) -> None:
    """Weak mode has no command log: the rebalance restarts the sequencer, which re-sequences
    from the snapshot, and egress the snapshot held is released by the old layout's writers."""
    rng = random.Random(12)
    metrics = _rebalanced(cluster, rng, "--recovery", "weak")
    egress = _second_round(cluster, rng, metrics)
    offsets = sorted(r.source.offset for r in egress if r.source is not None)
    assert offsets == list(range(40, 840))  # every buy once, none lost, none twice
    assert len({(r.epoch, r.seq) for r in egress}) == len(egress)
    assert cluster.generation() == 2
    cluster.stop()


def _total(cluster: Cluster) -> float:
    try:
        return sum(_worker_transactions(cluster.metrics(cluster.metrics_port + w)) for w in (0, 1))
    except OSError:
        return -1.0


def _egress(cluster: Cluster) -> list[EgressRecord]:
    return [decode(v, EgressRecord) for s in ("out.receipts", "out.errors") for v in
            cluster.read(s)]  # fmt: skip


def _wait_for_egress(cluster: Cluster, count: int) -> list[EgressRecord]:
    wait_until(lambda: len(_egress(cluster)) >= count, 40, "egress missing", log=cluster.log)
    return _egress(cluster)


def _check_range_scans(cluster: Cluster, sold: dict[str, int], orders: int) -> None:
    """Range scans cross the learned split points (sku-0010, -0020, -0030) in key order."""
    named = dataclasses.replace(app, name=cluster.name)
    with Client(named, f"127.0.0.1:{cluster.query_base}", timeout_s=30) as client:
        rows = client.scan(Stock, "sku-0005", "sku-0035")
        assert [k for k, _ in rows] == SKUS[5:35]
        assert {k: v.sold for k, v in rows} == {k: sold[k] for k in SKUS[5:35]}
        assert len(client.scan(Order)) == orders


def _check_against_the_oracle(
    cluster: Cluster, egress: list[EgressRecord], produced: int
) -> tuple[dict[str, int], int]:
    """Each input sequenced once; each buy's egress once, with the oracle's outcome; every
    snapshot's state the oracle's at its epoch. Returns the units sold of each sku and the
    count of orders, in the oracle's final state."""
    epochs = cluster.epochs()
    offsets = sorted(t.source.offset for e in epochs for t in e.txns if t.source)
    assert offsets == list(range(produced))
    oracle = SerialOracle(app)
    results = oracle.run(epochs)
    expected = sorted(
        (o.epoch, o.seq, o.committed, o.reason)
        for r in results
        for o in r.outcomes
        if o.handler == "buy"
    )
    assert sorted((r.epoch, r.seq, r.committed, r.reason) for r in egress) == expected
    digests = {r.epoch: r.digest for r in results}
    manifests = cluster.snapshots_of(app).manifests()
    assert manifests and all(m.digest == digests[m.epoch] for m in manifests)
    stock = {
        r.key: decode_canonical(v, Stock)
        for r, v in oracle.state.items()
        if r.actor_type == "Stock"
    }
    orders = sum(1 for ref in oracle.state if ref.actor_type == "Order")
    return {str(key): s.sold for key, s in stock.items()}, orders
