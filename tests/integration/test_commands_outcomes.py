"""The ``commands`` archive carries each transaction's outcome (issue #8: the ``commands`` view
shows the archived command log with its outcomes).

Two workers over real TCP each know only the outcomes their partitions report: each archives
the transactions it reports, with their outcomes (as a cluster does), or worker 0 archives the
epochs and the commit joins every worker's outcomes on (as a recovery job does). Either way,
for every archived transaction, interior ones and aborted ones included, the outcome equals
the serial oracle's. An archive written before the columns existed gains them, its old rows
null, and still reads back as epochs (delta-rs and Spark)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession

from epochal.actors.engine import Engine
from epochal.actors.oracle import SerialOracle
from epochal.actors.snapshots import with_log_position
from epochal.actors.transport import Peers
from epochal.config import SnapshotConfig
from epochal.recovery import snapshots as recovery_snapshots
from epochal.recovery.log_tables import COMMANDS_SCHEMA, commands_table, epochs_of
from epochal.recovery.snapshots import DeltaSnapshots
from epochal.schemas.codec import encode
from epochal.schemas.commands import EpochRecord
from epochal.schemas.snapshots import Manifest, SnapshotPart
from tests.conftest import free_port_pair
from tests.unit.actors.workload import (
    Close,
    Deposit,
    FeeTransfer,
    Scale,
    Share,
    Sneaky,
    Transfer,
    app,
    command_log,
)

pytestmark = pytest.mark.integration

_NEW = ("committed", "reason", "parent_epoch", "parent_seq")


def _log(epochs: int = 10, seed: int = 3) -> list[EpochRecord]:
    """Transfers that overdraw or go to themselves (aborts), audits of big ones (interior, some
    aborting), shares (interior notes), undeclared keys, ill-typed values; epoch 4 has nothing
    logged, but interior transactions the epoch before emitted run in it."""
    rng = random.Random(seed)

    def op(a: int, b: int) -> object:
        return rng.choice([
            Transfer(a, b, rng.randrange(1, 80)), Transfer(a, a, 5), Deposit(a, 20), Close(a),
            Sneaky(a), FeeTransfer(a, b, rng.randrange(1, 40), 3), Scale(a, rng.randrange(20)),
            Share(a),
        ])  # fmt: skip

    batches = [[Deposit(a, 50) for a in range(40)]]
    batches += [[op(rng.randrange(40), rng.randrange(40)) for _ in range(30)]
                for _ in range(epochs - 1)]  # fmt: skip
    batches[3] += [Transfer(1, 2, 35), Transfer(3, 4, 42)]  # audits, to run in epoch 4
    records = command_log(batches, snapshot_every=3)
    records[4] = msgspec.structs.replace(records[4], txns=())
    return records


async def _two_workers(
    records: list[EpochRecord], snapshots: DeltaSnapshots, joined: bool = False
) -> list[Manifest]:
    """Two engines over TCP; at each snapshot epoch each writes its part with what it reported
    and the epochs since the last snapshot, as a cluster's workers do (each archives what it
    reported), or ``joined``, as a recovery job does (worker 0 archives the epochs, the
    committer joins the outcomes on), and the parts are committed together."""
    base = free_port_pair()
    addresses = [f"127.0.0.1:{base + w}" for w in range(2)]
    engines: list[Engine] = []
    for w in range(2):
        peers = Peers(w, addresses, generation=1, on_frame=lambda f, w=w: engines[w].on_frame(f))
        engines.append(Engine(app, 4, w, 2, peers, snapshots=True))
    await asyncio.gather(*(e.peers.start() for e in engines if e.peers))
    manifests, since = [], 0
    try:
        for position, record in enumerate(records):
            results = await asyncio.gather(*(e.run_epoch(record) for e in engines))
            if results[0].changes is None:
                continue
            epochs = records[since : position + 1]
            parts = [
                snapshots.write(record.epoch, w, result.changes or [],
                                commands=epochs if joined and w == 0 else (),
                                archived=() if joined else [msgspec.Raw(encode(e)) for e in epochs],
                                reported=engines[w].take_reported())
                for w, result in enumerate(results)
            ]  # fmt: skip
            parts[0] = with_log_position(parts[0], record, position + 1, engines[0].carried)
            manifests.append(snapshots.commit(parts, record.epoch))
            since = position + 1
    finally:
        for e in engines:
            if e.peers:
                await e.peers.close()
    return manifests


def _snapshots(tmp_path: Path) -> DeltaSnapshots:
    snapshots = DeltaSnapshots(app, SnapshotConfig(str(tmp_path / "warehouse"), keep=0), 4)
    snapshots.ensure_tables(app.code_hash())
    return snapshots


def _archive(snapshots: DeltaSnapshots, manifest: Manifest) -> pa.Table:
    uri = snapshots.warehouse.log("commands")
    return DeltaTable(uri, version=manifest.log_versions["commands"]).to_pyarrow_table()


@pytest.mark.parametrize(
    ("joined", "batch"),
    [(False, None), (False, 5), (True, None)],
    ids=["by-reporter", "by-reporter-in-batches", "joined"],
)
def test_the_archive_holds_every_transaction_with_the_oracles_outcome(
    tmp_path: Path, joined: bool, batch: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if batch is not None:  # archived epochs turned into rows a few transactions at a time
        monkeypatch.setattr(recovery_snapshots, "_ARCHIVE_BATCH_TXNS", batch)
    records = _log()
    oracle = SerialOracle(app).run(records)
    snapshots = _snapshots(tmp_path)
    manifests = asyncio.run(_two_workers(records, snapshots, joined))
    assert [m.ssid for m in manifests] == [2, 5, 8]
    rows = _archive(snapshots, manifests[-1]).to_pylist()

    archived = {(r["epoch"], r["seq"]): r for r in rows if r["origin"]}
    assert len(archived) == len([r for r in rows if r["origin"]]), "a transaction twice"
    outcomes = {(o.epoch, o.seq): o for r in oracle[: manifests[-1].epoch + 1] for o in r.outcomes}
    assert {k: (r["committed"], r["reason"], r["handler"]) for k, r in archived.items()} == {
        k: (o.committed, o.reason, o.handler) for k, o in outcomes.items()
    }
    # the workload reaches every kind of row: aborted logged and interior ones among them
    kinds = {(r["origin"], r["committed"]) for r in archived.values()}
    assert kinds >= {("border", True), ("border", False), ("interior", True), ("interior", False)}
    assert all(r["reason"] == "" for r in archived.values() if r["committed"])
    assert all(r["reason"] for r in archived.values() if not r["committed"])
    # an interior row names its parent, which emitted it the epoch before, and its event
    for (epoch, seq), row in archived.items():
        if row["origin"] == "interior":
            assert seq < 0 and row["txn"] is None and row["event_json"]
            parent = archived[row["parent_epoch"], row["parent_seq"]]
            assert row["parent_epoch"] == epoch - 1 and parent["committed"]
        else:
            assert row["parent_epoch"] is None and row["parent_seq"] is None
    # the epoch with nothing logged keeps its seq -1 row, without an outcome, beside the
    # interior transactions that ran in it (one of them at seq -1 too)
    empty = [r for r in rows if not r["origin"]]
    assert [(r["epoch"], r["seq"], r["committed"]) for r in empty] == [(4, -1, None)]
    assert (4, -1) in archived and archived[4, -1]["origin"] == "interior"
    # the archive still gives back the epochs, and they replay to the snapshot
    replayed = epochs_of(_archive(snapshots, manifests[-1]))
    assert [(r.epoch, r.txns) for r in replayed] == [
        (r.epoch, r.txns) for r in records[: manifests[-1].epoch + 1]
    ]
    assert SerialOracle(app).run(replayed)[-1].digest == manifests[-1].digest
    # no file the commit replaced is left behind: the table's files are all there is
    table = DeltaTable(snapshots.warehouse.log("commands"))
    on_disk = {p.name for p in Path(snapshots.warehouse.log("commands")).glob("*.parquet")}
    assert on_disk == {Path(uri).name for uri in table.file_uris()}
    # columns of distinct values are not dictionary-encoded, repeated ones are (joined too)
    for uri in table.file_uris():
        group = pq.ParquetFile(uri).metadata.row_group(0)
        columns = [group.column(i) for i in range(group.num_columns)]
        dictionary = {c.path_in_schema for c in columns if "RLE_DICTIONARY" in c.encodings}
        assert {"handler", "origin", "code_hash"} <= dictionary, uri
        assert not {"event_json", "txn", "request_id"} & dictionary, uri


def test_an_archive_from_before_outcomes_gains_the_columns(
    tmp_path: Path, spark: SparkSession
) -> None:
    records = [msgspec.structs.replace(r, snapshot=r.epoch == 5) for r in _log(epochs=6)]
    snapshots = DeltaSnapshots(app, SnapshotConfig(str(tmp_path / "warehouse"), keep=0), 4)
    uri = snapshots.warehouse.log("commands")
    old = pa.schema([f for f in COMMANDS_SCHEMA if f.name not in _NEW])
    before = commands_table(app, 2, records[:3]).select(old.names).cast(old)
    write_deltalake(uri, before, mode="append")  # as an older epochal archived epochs 0..2
    snapshots.ensure_tables(app.code_hash())  # leaves an existing table as it is
    assert DeltaTable(uri).schema().to_arrow().names == old.names
    older = {"ssid": 2, "worker": 1, "files": [], "digest_delta": "00", "changed": 0}
    part = msgspec.msgpack.decode(msgspec.msgpack.encode(older), type=SnapshotPart)
    assert part.outcomes == b""  # a part from an older worker still decodes

    engine = Engine(app, 4, snapshots=True)
    oracle = SerialOracle(app).run(records)
    (result,) = [r for r in asyncio.run(engine.run(records)) if r.changes is not None]
    reported = [r for r in engine.take_reported() if r.epoch >= 3]
    written = snapshots.write(5, 0, result.changes or [], commands=records[3:6],
                              reported=reported)  # fmt: skip
    manifest = snapshots.commit([with_log_position(written, records[5], 6, engine.carried)], 5)
    assert manifest.digest == oracle[5].digest

    rows = _archive(snapshots, manifest).to_pylist()
    assert list(rows[0]) == COMMANDS_SCHEMA.names
    outcomes = {(o.epoch, o.seq): (o.committed, o.reason) for r in oracle for o in r.outcomes}
    for row in rows:
        if row["epoch"] <= 2 or not row["origin"]:  # archived before, or nothing logged
            assert (row["committed"], row["reason"]) == (None, None)
        else:
            assert (row["committed"], row["reason"]) == outcomes[row["epoch"], row["seq"]]
    assert [r.epoch for r in epochs_of(_archive(snapshots, manifest))] == list(range(6))
    frame = spark.read.format("delta").load(uri)  # Spark reads old and new files alike
    counts = {
        (r["old"], r["committed"]): r["count"]
        for r in frame.groupBy((frame.epoch <= 2).alias("old"), "committed").count().collect()
    }
    assert counts.pop((True, None)) == sum(len(r.txns) for r in records[:3])
    assert counts.pop((False, None)) == 1  # epoch 4's row: nothing logged
    assert set(counts) == {(False, True), (False, False)}
    assert sum(counts.values()) == sum(len(r.outcomes) for r in oracle[3:])
