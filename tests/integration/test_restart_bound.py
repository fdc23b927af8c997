"""Restart cost does not grow with the log: a restarted worker replays the command log only
after the latest snapshot, whatever the log's length.

A 2-worker cluster with snapshots every 200 ms runs a short log, stops, restarts; then 30 times
as many transfers, in about as many more epochs, stops, restarts. What each restart replayed is
read from every worker's ``recovered`` line and its ``epochal_recovery_replayed_records`` gauge
(they must agree), and must stay within two snapshot intervals' worth of records both times,
while replaying the whole log would be far more. No timing is asserted (timing lives in
``bench/restart.py``); the counts are what a broken resume position (replay from the start)
changes.
"""

from __future__ import annotations

import re
import time

import msgspec
import pytest
from confluent_kafka import Producer

from tests.conftest import free_ports
from tests.integration.cluster import Cluster, wait_until
from tests.unit.actors.workload import Transfer

pytestmark = pytest.mark.integration

SNAPSHOT_MS = 200
BOUND = 40
"""Command-log records one restart may replay: two snapshot intervals' worth (an interval holds
at most 10 epochs of 20 ms, each a record and its transaction marker). The input is idle for a
while before each stop, so the sequencer's last snapshot covers the whole log and a correct
restart replays next to nothing."""

_RECOVERED = re.compile(r"recovered worker=(\d+) from_ssid=(-?\d+) from_position=\d+ "
                        r"replayed_records=(\d+)")  # fmt: skip


def _trickle(cluster: Cluster, bursts: int, per_burst: int = 10) -> None:
    """Transfers in small bursts ~30 ms apart: about an epoch each, so the command log grows
    by records, not only by bigger epochs."""
    producer = Producer({"bootstrap.servers": cluster.kafka.config.bootstrap_servers})
    for _ in range(bursts):
        for _ in range(per_burst):
            transfer = Transfer(cluster.rng.randrange(40), cluster.rng.randrange(40),
                                cluster.rng.randrange(1, 80))  # fmt: skip
            producer.produce(f"{cluster.name}.in.ops", msgspec.msgpack.encode(transfer))
        producer.flush(10)
        time.sleep(0.03)
    assert producer.flush(30) == 0
    cluster.produced += bursts * per_burst
    cluster.transfers += bursts * per_burst


def _restart(cluster: Cluster, metrics_port: int) -> dict[int, tuple[int, int]]:
    """Stop, start again, wait until both workers caught up: {worker: (from ssid, replayed)},
    after checking that each gauge says the same as the line."""
    cluster.stop()
    cluster.start(workers=2, partitions=4, metrics_port=metrics_port, snapshot_ms=SNAPSHOT_MS)
    log = cluster.run_dir / f"run-{len(cluster.processes) - 1}.log"

    def recovered() -> dict[int, tuple[int, int]]:
        return {int(w): (int(s), int(n)) for w, s, n in _RECOVERED.findall(log.read_text())}

    wait_until(lambda: len(recovered()) == 2, 60, "the workers did not recover", log=cluster.log)
    lines = recovered()
    for worker, (_, replayed) in lines.items():
        metrics = cluster.metrics(metrics_port + worker)
        gauge = re.search(r"^epochal_recovery_replayed_records\{[^}]*\} (\S+)$", metrics, re.M)
        assert gauge is not None and float(gauge.group(1)) == replayed, metrics
    return lines


def _log_end(cluster: Cluster) -> int:
    return cluster.kafka.watermarks(f"{cluster.name}.cmd")[1]


def test_records_replayed_at_a_restart_do_not_grow_with_the_log(cluster: Cluster) -> None:
    metrics_port = free_ports(4)  # workers, sequencer, supervisor
    cluster.start(workers=2, partitions=4, metrics_port=metrics_port, snapshot_ms=SNAPSHOT_MS)
    cluster.produce(0, deposits=True)
    _trickle(cluster, bursts=10)
    cluster.wait_for_egress()
    time.sleep(1.5)  # input idle: the sequencer marks a last snapshot, committed meanwhile
    short_log = _log_end(cluster)
    after_short = _restart(cluster, metrics_port)

    _trickle(cluster, bursts=300)
    cluster.wait_for_egress()
    time.sleep(1.5)
    long_log = _log_end(cluster)
    after_long = _restart(cluster, metrics_port)

    for lines in (after_short, after_long):
        assert all(ssid >= 0 for ssid, _ in lines.values()), lines  # resumed from a snapshot
        assert all(replayed <= BOUND for _, replayed in lines.values()), (lines, long_log)
    assert min(s for s, _ in after_long.values()) > max(s for s, _ in after_short.values())
    # the log did grow: replaying all of it (or in proportion to it) would break the bound
    assert long_log - short_log >= 4 * BOUND, (short_log, long_log)
    _trickle(cluster, bursts=5)
    cluster.check_against_the_oracle()  # and what was restored then replayed is right
    cluster.stop()
