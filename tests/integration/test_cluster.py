"""``epochal run`` as real processes on the real broker, one cluster for the module: dead
letters, exactly-once across ``kill -9`` of a worker and of the sequencer, client requests sent
twice, interior transactions on an idle input, and the metrics the Grafana dashboard shows."""

from __future__ import annotations

import json
import os
import re
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from epochal.actors.layout import default_workers
from epochal.actors.oracle import SerialOracle
from epochal.actors.plan import PLAN_SLICE
from epochal.config import KafkaConfig
from epochal.log.client import KafkaClients
from epochal.schemas.commands import ClientRequest, Origin
from tests.conftest import free_ports
from tests.integration.cluster import Cluster, wait_until
from tests.unit.actors.workload import Deposit, Transfer, app

pytestmark = pytest.mark.integration

DASHBOARD = Path(__file__).resolve().parents[2] / "docker" / "grafana" / "epochal-dashboard.json"


@pytest.fixture(scope="module")
def shared(
    kafka_config: KafkaConfig, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    running = Cluster(
        f"eo{uuid.uuid4().hex[:8]}", tmp_path_factory.mktemp("run"), KafkaClients(kafka_config)
    )
    try:  # metrics: workers on port and port+1, the sequencer on port+2, the supervisor +3
        running.start(workers=2, partitions=4, metrics_port=free_ports(4))
        running.produce(0, deposits=True)
        yield running
        running.stop()
    finally:
        running.close()


def test_every_metric_the_grafana_dashboard_shows_is_exported(shared: Cluster) -> None:
    """docker/'s dashboard queries only metrics a running cluster serves (workers, sequencer,
    supervisor), before any of them has counted anything."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    wanted = {
        name
        for panel in panels
        for target in panel["targets"]
        for name in re.findall(r"\b((?:epochal|process)_[a-z_]+)\b", target["expr"])
    }
    exported: set[str] = set()
    for port in range(shared.metrics_port, shared.metrics_port + 4):
        served: list[str] = []
        wait_until(lambda at=port, into=served: _scraped(shared, at, into), 30,
                   f"no metrics on port {port}")  # fmt: skip
        for family in text_string_to_metric_families(served[0]):
            # a counter not counted yet is its family alone (the parser drops its _total)
            total = [f"{family.name}_total"] if family.type == "counter" else []
            exported |= {family.name, *total, *(sample.name for sample in family.samples)}
    assert len(wanted) >= 10 and wanted <= exported, sorted(wanted - exported)


def _scraped(cluster: Cluster, port: int, into: list[str]) -> bool:
    """Whether ``port`` answered ``/metrics`` (a process serves them once it has started)."""
    try:
        into.append(cluster.metrics(port))
    except OSError:
        return False
    return True


def test_bad_records_go_to_the_dead_letter_topic_and_the_pipeline_goes_on(shared: Cluster) -> None:
    bad = [
        b"\xc1 not msgpack",
        b'{"type": "Transfer", "source": "one", "target": 2, "amount": 3}',  # wrong schema
        b'{"type": "Refund", "account": 1}',  # unknown event type
    ]
    start = shared.produced
    shared.produce(50, json_every=10)
    shared.produce_values(bad)
    shared.produce(50, json_every=10)
    egress = shared.check_against_the_oracle()  # the valid records around the bad ones ran
    assert len(egress) == shared.transfers
    dead = shared.dead_letters()
    assert [d.value for d in dead] == bad
    assert "malformed" in dead[0].reason
    assert "$.source" in dead[1].reason
    assert dead[2].reason.startswith("unknown event type")
    assert all(d.topic == f"{shared.name}.in.ops" and d.partition == 0 for d in dead)
    assert [d.offset for d in dead] == [start + 50, start + 51, start + 52]
    assert f'epochal_dead_letters_total{{app="{shared.name}",role="sequencer"}} 3.0' in (
        shared.metrics(shared.metrics_port + 2)
    )
    worker = shared.metrics(shared.metrics_port)
    assert "epochal_transactions_total" in worker and 'outcome="committed"' in worker
    committed = re.compile(r"^epochal_egress_commits_total\{.*\} [1-9]", re.M)  # off the loop,
    # counted once the commit's thread is back: a moment after its records can be read
    wait_until(lambda: committed.search(shared.metrics(shared.metrics_port)), 10, "no commits")


def test_kill_9_of_a_worker_and_the_sequencer_loses_and_doubles_nothing(shared: Cluster) -> None:
    generation = shared.generation()
    shared.produce(3000, json_every=10)
    time.sleep(1)
    os.kill(int(shared.status()["workers"][1]), signal.SIGKILL)
    shared.produce(3000, json_every=10)
    wait_until(lambda: shared.generation() > generation, 30, "no rollback", log=shared.log)
    time.sleep(1)
    os.kill(int(shared.status()["sequencer"]), signal.SIGKILL)
    shared.produce(3000, json_every=10)
    shared.check_against_the_oracle()
    assert shared.generation() == generation + 2  # a rollback for each process killed


def test_a_client_transaction_sent_twice_is_sequenced_once(shared: Cluster) -> None:
    request = ClientRequest("req-42", "transfer", msgspec.msgpack.encode(Transfer(1, 2, 5)))
    not_a_client_handler = ClientRequest("req-43", "deposit", msgspec.msgpack.encode(Deposit(1, 5)))
    # the second is a client's retry
    shared.produce_values([msgspec.msgpack.encode(r) for r in (request, request)], "requests")
    shared.produce_values([msgspec.msgpack.encode(not_a_client_handler)], "requests")
    shared.transfers += 1
    egress = shared.check_against_the_oracle()
    client = [t for e in shared.epochs() for t in e.txns if t.origin == Origin.CLIENT]
    assert [(t.request_id, t.handler) for t in client] == [("req-42", "transfer")]
    assert [r.request_id for r in egress if r.request_id] == ["req-42"]  # says which request
    dead = shared.dead_letters()
    assert "no client transaction" in dead[-1].reason and dead[-1].topic.endswith(".requests")


def test_interior_transactions_run_although_the_input_goes_idle(shared: Cluster) -> None:
    """A transfer of 31 emits an audit, which runs at the start of the next epoch. No input
    follows, and an idle sequencer logs nothing: worker 0's tick brings that epoch about."""
    offset = shared.produced + 1
    shared.produce_values(
        [msgspec.msgpack.encode(Deposit(0, 100)), msgspec.msgpack.encode(Transfer(0, 1, 31))]
    )
    shared.transfers += 1
    shared.check_against_the_oracle()

    def parent_and_last() -> tuple[int, int]:
        epochs = shared.epochs()
        (parent,) = [
            e.epoch for e in epochs for t in e.txns if t.source and t.source.offset == offset
        ]
        return parent, epochs[-1].epoch

    wait_until(lambda: parent_and_last()[1] > parent_and_last()[0], 20, "no epoch after it")
    parent, _ = parent_and_last()
    audits = [
        o
        for result in SerialOracle(app).run(shared.epochs())
        for o in result.outcomes
        if o.handler == "audit" and o.source is not None and o.source.offset == offset
    ]
    assert [(o.epoch, o.seq, o.committed) for o in audits] == [(parent + 1, -1, True)]


def test_the_default_layout_leaves_a_core_to_the_sequencer_and_applies_each_input_once(
    kafka_config: KafkaConfig, tmp_path: Path
) -> None:
    """``epochal run`` without ``--workers``/``--partitions``: one worker per usable core but
    one (at least one), two partitions each; a worker killed mid-stream changes nothing."""
    cluster = Cluster(f"dl{uuid.uuid4().hex[:8]}", tmp_path, KafkaClients(kafka_config))
    try:
        cluster.start(workers=None)
        assert len(cluster.status()["workers"]) == default_workers()
        workers = default_workers()
        said = f"{workers} worker{'s' * (workers != 1)}, {2 * workers} partitions"
        assert said in cluster.log(), cluster.log()
        cluster.produce(1500, deposits=True)
        generation = cluster.generation()
        os.kill(int(cluster.status()["workers"][0]), signal.SIGKILL)
        wait_until(lambda: cluster.generation() > generation, 30, "no rollback", log=cluster.log)
        cluster.produce(1500)
        cluster.check_against_the_oracle()
        cluster.stop()
    finally:
        cluster.close()


def test_a_backlog_run_in_epochs_of_several_slices_egresses_as_the_oracle_says(
    kafka_config: KafkaConfig, tmp_path: Path
) -> None:
    """A backlog read at a start makes epochs of several of the slices a worker plans and runs
    at a time: the egress of each slice, encoded as it runs and staged with its epoch, goes
    out once per input, with the oracle's outcome."""
    cluster = Cluster(f"sl{uuid.uuid4().hex[:8]}", tmp_path, KafkaClients(kafka_config))
    try:
        cluster.start(workers=2, partitions=4)
        cluster.produce(0, deposits=True)
        cluster.stop()
        cluster.produce(6000)
        cluster.start(workers=2, partitions=4)
        cluster.check_against_the_oracle()
        assert max(len(epoch.txns) for epoch in cluster.epochs()) > 2 * PLAN_SLICE
        cluster.stop()
    finally:
        cluster.close()
