"""Snapshots in real Delta tables (delta-rs), taken by the engine at the epochs the sequencer
marks: each equals the serial oracle at its epoch, a restore plus the rest of the log reaches the
oracle's final state, an unfinished commit is put back, a damaged snapshot is skipped, and a plain
Spark session reads a snapshot's state ``VERSION AS OF`` the version its manifest row names."""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import uuid
from pathlib import Path

import msgspec
import pytest
from pyspark.sql import SparkSession

from epochal.actors.api import named
from epochal.actors.digest import state_digest
from epochal.actors.engine import Engine, EpochResult
from epochal.actors.oracle import SerialOracle
from epochal.actors.snapshots import carried_of, with_log_position
from epochal.config import SnapshotConfig
from epochal.log.client import KafkaClients
from epochal.recovery.log_tables import epochs_of
from epochal.recovery.snapshots import _CHECKPOINT_EVERY, DeltaSnapshots
from epochal.schemas.canonical import decode_canonical
from epochal.schemas.commands import EpochRecord, KeyRef
from epochal.schemas.snapshots import Manifest, OutboxRow
from tests.unit.actors.workload import Account, Deposit, Transfer, app, command_log

pytestmark = pytest.mark.integration


def _log(epochs: int = 12, seed: int = 5) -> list[EpochRecord]:
    rng = random.Random(seed)
    opening = [[Deposit(a, 100) for a in range(40)]]
    rest = [
        [Transfer(rng.randrange(40), rng.randrange(40), rng.randrange(1, 60)) for _ in range(60)]
        for _ in range(epochs - 1)
    ]
    return command_log(opening + rest, snapshot_every=3)


async def _run(
    engine: Engine, records: list[EpochRecord], snapshots: DeltaSnapshots, retain: bool = False
) -> list[tuple[EpochResult, Manifest | None]]:
    """Run epochs; at each snapshot epoch write this (only) worker's part and commit it (then
    ``retain``, as the committer does, if asked)."""
    out = []
    for position, record in enumerate(records):
        result = await engine.run_epoch(record)
        manifest = None
        if result.changes is not None:
            part = snapshots.write(record.epoch, 0, result.changes)
            part = with_log_position(part, record, position + 1, engine.carried)
            manifest = snapshots.commit([part], record.epoch)
            if retain:
                snapshots.retain(manifest)
        out.append((result, manifest))
    return out


def _snapshots(tmp_path: Path) -> DeltaSnapshots:
    config = SnapshotConfig(str(tmp_path / "warehouse"), keep=0)  # keep all: no expiry here
    snapshots = DeltaSnapshots(app, config, partitions=4)
    snapshots.ensure_tables(app.code_hash())
    return snapshots


def test_every_snapshot_equals_the_oracle_and_a_restore_resumes_exactly(tmp_path: Path) -> None:
    records = _log()
    expected = {r.epoch: r.digest for r in SerialOracle(app).run(records)}
    snapshots = _snapshots(tmp_path)
    run = asyncio.run(_run(Engine(app, 4, snapshots=True), records, snapshots))
    manifests = [m for _, m in run if m is not None]
    assert [m.ssid for m in manifests] == [2, 5, 8, 11]
    assert all(m.digest == expected[m.ssid] for m in manifests)

    restored = snapshots.restore()
    assert restored is not None and restored.manifest == manifests[-1]
    resumed = Engine(app, 2, snapshots=True)  # another partition count: keys find their owners
    resumed.load(restored.actors, restored.manifest.epoch, carried_of(restored.manifest))
    assert resumed.digest() == expected[11]
    # from the middle: restore the second snapshot by hand and replay the log after it
    middle = manifests[1]
    engine = Engine(app, 4)
    engine.load(
        {n: snapshots._actors(n, middle) for n in app.actor_types}, middle.epoch,
        carried_of(middle),
    )  # fmt: skip
    results = asyncio.run(engine.run(records[middle.command_log_position :]))
    assert results[-1].digest == expected[records[-1].epoch]


