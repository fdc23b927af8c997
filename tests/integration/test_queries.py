"""The query client against a real cluster (real processes, Kafka, Delta, Spark): the isolation
levels keep their promises while transfers run, across a ``kill -9`` and rollback.

- ``COMMITTED`` full scans on 2 workers under continuous transfers always sum to the constant
  total, and (strong mode) every one equals the serial oracle's state at the epoch it was read
  at: recovery reproduces everything ``COMMITTED`` showed.
- ``SERIALIZABLE`` sees a client transaction that just committed; a retried submit with the same
  idempotency key is applied once and returns the same outcome.
- ``SNAPSHOT(ssid)`` equals Spark's ``VERSION AS OF`` for that ssid; an expired ssid is refused.
- ``LIVE`` (weak mode) can show a value that a crash rolls back: a value read before the crash
  is in no state of the history the cluster then settles on.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from epochal.actors.oracle import SerialOracle
from epochal.client import COMMITTED, LIVE, SERIALIZABLE, SNAPSHOT, Client
from epochal.config import SnapshotConfig
from epochal.errors import QueryError, SnapshotNotRetainedError
from epochal.recovery.log_tables import epochs_of
from epochal.recovery.snapshot_reads import SnapshotReader
from epochal.schemas.canonical import decode_canonical
from epochal.schemas.commands import EpochRecord, KeyRef
from tests.integration.cluster import Cluster, app_named, wait_until
from tests.unit.actors.workload import ACCOUNTS, Account, AuditLog, Transfer, app

pytestmark = pytest.mark.integration

TOTAL = 100 * ACCOUNTS  # every account gets a deposit of 100; transfers move money around


@contextmanager
def _transfers_running(cluster: Cluster, every_s: float = 0.05) -> Iterator[None]:
    """Transfers produced continuously (batches of 20) until the block ends."""
    stop = threading.Event()

    def produce() -> None:
        while not stop.is_set():
            cluster.produce(20)
            time.sleep(every_s)

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _client(cluster: Cluster, **options: object) -> Client:
    return Client(
        app_named(cluster.name), f"127.0.0.1:{cluster.query_base}", kafka=cluster.kafka.config,
        snapshots=SnapshotReader(SnapshotConfig(str(cluster.warehouse)), cluster.name),
        timeout_s=30, **options,
    )  # fmt: skip


@contextmanager
def _scanning(
    cluster: Cluster, samples: list[tuple[int, dict[int, int]]], clients: int
) -> Iterator[None]:
    """``clients`` threads sharing one client, scanning every balance ``COMMITTED`` in a loop
    until the block ends: each scan must sum to the total; each goes to ``samples`` with the
    epoch its result says it was read at (not the client's last: the threads share it)."""
    stop, failures = threading.Event(), []

    def scan(client: Client) -> None:
        try:
            while not stop.is_set():
                rows = client.scan(Account, isolation=COMMITTED)
                balances = {key: account.balance for key, account in rows}
                samples.append((rows.epoch, balances))
                assert sum(balances.values()) == TOTAL, "a scan saw a partial transfer"
                time.sleep(0.005)
        except BaseException as exc:  # the test thread re-raises it
            failures.append(exc)

    with _client(cluster) as shared:
        threads = [threading.Thread(target=scan, args=(shared,), daemon=True)
                   for _ in range(clients)]  # fmt: skip
        for thread in threads:
            thread.start()
        try:
            yield
        finally:
            stop.set()
            for thread in threads:
                thread.join()
    if failures:
        raise failures[0]


def _snapshot_reads_with_the_cluster_stopped(
    cluster: Cluster, ssid: int, expected: list[tuple[int, Account]]
) -> None:
    """A client without endpoints, told the warehouse alone, reads snapshots (and only them)."""
    offline = Client(app_named(cluster.name), (), snapshots=SnapshotConfig(str(cluster.warehouse)))
    with offline:
        again = offline.scan(Account, isolation=SNAPSHOT(ssid))
        assert again == expected and again.epoch == ssid
        with pytest.raises(QueryError, match="reads snapshots only"):
            offline.get(Account, 3, isolation=COMMITTED)


def _oracle_balances(epochs: list[EpochRecord]) -> dict[int, dict[int, int]]:
    oracle, balances = SerialOracle(app), {}
    for record in epochs:
        oracle.run_epoch(record)
        balances[record.epoch] = {
            ref.key: decode_canonical(v, Account).balance
            for ref, v in oracle.state.items()
            if ref.actor_type == "Account"
        }
    return balances


def test_committed_serializable_and_snapshot_reads_across_a_kill_9(
    cluster: Cluster, spark: SparkSession
) -> None:
    cluster.start(workers=2, partitions=4, snapshot_ms=300)
    cluster.produce(100, deposits=True)
    cluster.wait_for_egress()
    samples: list[tuple[int, dict[int, int]]] = []  # (epoch, balances) seen at COMMITTED
    with _client(cluster) as client:
        with _transfers_running(cluster), _scanning(cluster, samples, clients=3):
            generation = cluster.generation()
            time.sleep(2)
            os.kill(int(cluster.status()["workers"][1]), signal.SIGKILL)  # clients keep answering
            wait_until(lambda: cluster.generation() > generation, 30, "no rollback")
            after = client.aggregate(Account, "sum:balance", "count")  # retried meanwhile
            assert after == {"sum:balance": TOTAL, "count": ACCOUNTS}
            time.sleep(2)
        cluster.wait_for_egress()

        # read-your-writes: a client transaction, then a serializable read (from the richest
        # account: the random transfers may have emptied any given one)
        balances = {key: account.balance for key, account in client.scan(Account)}
        rich = max(balances, key=balances.__getitem__)
        other = next(key for key in balances if key != rich)
        before = client.get_many(Account, [rich, other], isolation=SERIALIZABLE)
        move = Transfer(rich, other, 7)
        outcome = client.submit("transfer", move, request_id="move-7").result()
        assert outcome.committed, outcome.reason
        now = client.get_many(Account, [rich, other], isolation=SERIALIZABLE)
        assert now.epoch > outcome.epoch >= before.epoch  # sequenced after the transfer
        assert now[rich].balance == before[rich].balance - 7
        assert now[other].balance == before[other].balance + 7
        again = client.submit("transfer", move, request_id="move-7").result()
        assert (again.epoch, again.seq, again.committed) == (outcome.epoch, outcome.seq, True)
        assert client.get(Account, rich, isolation=SERIALIZABLE).balance == now[rich].balance
        refused = client.submit("transfer", Transfer(rich, rich, 1)).result()  # the handler raises
        assert not refused.committed and "transfer to itself" in refused.reason

        # a retained snapshot through the client equals Spark's VERSION AS OF for its ssid
        wait_until(lambda: len(cluster.snapshots().manifests()) >= 2, 30, "no snapshots")
        manifest = cluster.snapshots().manifests()[-2]
        table = str(cluster.warehouse / cluster.name / "state" / "Account")
        version = manifest.state_versions["Account"]
        spark_rows = spark.read.format("delta").option("versionAsOf", version).load(table).collect()
        through_client = client.scan(Account, isolation=SNAPSHOT(manifest.ssid))
        assert through_client.epoch == manifest.ssid
        assert {k: a.balance for k, a in through_client} == {
            r["_key"]: r["balance"] for r in spark_rows
        }
        assert client.get(Account, 3, isolation=SNAPSHOT(manifest.ssid)) == dict(through_client)[3]
        with pytest.raises(SnapshotNotRetainedError):
            client.get(Account, 3, isolation=SNAPSHOT(manifest.ssid + 10_000))
    cluster.stop()
    _snapshot_reads_with_the_cluster_stopped(cluster, manifest.ssid, through_client)

    # strong mode: recovery reproduced everything COMMITTED showed, before and after the kill
    oracle = _oracle_balances(cluster.epochs())
    assert len(samples) > 100 and len({epoch for epoch, _ in samples}) > 20, len(samples)
    for epoch, balances in samples:
        assert balances == oracle[epoch], f"COMMITTED at epoch {epoch} is not the history's"


def test_live_reads_can_be_rolled_back_by_a_crash_in_weak_mode(cluster: Cluster) -> None:
    """Weak mode re-sequences the input after a crash with new epochs and seeds: state newer
    than the last snapshot is revised. The audit log's ``lucky`` (``ctx.random()``) read
    ``LIVE`` before the crash is in no state of the history that follows."""
    # no snapshot between the read and the kill: the next one is due a minute after the first
    cluster.start(workers=2, partitions=4, snapshot_ms=60_000, extra=["--recovery", "weak"])
    cluster.produce(0, deposits=True)
    with _client(cluster) as client, _transfers_running(cluster, every_s=0.02):
        wait_until(lambda: _lucky(client) != 0.0, 30, "no audit ran yet")
        seen = _lucky(client)
        generation = cluster.generation()
        os.kill(int(cluster.status()["workers"][0]), signal.SIGKILL)
        wait_until(lambda: cluster.generation() > generation, 30, "no rollback")
        wait_until(lambda: _lucky(client) not in (0.0, seen), 30, "no audit after the rollback")
    cluster.stop()  # a savepoint: its snapshot releases what weak mode held
    egress = cluster.wait_for_egress(timeout_s=30)
    assert len(egress) >= cluster.transfers, f"{len(egress)} of {cluster.transfers} came out"
    manifest = cluster.snapshots().manifests()[-1]
    commands = DeltaTable(str(cluster.warehouse / cluster.name / "commands"),
                          version=manifest.log_versions["commands"])  # fmt: skip
    oracle, history = SerialOracle(app), set()
    for record in epochs_of(commands.to_pyarrow_table()):
        oracle.run_epoch(record)
        audit = oracle.state.get(KeyRef("AuditLog", "audit"))
        history.add(decode_canonical(audit, AuditLog).lucky if audit else 0.0)
    assert len(history) > 3
    assert seen not in history, "the LIVE value survived the crash"


def _lucky(client: Client) -> float:
    audit = client.get(AuditLog, "audit", isolation=LIVE)
    return 0.0 if audit is None else float(audit.lucky)
