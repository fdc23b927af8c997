"""What ``epochal run`` says: one ``ready`` line per generation naming where to query and scrape,
and, with ``--log-format json``, every line of every process one JSON object."""

from __future__ import annotations

import json
import os
import re
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from epochal.config import KafkaConfig
from epochal.log.client import KafkaClients
from tests.conftest import free_ports
from tests.integration.cluster import Cluster, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(kafka_config: KafkaConfig, tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(f"logs{uuid.uuid4().hex[:8]}", tmp_path, KafkaClients(kafka_config))
    try:
        yield running
    finally:
        running.close()


def test_json_logs_are_one_object_a_line_from_every_process(cluster: Cluster) -> None:
    metrics = free_ports(4)
    cluster.start(workers=2, partitions=2, metrics_port=metrics, extra=["--log-format", "json"])
    wait_until(lambda: '"message": "ready ' in cluster.log(), 60, "no ready line", log=cluster.log)
    cluster.produce(20, deposits=True)
    cluster.wait_for_egress()
    cluster.stop()
    lines = [json.loads(line) for line in cluster.log().splitlines() if line.strip()]
    assert all({"time", "level", "logger", "message", "pid", "process"} <= set(e) for e in lines)
    titles = {re.sub(r" of .*", "", e["process"]) for e in lines}
    assert {"epochal: supervisor", "epochal: sequencer", "epochal: worker 0"} <= titles, titles
    (ready,) = [e["message"] for e in lines if e["message"].startswith("ready ")]
    assert f"generation=1 workers=2 queries=127.0.0.1:{cluster.query_base}," in ready, ready
    assert f"metrics=127.0.0.1:{metrics},127.0.0.1:{metrics + 1}" in ready, ready


def test_the_ready_line_comes_once_per_generation(cluster: Cluster) -> None:
    cluster.start(workers=2, partitions=2)
    wait_until(lambda: "ready app=" in cluster.log(), 60, "no ready line", log=cluster.log)
    assert cluster.log().count("ready app=") == 1
    assert re.search(r"INFO epochal\.supervisor ready app=\S+ generation=1 ", cluster.log())
    os.kill(cluster.status()["workers"][1], signal.SIGKILL)
    wait_until(lambda: "generation=2 workers=2" in cluster.log(), 60, "not ready again",
               log=cluster.log)  # fmt: skip
    assert cluster.log().count("ready app=") == 2
    assert "metrics=off" in cluster.log()
