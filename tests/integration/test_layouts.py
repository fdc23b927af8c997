"""Which layout a generation runs, judged from real Delta snapshots (no broker): a snapshot
records the layout it was taken under and each partition's actors; a skewed one makes the
learned layout worth it, an even one keeps the layout in force, another partition count learns
from the keys, and a restore under the learned layout spreads the actors."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import msgspec
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from epochal.actors.engine import Engine
from epochal.actors.partitioning import KeyRanges
from epochal.actors.snapshots import with_log_position
from epochal.config import SnapshotConfig
from epochal.log.ordering import EpochStamp, order
from epochal.recovery.layouts import LayoutSource, choose_layout, recorded_layout, skew_of
from epochal.recovery.snapshots import _MANIFEST_SCHEMA, DeltaSnapshots, _manifest_row
from epochal.schemas.codec import encode
from epochal.schemas.commands import EpochRecord, InputRecord
from epochal.schemas.snapshots import Manifest
from tests.integration.shop import Buy, Restock, app

pytestmark = pytest.mark.integration

SKUS = [f"sku-{i:04d}" for i in range(40)]


def _log() -> list[EpochRecord]:
    rng = random.Random(3)
    batches = [
        [Restock(sku, 100) for sku in SKUS],
        [Buy(f"o-{n}", rng.choice(SKUS), 1) for n in rng.sample(range(10_000), 200)],
    ]
    records, offset = [], 0
    for epoch, batch in enumerate(batches):
        inputs = [InputRecord("shop.in.orders", 0, offset + i, encode(op))
                  for i, op in enumerate(batch)]  # fmt: skip
        offset += len(batch)
        stamp = EpochStamp(epoch, 1_000_000 + 20 * epoch, 7 + epoch, app.code_hash(), True)
        records.append(order(app, stamp, inputs).record)
    return records


def _snapshot(tmp_path: Path, ranges: KeyRanges) -> tuple[DeltaSnapshots, Manifest]:
    """Run the log under ``ranges`` and snapshot it as worker 0 of one does."""
    snapshots = DeltaSnapshots(app, SnapshotConfig(str(tmp_path / "warehouse")), 4)
    snapshots.ensure_tables(app.code_hash())
    engine = Engine(app, 4, snapshots=True, ranges=ranges)
    manifest = None
    for position, record in enumerate(_log()):
        result = asyncio.run(engine.run_epoch(record))
        assert result.changes is not None
        part = snapshots.write(record.epoch, 0, result.changes)
        part = with_log_position(part, record, position + 1, engine.carried)
        shares = {int(p): n for p, n in engine.store.actors.items()}
        part = msgspec.structs.replace(part, partition_actors=shares, points=ranges.recorded())
        manifest = snapshots.commit([part], record.epoch)
    assert manifest is not None
    return snapshots, manifest


def test_a_skewed_snapshot_makes_a_learned_layout_worth_a_rebalance(tmp_path: Path) -> None:
    default = KeyRanges.even(app, 4)
    snapshots, manifest = _snapshot(tmp_path, default)
    assert manifest.points == default.recorded()
    assert manifest.partition_actors == [0, 0, 200, 40]  # 'o-...' and 'sku-...': worker 1
    assert skew_of(app, default, manifest) == [0, 0, 200, 40]

    choice = choose_layout(app, 4, default, snapshots)
    assert choice.source is LayoutSource.LEARNED and choice.before == [0, 0, 200, 40]
    assert choice.after == [60, 60, 60, 60]
    learned = choice.ranges

    kept = choose_layout(app, 4, learned, snapshots)  # the same keys under the learned layout
    assert kept.source is LayoutSource.KEPT and kept.ranges == learned

    fewer = choose_layout(app, 2, default, snapshots)  # another count: learned from the keys
    assert fewer.source is LayoutSource.LEARNED and fewer.after == [120, 120]
    assert choose_layout(app, 4, None, None).source is LayoutSource.NEW_APP

    restored = snapshots.restore()
    assert restored is not None
    engine = Engine(app, 4, ranges=learned)
    engine.load(restored.actors, restored.manifest.epoch, [])
    assert list(engine.store.actors.values()) == [60, 60, 60, 60]


def test_an_even_snapshot_keeps_the_layout_in_force(tmp_path: Path) -> None:
    default = KeyRanges.even(app, 4)
    snapshots, manifest = _snapshot(tmp_path / "first", default)
    learned = choose_layout(app, 4, default, snapshots).ranges
    snapshots, manifest = _snapshot(tmp_path / "second", learned)
    assert manifest.partition_actors == [60, 60, 60, 60]
    assert skew_of(app, learned, manifest) is None
    choice = choose_layout(app, 4, learned, snapshots)
    assert choice.source is LayoutSource.KEPT and choice.before == [60, 60, 60, 60]


def test_a_manifest_table_of_an_older_epochal_gains_the_layout_columns(tmp_path: Path) -> None:
    """Its old rows read back without a layout (the legacy one applies); new rows carry it."""
    columns = [f for f in _MANIFEST_SCHEMA if f.name not in ("points", "partition_actors")]
    snapshots = DeltaSnapshots(app, SnapshotConfig(str(tmp_path)), 2)
    uri = snapshots.warehouse.manifest
    DeltaTable.create(uri, pa.schema(columns))
    old = Manifest(1, 1, 1000, 5, {}, {}, {}, {}, "00", b"", 2, "h")
    write_deltalake(uri, _manifest_row(old).drop_columns(["points", "partition_actors"]),
                    mode="append")  # fmt: skip
    snapshots.ensure_tables("h")
    new = msgspec.structs.replace(old, ssid=2, points={"Stock": ["m"]}, partition_actors=[3, 4])
    write_deltalake(uri, _manifest_row(new), mode="append")
    assert snapshots.manifests() == [old, new]
    assert recorded_layout(app, old) is None
