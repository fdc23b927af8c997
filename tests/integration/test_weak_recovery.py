"""Weak recovery (docs/recovery.md) with real processes, Kafka and Delta: no command log; the
sequencer sends epochs to the workers, egress waits for the snapshot that covers it, and a
crash re-sequences the input from the latest snapshot's offsets.

After ``kill -9`` of workers (one mid-snapshot) or the sequencer, the history the snapshots
archived (``<app>/commands``) must be a valid one: every input applied once (or dead-lettered
once), each input partition in order; the serial oracle run over it gives the latest snapshot's
digest and each archived transaction's outcome, and every released egress record agrees with
it (so nothing released was contradicted by the re-sequencing).
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from epochal.actors.engine import EpochResult
from epochal.actors.oracle import SerialOracle
from epochal.config import SnapshotConfig
from epochal.recovery.log_tables import epochs_of
from epochal.recovery.spark_weak import recover_weak
from epochal.schemas.commands import EpochRecord
from epochal.schemas.snapshots import Manifest
from tests.conftest import free_ports
from tests.integration.cluster import Cluster, app_named, wait_until
from tests.unit.actors.workload import app

pytestmark = pytest.mark.integration

INPUT_PARTITIONS = 3
WEAK = ["--recovery", "weak", "--input-partitions", str(INPUT_PARTITIONS)]


def _latest(cluster: Cluster) -> Manifest:
    """The latest snapshot, read once for every check of it (a snapshot committed meanwhile
    must not mix two versions into one comparison); each snapshot's ssid is its own."""
    manifests = cluster.snapshots().manifests()
    ssids = [m.ssid for m in manifests]
    assert ssids == sorted(set(ssids)), f"snapshots share an ssid: {_described(manifests)}"
    return manifests[-1]


def _described(manifests: list[Manifest]) -> str:
    return ", ".join(
        f"ssid={m.ssid} commands@{m.log_versions.get('commands')} covered={_inputs(m)}"
        for m in manifests
    )


def _archived(cluster: Cluster, manifest: Manifest) -> list[EpochRecord]:
    """The epochs ``manifest``'s ``commands`` version archives."""
    return epochs_of(_commands(cluster, manifest).to_pyarrow_table())


def _commands(cluster: Cluster, manifest: Manifest) -> DeltaTable:
    return DeltaTable(str(cluster.warehouse / cluster.name / "commands"),
                      version=manifest.log_versions["commands"])  # fmt: skip


def _check_outcomes(cluster: Cluster, manifest: Manifest, results: list[EpochResult]) -> None:
    """The archive holds each transaction of its history once, interior ones included, with
    the outcome the oracle gives over that history."""
    table = _commands(cluster, manifest).to_pyarrow_table(
        columns=["epoch", "seq", "origin", "committed", "reason"]
    )
    archived = [((r["epoch"], r["seq"]), (r["committed"], r["reason"]))
                for r in table.to_pylist() if r["origin"]]  # fmt: skip
    assert len(archived) == len(dict(archived)), "a transaction archived twice"
    expected = {(o.epoch, o.seq): (o.committed, o.reason) for r in results for o in r.outcomes}
    missing, extra = expected.keys() - dict(archived).keys(), dict(archived).keys() - expected
    assert not missing and not extra, (
        f"archive of ssid={manifest.ssid} lacks {len(missing)} outcomes "
        f"({min(missing, default=None)}..{max(missing, default=None)}) and has {len(extra)} "
        "more; snapshots: "
        f"{_described(cluster.snapshots().manifests())}"
    )
    assert dict(archived) == expected


def _inputs(manifest: Manifest) -> int:
    """Input records of ``in.ops`` ``manifest`` has sequenced."""
    return sum(o for k, o in manifest.input_positions.items() if ".in.ops:" in k)


def _covered(cluster: Cluster) -> int:
    """Input records of ``in.ops`` the latest snapshot has sequenced."""
    manifests = cluster.snapshots().manifests()
    return _inputs(manifests[-1]) if manifests else 0


