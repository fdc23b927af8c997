"""``epochal run`` as real processes on the real broker: dead letters, and exactly-once across
``kill -9`` of a worker and of the sequencer (until snapshots, restart replays from the start)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest
from confluent_kafka import Producer

from epochal.actors.oracle import SerialOracle
from epochal.config import KafkaConfig
from epochal.log.client import KafkaClients
from epochal.log.command_log import KafkaCommandLog
from epochal.schemas.codec import decode
from epochal.schemas.commands import ClientRequest, DeadLetter, Origin
from epochal.schemas.egress import EgressRecord
from tests.conftest import free_port_pair, free_ports
from tests.unit.actors.workload import Deposit, Transfer, app

pytestmark = pytest.mark.integration

EPOCHAL = str(Path(sys.executable).parent / "epochal")
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Cluster:
    name: str
    kafka: KafkaClients
    process: subprocess.Popen[bytes]
    status_file: Path
    metrics_port: int
    produced: int = 0
    transfers: int = 0

    def metrics(self, port: int) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            return str(reply.read().decode())

    def status(self) -> dict[str, object]:
        return dict(json.loads(self.status_file.read_text()))

    def produce(self, values: list[bytes]) -> None:
        producer = Producer({"bootstrap.servers": self.kafka.config.bootstrap_servers})
        for value in values:
            producer.produce(f"{self.name}.in.ops", value)
        assert producer.flush(30) == 0
        self.produced += len(values)

    def read(self, suffix: str, timeout_s: float = 2.0) -> list[bytes]:
        consumer = self.kafka.assigned_consumer(
            f"{self.name}.{suffix}", {0: 0}, **{"isolation.level": "read_committed"}
        )
        values: list[bytes] = []
        while batch := consumer.consume(10_000, timeout_s):
            values += [m.value() or b"" for m in batch]
        consumer.close()
        return values

    def egress(self) -> list[EgressRecord]:
        return [
            decode(v, EgressRecord) for s in ("out.receipts", "out.errors") for v in self.read(s)
        ]


@pytest.fixture(scope="module")
def cluster(
    kafka_config: KafkaConfig, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    name = f"eo{uuid.uuid4().hex[:8]}"
    run_dir = tmp_path_factory.mktemp("run")
    metrics_port = free_ports(3)  # workers on port and port+1, the sequencer on port+2
    command = [
        EPOCHAL, "run", "tests.unit.actors.workload:app", "--name", name,
        "--bootstrap", kafka_config.bootstrap_servers, "--workers", "2", "--partitions", "4",
        "--port-base", str(free_port_pair()), "--run-dir", str(run_dir), "--epoch-ms", "20",
        "--metrics-port", str(metrics_port),
    ]  # fmt: skip
    log = open(run_dir / "run.log", "wb")  # noqa: SIM115 - closed below
    process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    status_file = run_dir / name / "processes.json"
    deadline = time.monotonic() + 60
    while not status_file.exists() or len(json.loads(status_file.read_text())["workers"]) < 2:
        assert process.poll() is None, (run_dir / "run.log").read_text()
        assert time.monotonic() < deadline, "the cluster did not start"
        time.sleep(0.2)
    running = Cluster(name, KafkaClients(kafka_config), process, status_file, metrics_port)
    running.produce([msgspec.msgpack.encode(Deposit(a, 100)) for a in range(40)])
    yield running
    process.send_signal(signal.SIGTERM)
    try:
        assert process.wait(30) == 0
    finally:
        process.kill()
        log.close()


def _transfers(count: int, rng: random.Random) -> list[bytes]:
    values = []
    for i in range(count):
        transfer = Transfer(rng.randrange(40), rng.randrange(40), rng.randrange(1, 80))
        encoder = msgspec.json.encode if i % 10 == 0 else msgspec.msgpack.encode  # JSON too
        values.append(encoder(transfer))
    return values


def _wait_for_egress(cluster: Cluster, count: int, timeout_s: float = 90) -> list[EgressRecord]:
    deadline = time.monotonic() + timeout_s
    while True:
        egress = cluster.egress()
        if len(egress) >= count or time.monotonic() > deadline:
            return egress
        time.sleep(1)


def test_bad_records_go_to_the_dead_letter_topic_and_the_pipeline_goes_on(cluster: Cluster) -> None:
    bad = [
        b"\xc1 not msgpack",
        b'{"type": "Transfer", "source": "one", "target": 2, "amount": 3}',  # wrong schema
        b'{"type": "Refund", "account": 1}',  # unknown event type
    ]
    rng = random.Random(1)
    cluster.produce(_transfers(100, rng)[:50] + bad + _transfers(100, rng)[50:])
    cluster.transfers += 100
    egress = _wait_for_egress(cluster, cluster.transfers)
    assert len(egress) == cluster.transfers  # the valid records around the bad ones ran
    dead = [decode(v, DeadLetter) for v in cluster.read("dlq")]
    assert [d.value for d in dead] == bad
    assert "malformed" in dead[0].reason
    assert "$.source" in dead[1].reason
    assert dead[2].reason.startswith("unknown event type")
    assert all(d.topic == f"{cluster.name}.in.ops" and d.partition == 0 for d in dead)
    assert [d.offset for d in dead] == [40 + 50, 40 + 51, 40 + 52]
    assert f'epochal_dead_letters_total{{app="{cluster.name}",role="sequencer"}} 3' in (
        cluster.metrics(cluster.metrics_port + 2)
    )
    worker = cluster.metrics(cluster.metrics_port)
    assert "epochal_transactions_total" in worker and 'outcome="committed"' in worker


def test_kill_9_of_a_worker_and_the_sequencer_loses_and_doubles_nothing(cluster: Cluster) -> None:
    rng = random.Random(2)
    cluster.produce(_transfers(3000, rng))
    time.sleep(1)
    os.kill(int(cluster.status()["workers"][1]), signal.SIGKILL)  # type: ignore[index]
    cluster.produce(_transfers(3000, rng))
    time.sleep(1)
    os.kill(int(cluster.status()["sequencer"]), signal.SIGKILL)  # type: ignore[arg-type]
    cluster.produce(_transfers(3000, rng))
    cluster.transfers += 9000

    egress = _wait_for_egress(cluster, cluster.transfers)
    assert cluster.status()["generation"] == 3  # a rollback for each process killed

    epochs = [
        e.record for e in KafkaCommandLog(cluster.kafka, f"{cluster.name}.cmd").epochs(to_end=True)
    ]
    sequenced = [t.source.offset for e in epochs for t in e.txns if t.source]
    dead = [decode(v, DeadLetter).offset for v in cluster.read("dlq")]
    assert sorted(sequenced + dead) == list(range(cluster.produced))  # each input exactly once

    timestamps = [(r.epoch, r.seq) for r in egress]
    assert len(timestamps) == len(set(timestamps)) == cluster.transfers  # no duplicate egress
    expected = [
        (o.epoch, o.seq, o.committed, o.reason)
        for result in SerialOracle(app).run(epochs)
        for o in result.outcomes
        if o.handler == "transfer"
    ]
    assert sorted((r.epoch, r.seq, r.committed, r.reason) for r in egress) == sorted(expected)


def test_a_client_transaction_sent_twice_is_sequenced_once(cluster: Cluster) -> None:
    request = ClientRequest("req-42", "transfer", msgspec.msgpack.encode(Transfer(1, 2, 5)))
    not_a_client_handler = ClientRequest("req-43", "deposit", msgspec.msgpack.encode(Deposit(1, 5)))
    producer = Producer({"bootstrap.servers": cluster.kafka.config.bootstrap_servers})
    for value in (request, request, not_a_client_handler):  # the second is a client's retry
        producer.produce(f"{cluster.name}.requests", msgspec.msgpack.encode(value))
    assert producer.flush(30) == 0
    cluster.transfers += 1
    egress = _wait_for_egress(cluster, cluster.transfers)
    assert len(egress) == cluster.transfers

    log = KafkaCommandLog(cluster.kafka, f"{cluster.name}.cmd").epochs(to_end=True)
    client = [t for e in log for t in e.record.txns if t.origin == Origin.CLIENT]
    assert [(t.request_id, t.handler) for t in client] == [("req-42", "transfer")]
    dead = [decode(v, DeadLetter) for v in cluster.read("dlq")]
    assert "no client transaction" in dead[-1].reason and dead[-1].topic.endswith(".requests")
