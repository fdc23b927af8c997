"""The Kafka broker goes away mid-stream and comes back on the same data (a crash and restart,
a network cut): the cluster waits, says so once each way, and resumes with each input applied
once and each egress record written once; the supervisor is the same process throughout.

The broker is this module's own, since the tests kill it.
"""

from __future__ import annotations

import os
import re
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from epochal.config import CacheConfig, KafkaConfig, LocalBrokerConfig
from epochal.jvm import JarSet
from epochal.log.client import KafkaClients
from epochal.log.local_broker import LocalBroker
from tests.conftest import free_port_pair, free_ports
from tests.integration.cluster import Cluster, wait_until
from tests.integration.test_weak_recovery import WEAK, _check_history

pytestmark = pytest.mark.integration

# twice the suite's bound: a busy machine (a suite beside a restarting broker) must not make
# a member look failed by its silence alone; the outage is what these tests are about
OUTAGE_BOUND_MS = 3000
AWAY_S = OUTAGE_BOUND_MS / 1000 + 2.0  # longer than the failure bound


@pytest.fixture(scope="module")
def broker(cache: CacheConfig, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    jars = cache.jar_dir(JarSet.KAFKA_BROKER.value)
    data_dir = tmp_path_factory.mktemp("outage-kafka")
    own = LocalBroker(LocalBrokerConfig(free_port_pair(), data_dir, jar_dir=jars, heap_mb=512))
    own.start()
    yield own
    own.stop()


@pytest.fixture
def cluster(broker: LocalBroker, tmp_path: Path) -> Iterator[Cluster]:
    clients = KafkaClients(KafkaConfig(broker.config.bootstrap))
    running = Cluster(f"o{uuid.uuid4().hex[:8]}", tmp_path, clients)
    try:
        yield running
    finally:
        running.close()


def _broker_available(cluster: Cluster, port: int) -> float:
    gauge = re.search(r"^epochal_broker_available\{.*\} (\S+)$", cluster.metrics(port), re.M)
    assert gauge is not None
    return float(gauge[1])


def _check_waited_once(cluster: Cluster, supervisor: int) -> None:
    """The same supervisor said once that the broker went and once that it was back, and rolled
    nothing back in between."""
    log = cluster.log()
    assert cluster.status()["supervisor"] == supervisor
    assert log.count("Kafka broker unreachable") == 1, log
    assert log.count("Kafka broker reachable again") == 1, log
    away = log[log.index("Kafka broker unreachable") : log.index("Kafka broker reachable again")]
    assert "rolling back" not in away, "a rollback while the broker was away"


def test_kill_9_of_the_broker_mid_stream(broker: LocalBroker, cluster: Cluster) -> None:
    """Down for longer than the failure bound, then started on the same data and port: one
    rollback once it is back, the gauge 0 meanwhile, librdkafka's lines folded."""
    metrics = free_ports(4)
    cluster.start(workers=2, metrics_port=metrics, failure_timeout_ms=OUTAGE_BOUND_MS)
    supervisor = cluster.status()["supervisor"]
    cluster.produce(1000, deposits=True)
    wait_until(lambda: len(cluster.egress()) > 0, 30, "no egress", log=cluster.log)
    broker.kill()
    killed = time.monotonic()
    wait_until(lambda: _broker_available(cluster, metrics + 3) == 0, 10, "no outage seen")
    time.sleep(max(0.0, AWAY_S - (time.monotonic() - killed)))
    broker.start()
    cluster.produce(300)
    cluster.check_against_the_oracle()
    assert _broker_available(cluster, metrics + 3) == 1
    _check_waited_once(cluster, supervisor)
    back = cluster.log().split("Kafka broker reachable again")[1]
    assert back.count("rolling back") == 1, "one rollback of every process, once it was back"
    # a line or so per client, not one per connection attempt (1,587 lines before they folded)
    assert cluster.log().count("epochal.librdkafka") < 100
    cluster.stop()


def test_a_broker_stopped_for_a_snapshot_interval_in_weak_mode(
    broker: LocalBroker, cluster: Cluster
) -> None:
    """SIGSTOP: connections hang and requests time out (the case that made librdkafka abort)."""
    cluster.start(workers=2, snapshot_ms=1000, extra=WEAK, failure_timeout_ms=OUTAGE_BOUND_MS)
    supervisor = cluster.status()["supervisor"]
    cluster.produce(600, deposits=True)
    wait_until(lambda: len(cluster.egress()) > 0, 30, "no egress", log=cluster.log)
    pid = broker.status().pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(max(AWAY_S, 1.0 + 1.0))  # longer than the bound and a snapshot interval
    finally:
        os.kill(pid, signal.SIGCONT)
    cluster.produce(300)
    _check_history(cluster)
    _check_waited_once(cluster, supervisor)
    cluster.stop()