def _check_history(cluster: Cluster) -> list[EpochRecord]:
    """Once every input is out: the history the latest snapshot archived applies each input
    once, in its partition's order, or the dead-letter topic holds it once; the oracle over it
    gives the snapshot's digest; every transfer's egress record is out once, as that history
    says, naming its input."""
    egress = cluster.wait_for_egress(timeout_s=90)
    wait_until(lambda: _covered(cluster) == cluster.produced, 30, "no snapshot covers the input")
    latest = _latest(cluster)
    epochs = _archived(cluster, latest)
    topic = f"{cluster.name}.in.ops"
    by_partition: dict[int, list[int]] = {}
    for e in epochs:
        for t in e.txns:
            if t.source and t.source.topic == topic:
                by_partition.setdefault(t.source.partition, []).append(t.source.offset)
    ends = {p: cluster.kafka.end_offset(topic, p) for p in range(INPUT_PARTITIONS)}
    assert sum(ends.values()) == cluster.produced
    assert len([p for p, end in ends.items() if end]) > 1, "the input spans partitions"
    dead: dict[int, list[int]] = {}
    for letter in cluster.dead_letters():
        if letter.topic == topic:
            dead.setdefault(letter.partition, []).append(letter.offset)
    for partition, end in ends.items():  # each input once, in its partition's order
        applied = by_partition.get(partition, [])
        assert applied == sorted(applied), partition
        assert sorted(applied + dead.get(partition, [])) == list(range(end)), partition
    results = SerialOracle(app).run(epochs)
    assert results[-1].digest == latest.digest, "the snapshot's state is the archived history's"
    _check_outcomes(cluster, latest, results)
    expected = sorted(
        (o.epoch, o.seq, o.committed, o.reason)
        for r in results
        for o in r.outcomes
        if o.handler == "transfer"
    )
    released = sorted((r.epoch, r.seq, r.committed, r.reason) for r in egress)
    assert released == expected, "every transfer's egress once, as the valid history says"
    sources = {(e.epoch, t.seq): t.source for e in epochs for t in e.txns}
    assert all(sources[r.epoch, r.seq] == r.source for r in egress), "each says its input"
    return epochs


def test_the_weak_recovery_job_in_spark_resequences_the_input_after_the_snapshot(
    cluster: Cluster, spark: SparkSession
) -> None:
    """The cluster stops; input arrives meanwhile; ``recover --mode weak`` re-sequences it in
    Spark into a snapshot; the cluster resumes from that snapshot and releases its egress and
    its dead letter, once."""
    cluster.start(workers=2, partitions=4, snapshot_ms=200, extra=WEAK)
    cluster.produce(200, deposits=True)
    cluster.wait_for_egress()
    wait_until(lambda: _covered(cluster) == cluster.produced, 30, "no snapshot covers the input")
    cluster.stop()
    before = cluster.snapshots().manifests()[-1]
    cluster.produce(500)  # only the input topic holds these: there is no command log
    cluster.produce_values([b"\xc1 not msgpack"])
    config = SnapshotConfig(str(cluster.warehouse), recovery="weak")
    report = recover_weak(app_named(cluster.name), config, spark, cluster.kafka.config,
                          max_records=120)  # fmt: skip
    assert (report.from_ssid, report.transactions, report.dead_letters) == (before.ssid, 500, 1)
    assert report.records - 501 in (0, 1)  # and a worker's tick for waiting interior ones
    assert cluster.dead_letters() == [], "held in the snapshot, released by the cluster"
    assert report.epochs == 5 and report.egress == 500  # 120 a piece; a report per transfer
    latest = _latest(cluster)
    assert (latest.ssid, latest.digest, latest.recovery) == (report.ssid, report.digest, "weak")
    assert _covered(cluster) == cluster.produced
    results = SerialOracle(app).run(_archived(cluster, latest))
    assert results[-1].digest == report.digest
    _check_outcomes(cluster, latest, results)  # the job's epochs and the cluster's before them
    cluster.start(workers=2, partitions=4, snapshot_ms=200, extra=WEAK)  # resumes from it
    resumed = f"workers on the epoch feed ssid={report.ssid} "
    wait_until(lambda: resumed in cluster.log(), 30, "not resumed from the job's snapshot")
    cluster.produce(100)
    _check_history(cluster)  # each input once, the dead letter included
    assert [d.value for d in cluster.dead_letters()] == [b"\xc1 not msgpack"]
    cluster.stop()


def _part_files(cluster: Cluster) -> int:
    return len(list(cluster.warehouse.glob("*/changes/*/part-*.parquet")))


