"""A transaction that reads a topic the user already has (``external_topic=``), on a real
cluster: a start without the topic is refused once, naming it; with it, every record is applied
once (garbage dead-lettered, naming the topic), and epochal neither trims the topic after its
snapshots nor changes its retention, while it trims its own."""

from __future__ import annotations

import random
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import ConfigResource

from epochal.config import KafkaConfig
from epochal.log.client import KafkaClients
from epochal.schemas.codec import decode
from epochal.schemas.egress import EgressRecord
from tests.conftest import free_ports
from tests.integration.cluster import EPOCHAL, ROOT, Cluster, wait_until
from tests.integration.external_app import KEYS, Add, Total

pytestmark = pytest.mark.integration

APP = "tests.integration.external_app:app"


@pytest.fixture
def cluster(
    kafka_config: KafkaConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Cluster]:
    name = f"ext{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("EPOCHAL_TEST_EXTERNAL_TOPIC", f"payments-{name}")
    running = Cluster(name, tmp_path, KafkaClients(kafka_config), app_spec=APP)
    try:
        yield running
    finally:
        running.close()


def _retention(kafka: KafkaClients, topic: str) -> str:
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    admin = kafka.admin()
    configs = admin.describe_configs([resource])[resource].result(30)
    return str(configs["retention.ms"].value)


def test_an_external_topic_is_read_once_and_left_as_it_was(cluster: Cluster) -> None:
    kafka, external = cluster.kafka, f"payments-{cluster.name}"
    port = free_ports(4)
    started = subprocess.run(
        [EPOCHAL, "run", APP, "--name", cluster.name, "--bootstrap",
         kafka.config.bootstrap_servers, "--warehouse", str(cluster.warehouse),
         "--run-dir", str(cluster.run_dir), "--workers", "1", "--port-base", str(port),
         "--query-port", str(port + 3)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert started.returncode != 0
    said = started.stdout + started.stderr
    assert f"input topic {external} does not exist" in said, said
    assert said.count("does not exist") == 1 and "Traceback" not in said, said

    kafka.create_topics([external], partitions=2, config={"retention.ms": "3600000"})
    kafka.create_topics([f"{cluster.name}.out.totals"])
    rng = random.Random(3)
    adds = [Add(rng.randrange(KEYS), rng.randrange(1, 50)) for _ in range(300)]
    producer = Producer({"bootstrap.servers": kafka.config.bootstrap_servers})
    for i, add in enumerate(adds):
        producer.produce(external, msgspec.msgpack.encode(add), partition=i % 2)
    producer.produce(external, b"\xc1 not an Add", partition=0)
    assert producer.flush(30) == 0

    cluster.start(workers=1, partitions=2, snapshot_ms=200, extra=["--keep-snapshots", "1"])
    totals: dict[int, int] = {}
    for add in adds:
        totals[add.key] = totals.get(add.key, 0) + add.amount

    def applied() -> list[Total]:
        records = [decode(v, EgressRecord) for v in cluster.read("out.totals")]
        return [msgspec.msgpack.decode(r.value, type=Total) for r in records]

    wait_until(lambda: len(applied()) >= len(adds), 60, "not every record was applied",
               log=cluster.log)  # fmt: skip
    out = applied()
    assert len(out) == len(adds)  # once each
    assert {t.key: max(o.total for o in out if o.key == t.key) for t in out} == totals
    letters = cluster.dead_letters()
    assert [(d.topic, d.partition) for d in letters] == [(external, 0)]

    wait_until(lambda: _trimmed_own(cluster), 60,
               "epochal did not trim its own command log", log=cluster.log)  # fmt: skip
    assert [kafka.watermarks(external, p)[0] for p in (0, 1)] == [0, 0]
    assert _retention(kafka, external) == "3600000"
    cluster.stop()


def _trimmed_own(cluster: Cluster) -> bool:
    """The cluster's own command log was trimmed back to a snapshot (so an external topic
    would have been, had epochal trimmed it)."""
    return cluster.kafka.watermarks(f"{cluster.name}.cmd", 0)[0] > 0