def test_an_unfinished_commit_is_put_back_and_a_commit_is_idempotent(tmp_path: Path) -> None:
    records = _log(epochs=6)
    snapshots = _snapshots(tmp_path)
    engine = Engine(app, 4, snapshots=True)
    results = asyncio.run(engine.run(records[:6]))
    first, second = (r for r in results if r.changes is not None)
    parts = [
        with_log_position(snapshots.write(r.epoch, 0, r.changes or []), records[r.epoch],
                          r.epoch + 1, [])
        for r in (first, second)
    ]  # fmt: skip
    snapshots.commit([parts[0]], first.epoch)
    # a committer killed mid-way through the second: its changes table moved on, no manifest
    uri = snapshots.warehouse.changes("Account")
    snapshots._append(uri, [f for f in parts[1].files if f.actor_type == "Account"])
    assert [m.ssid for m in snapshots.manifests()] == [first.epoch]
    assert snapshots.restore().manifest.ssid == first.epoch  # type: ignore[union-attr]
    # restarted, the cluster writes the second snapshot again, into new files
    again = snapshots.write(second.epoch, 0, second.changes or [])
    again = with_log_position(again, records[second.epoch], second.epoch + 1, [])
    manifest = snapshots.commit([again], second.epoch)  # puts the table back first
    assert manifest.digest == second.digest
    assert snapshots.commit([again], second.epoch) == manifest  # twice: once
    changes = snapshots._table(snapshots.warehouse.changes("Account")).to_pyarrow_table()
    ssids = changes.column("_ssid").to_pylist()
    rows_of_second = sum(f.rows for f in parts[1].files if f.actor_type == "Account")
    assert ssids.count(second.epoch) == rows_of_second  # put back, then once: no doubles