def test_weak_recovery_applies_every_input_once_in_order_and_never_contradicts_egress(
    cluster: Cluster,
) -> None:
    cluster.start(workers=2, partitions=4, snapshot_ms=200, extra=WEAK)
    cluster.produce(400, deposits=True)
    cluster.wait_for_egress()
    assert "workers on the epoch feed" in cluster.log()
    for kill in range(2):
        generation, before = cluster.generation(), _part_files(cluster)
        cluster.produce(500)
        if kill == 0:  # while a snapshot part is written, before the snapshot commits
            wait_until(lambda b=before: _part_files(cluster) > b, 30, "no part written")
        else:
            time.sleep(0.2)
        os.kill(int(cluster.status()["workers"][kill]), signal.SIGKILL)
        wait_until(lambda g=generation: cluster.generation() > g, 30, "no rollback",
                   log=cluster.log)  # fmt: skip
    cluster.produce(300)
    _check_history(cluster)
    cluster.stop()


def _sequenced_dead_letters(cluster: Cluster, workers: int) -> int:
    """The dead letters the running sequencer counted: it counts an epoch's once it is done
    with them (sent to the workers; in the at-least-once design, written)."""
    text = cluster.metrics(cluster.metrics_port + workers)
    found = re.search(r"^epochal_dead_letters_total\{.*\} ([0-9.]+)$", text, re.MULTILINE)
    return int(float(found.group(1))) if found else 0


def _resumed_ssids(cluster: Cluster) -> list[int]:
    """The snapshot each sequencer started from (-1: none), in order."""
    return [int(s) for s in re.findall(r"workers on the epoch feed ssid=(-?\d+) ", cluster.log())]


def test_weak_mode_writes_each_dead_letter_once_although_workers_and_the_sequencer_die(
    cluster: Cluster,
) -> None:
    """Malformed records are dead-lettered, then worker 0 (which holds partition 0, whose
    egress writer releases the dead letters) and in a second round the sequencer are killed
    before the next snapshot covers them. The rollback re-sequences them from the snapshot
    before; the dead-letter topic still holds each once, and only once a snapshot covers it.
    A sequencer that wrote them itself when it sequenced them writes them twice."""
    metrics = free_ports(3)  # the sequencer's is the third
    cluster.start(workers=2, partitions=4, metrics_port=metrics, snapshot_ms=3000, extra=WEAK)
    cluster.produce(100, deposits=True)
    bad: list[bytes] = []
    for round_, role in enumerate(("worker", "sequencer")):
        wait_until(lambda: _covered(cluster) == cluster.produced, 30, "no snapshot covers all")
        generation, counted = cluster.generation(), _sequenced_dead_letters(cluster, 2)
        resumed = len(_resumed_ssids(cluster))
        values = [b"\xc1 not msgpack %d/%d" % (round_, i) for i in range(5)]
        cluster.produce_values(values)
        cluster.produce(20)
        bad += values
        expected = counted + len(values)
        wait_until(lambda n=expected: _sequenced_dead_letters(cluster, 2) >= n, 10, "not sequenced")
        assert not {d.value for d in cluster.dead_letters()} & set(values), "not held"
        status = cluster.status()
        pid = status["workers"][0] if role == "worker" else status["sequencer"]
        os.kill(int(pid), signal.SIGKILL)
        wait_until(
            lambda g=generation: cluster.generation() > g, 30, "no rollback", log=cluster.log
        )
        wait_until(
            lambda n=resumed: len(_resumed_ssids(cluster)) > n, 30, "no resume", log=cluster.log
        )
        ssid = _resumed_ssids(cluster)[-1]
        (before,) = [m for m in cluster.snapshots().manifests() if m.ssid == ssid]
        covered = sum(o for k, o in before.input_positions.items() if ".in.ops:" in k)
        assert covered < cluster.produced, "the kill came after a snapshot covered them (slow?)"
    cluster.produce(50)
    wait_until(lambda: len(cluster.dead_letters()) >= len(bad), 30, "dead letters not released")
    assert sorted(d.value for d in cluster.dead_letters()) == sorted(bad), "each once"
    _check_history(cluster)  # each input once: as a transaction or as one dead letter
    cluster.stop()


def test_weak_mode_refuses_an_app_whose_snapshots_are_strong(cluster: Cluster) -> None:
    cluster.start(workers=1, partitions=2, snapshot_ms=200)
    cluster.produce(50, deposits=True)
    cluster.wait_for_egress()
    wait_until(lambda: bool(cluster.snapshots().manifests()), 30, "no snapshot")
    cluster.stop()
    cluster.start(workers=1, partitions=2, snapshot_ms=200, extra=WEAK)
    wait_until(lambda: cluster.processes[-1].poll() is not None, 60, "the cluster did not stop",
               log=cluster.log)  # fmt: skip
    assert "taken in strong recovery mode" in cluster.log()