def test_a_committer_sees_what_another_left_in_the_tables_it_keeps_open(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A committer keeps its tables open between commits: another committer (the next
    generation's, a recovery job) that commits snapshots or leaves one unfinished meanwhile is
    seen at its next commit, which puts back what was left and keeps every manifest."""
    records = _log(epochs=12)
    expected = {r.epoch: r.digest for r in SerialOracle(app).run(records)}
    config = SnapshotConfig(str(tmp_path / "warehouse"), keep=2)
    first, second = (DeltaSnapshots(app, config, partitions=4) for _ in range(2))
    first.ensure_tables(app.code_hash())
    second.ensure_tables(app.code_hash())
    results = asyncio.run(Engine(app, 4, snapshots=True).run(records))
    cuts = [r for r in results if r.changes is not None]  # epochs 2, 5, 8, 11

    def commit(snapshots: DeltaSnapshots, result: EpochResult) -> Manifest:
        part = snapshots.write(result.epoch, 0, result.changes or [])
        part = with_log_position(part, records[result.epoch], result.epoch + 1, [])
        manifest = snapshots.commit([part], result.epoch)
        snapshots.retain(manifest)
        return manifest

    commit(first, cuts[0])
    commit(second, cuts[1])
    # the second is killed after merging the third snapshot's state, before its manifest row
    part = second.write(cuts[2].epoch, 0, cuts[2].changes or [])
    second._merge_state("Account", [f for f in part.files if f.actor_type == "Account"])
    with caplog.at_level(logging.WARNING, logger="epochal.recovery.snapshots"):
        third = commit(first, cuts[2])
    assert "putting back a table an unfinished snapshot moved on" in caplog.text
    fourth = commit(second, cuts[3])
    assert [m.ssid for m in first.manifests()] == [third.ssid, fourth.ssid]  # keep=2
    assert fourth.state_versions["Account"] == third.state_versions["Account"] + 1
    for manifest in (third, fourth):
        assert manifest.digest == expected[manifest.ssid]
        restored = first.restore(manifest.ssid)
        assert restored is not None and restored.manifest == manifest
        engine = Engine(app, 4)
        engine.load(restored.actors, manifest.epoch, carried_of(manifest))
        assert engine.digest() == expected[manifest.ssid]


def test_snapshots_past_expiry_add_one_state_version_each_and_restore_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Expiring snapshots (vacuuming the state tables) commits no table version, so the next
    commit finds nothing to put back: exactly one state version per snapshot that changed the
    type, no RESTORE, no warning; every kept snapshot reads back as the oracle wrote it, and the
    files of expired ones are gone. A commit left unfinished after expiry is still put back."""
    records = _log(epochs=33)  # a snapshot every third epoch: 10 run whole, 7 of them expire
    config = SnapshotConfig(str(tmp_path / "warehouse"), keep=3)
    snapshots = DeltaSnapshots(app, config, partitions=4)
    snapshots.ensure_tables(app.code_hash())
    oracle, expected = SerialOracle(app), {}
    for record in records[:30]:
        oracle.run_epoch(record)
        expected[record.epoch] = dict(oracle.state)
    engine = Engine(app, 4, snapshots=True)
    with caplog.at_level(logging.INFO, logger="epochal.recovery.snapshots"):
        run = asyncio.run(_run(engine, records[:30], snapshots, retain=True))
    made = [m for _, m in run if m is not None]
    assert len(made) == 10 and "snapshots expired" in caplog.text
    assert "putting back" not in caplog.text
    for name in app.actor_types:
        state = snapshots._table(snapshots.warehouse.state(name))
        operations = {h["operation"] for h in state.history()}
        assert operations <= {"CREATE TABLE", "MERGE"}, (name, operations)
        assert state.version() == made[-1].state_versions.get(name, 0)  # nothing after it
        for before, after in itertools.pairwise(made):
            changed = after.change_versions[name] - before.change_versions.get(name, 0)
            assert changed in (0, 1)
            assert after.state_versions[name] - before.state_versions.get(name, 0) == changed
    assert all(
        b.state_versions["Account"] < a.state_versions["Account"]
        for b, a in itertools.pairwise(made)
    )
    kept = snapshots.manifests()
    assert kept == made[-3:]
    for manifest in kept:
        restored = snapshots.restore(manifest.ssid)
        assert restored is not None and restored.manifest == manifest
        actors = {KeyRef(n, key): data for n, rows in restored.actors.items() for key, data in rows}
        assert actors == expected[manifest.ssid]
    state_dir = tmp_path / "warehouse" / app.name / "state" / "Account"
    on_disk = {p.name for p in state_dir.glob("*.parquet")}
    versions = [snapshots._table(str(state_dir), m.state_versions["Account"]) for m in kept]
    read = {Path(uri).name for version in versions for uri in version.file_uris()}
    assert on_disk == read  # the expired snapshots' files were vacuumed, nothing else

    # a committer killed after merging the next snapshot's state, before its manifest row
    head = asyncio.run(engine.run(records[30:]))[-1]
    assert head.changes is not None
    part = snapshots.write(head.epoch, 0, head.changes)
    part = with_log_position(part, records[-1], len(records), engine.carried)
    snapshots._merge_state("Account", [f for f in part.files if f.actor_type == "Account"])
    manifest = snapshots.commit([part], head.epoch)
    assert f"putting back a table an unfinished snapshot moved on table={state_dir}" in caplog.text
    assert manifest.state_versions["Account"] == kept[-1].state_versions["Account"] + 3
    assert snapshots.restore().manifest == manifest  # type: ignore[union-attr]


def test_a_running_cluster_expires_snapshots_in_batches_and_trims_the_log_to_the_oldest_kept(
    tmp_path: Path, kafka: KafkaClients
) -> None:
    """With ``keep`` 4, a committer lets a batch of two snapshots past the newest four gather
    before it expires them together (an expiry costs about as much for one as for several): 4
    to 5 are kept. After each commit the command log starts exactly at the oldest snapshot
    kept, and every kept snapshot reads back as the oracle wrote it."""
    bank = named(app, f"exp{uuid.uuid4().hex[:8]}")
    records = _log(epochs=33)  # a snapshot every third epoch: 11
    kafka.create_topics([bank.topics.command_log])
    producer = kafka.producer()
    for record in records:  # one Kafka record per epoch: a snapshot's position is an offset
        producer.produce(bank.topics.command_log, msgspec.msgpack.encode(record.epoch))
    producer.flush(30)
    config = SnapshotConfig(str(tmp_path / "warehouse"), keep=4)
    snapshots = DeltaSnapshots(bank, config, partitions=4, clients=kafka)
    snapshots.ensure_tables(app.code_hash())
    oracle, expected = SerialOracle(app), {}
    for record in records:
        oracle.run_epoch(record)
        expected[record.epoch] = dict(oracle.state)
    engine = Engine(app, 4, snapshots=True)
    counts = []
    for position, record in enumerate(records):
        result = asyncio.run(engine.run_epoch(record))
        if result.changes is None:
            continue
        part = snapshots.write(record.epoch, 0, result.changes)
        part = with_log_position(part, record, position + 1, engine.carried)
        snapshots.retain(snapshots.commit([part], record.epoch))
        kept = snapshots.manifests()
        counts.append(len(kept))
        low, _ = kafka.watermarks(bank.topics.command_log)
        assert low == kept[0].command_log_position, (counts, low)
    assert counts == [1, 2, 3, 4, 5, 4, 5, 4, 5, 4, 5]
    for manifest in kept:
        restored = snapshots.restore(manifest.ssid)
        assert restored is not None and restored.manifest == manifest
        actors = {KeyRef(n, key): data for n, rows in restored.actors.items() for key, data in rows}
        assert actors == expected[manifest.ssid]


def test_a_damaged_snapshot_is_skipped_for_the_one_before(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    records = _log(epochs=6)
    snapshots = _snapshots(tmp_path)
    run = asyncio.run(_run(Engine(app, 4, snapshots=True), records, snapshots))
    first, last = [m for _, m in run if m is not None]
    newest = snapshots._table(snapshots.warehouse.state("Account"), last.state_versions["Account"])
    for uri in newest.file_uris():
        Path(uri.removeprefix("file://")).unlink()
    restored = snapshots.restore()
    assert restored is not None and restored.manifest.ssid == first.ssid
    assert f"snapshot skipped ssid={last.ssid}" in caplog.text


def test_plain_spark_reads_a_snapshot_version_as_of_its_manifest_row(
    tmp_path: Path, spark: SparkSession
) -> None:
    records = _log(epochs=6)
    snapshots = _snapshots(tmp_path)
    asyncio.run(_run(Engine(app, 4, snapshots=True), records, snapshots))
    oracle = SerialOracle(app)
    for record in records[:3]:
        oracle.run_epoch(record)
    first = snapshots.manifests()[0]
    version = first.state_versions["Account"]
    frame = (
        spark.read.format("delta")
        .option("versionAsOf", version)
        .load(snapshots.warehouse.state("Account"))
    )
    balances = {row["_key"]: (row["balance"], row["touched"]) for row in frame.collect()}
    expected = {
        ref.key: (value.balance, value.touched)
        for ref, data in oracle.state.items()
        if ref.actor_type == "Account"
        for value in [decode_canonical(data, Account)]
    }
    assert balances == expected
    assert state_digest(oracle.state.items()) == first.digest


def test_snapshots_archive_their_epochs_and_hold_weak_egress_until_committed(
    tmp_path: Path,
) -> None:
    """``commands`` gives back exactly the epochs each snapshot closed (empty ones included);
    ``outbox`` gives a partition's held egress in order, only once its snapshot committed, and
    an unfinished commit's rows are put back like its changes."""
    records = _log(epochs=9)
    records[4] = msgspec.structs.replace(records[4], txns=())  # an epoch with nothing logged
    snapshots = _snapshots(tmp_path)
    engine = Engine(app, 4, snapshots=True)
    results = asyncio.run(engine.run(records))
    cuts = [r.epoch for r in results if r.changes is not None]
    held = {
        ssid: [
            OutboxRow(ssid, p % 4, f"t{p}", f"{ssid}/{p}".encode(), b"dlq-key" if p == 1 else None)
            for p in range(10)
        ]  # a dead letter keeps its key
        for ssid in cuts
    }
    start = 0
    for result in results:
        if result.changes is None:
            continue
        part = snapshots.write(result.epoch, 0, result.changes,
                               commands=records[start : result.epoch + 1],
                               outbox=held[result.epoch])  # fmt: skip
        start = result.epoch + 1
        part = with_log_position(part, records[result.epoch], result.epoch + 1, [])
        if result.epoch == cuts[-1]:  # killed after the log tables moved, before the manifest
            snapshots._append(snapshots.warehouse.log("outbox"), part.logs)
            break
        manifest = snapshots.commit([part], result.epoch)
    commands = snapshots._table(snapshots.warehouse.log("commands"),
                                manifest.log_versions["commands"])  # fmt: skip
    archived = epochs_of(commands.to_pyarrow_table())
    assert [(r.epoch, r.now_ms, r.seed, r.txns) for r in archived] == [
        (r.epoch, r.now_ms, r.seed, r.txns) for r in records[: manifest.epoch + 1]
    ]
    assert SerialOracle(app).run(archived)[-1].digest == manifest.digest
    rows = snapshots.outbox(manifest, [1, 2], from_epoch=cuts[1])
    wanted = [r for s in cuts[1:-1] for r in held[s] if r.partition in (1, 2)]
    assert rows == sorted(wanted, key=lambda r: (r.epoch, r.partition))  # each partition's order
    assert snapshots.outbox(manifest, [1], from_epoch=manifest.epoch + 1) == []
    snapshots.commit([part], cuts[-1])  # puts the stray outbox version back first
    outbox = snapshots._table(snapshots.warehouse.log("outbox")).to_pyarrow_table()
    assert outbox.column("_ssid").to_pylist().count(cuts[-1]) == len(held[cuts[-1]])


def test_delta_logs_get_checkpoints_so_opening_a_table_stays_cheap(tmp_path: Path) -> None:
    records = _log(epochs=70)  # a snapshot every third epoch: 23 snapshots
    snapshots = _snapshots(tmp_path)
    asyncio.run(_run(Engine(app, 4, snapshots=True), records, snapshots, retain=True))
    manifests = snapshots.manifests()
    assert len(manifests) > _CHECKPOINT_EVERY
    log = tmp_path / "warehouse" / app.name / "snapshots" / "_delta_log"
    assert list(log.glob("*.checkpoint.parquet")), "the manifest table has a checkpoint"
    assert snapshots.restore() is not None
