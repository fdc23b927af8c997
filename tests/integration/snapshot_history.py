"""A warehouse of many small snapshots, built without a cluster (the engine and
:class:`DeltaSnapshots`, as ``test_snapshots.py`` does), and what the serial oracle says each
snapshot holds: shared by the history (Spark SQL) and snapshot-read (delta-rs) tests.

Accounts 0..39 open with 100 each and transfer at random; accounts 100..107 are opened (a
deposit of 0), closed (deleted) and opened again over the snapshots, so history has actors that
come, go and come back.
"""

from __future__ import annotations

import asyncio
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

from epochal.actors.engine import Engine
from epochal.actors.oracle import SerialOracle
from epochal.actors.snapshots import with_log_position
from epochal.config import SnapshotConfig
from epochal.recovery.snapshots import DeltaSnapshots
from epochal.schemas.canonical import decode_canonical
from epochal.schemas.commands import EpochRecord
from epochal.schemas.snapshots import Manifest, SnapshotPart
from tests.unit.actors.workload import Account, Close, Deposit, Transfer, app, command_log

__all__ = ["History", "build_history", "copy_history"]

SNAPSHOT_EVERY = 3
TEMPORARY = range(100, 108)


@dataclass
class History:
    """The snapshots taken, the epochs they cover, and the oracle's accounts at each of them.

    ``pending`` is one more snapshot's part, written but never committed (a committer that died
    before the manifest row): its files are in ``changes/``, no table names them yet.
    """

    snapshots: DeltaSnapshots
    records: list[EpochRecord]
    manifests: list[Manifest]
    accounts: dict[int, dict[int, Account]]  # ssid -> key -> the oracle's account
    pending: SnapshotPart

    @property
    def warehouse(self) -> str:
        return self.snapshots.config.warehouse

    @property
    def ssids(self) -> list[int]:
        return [m.ssid for m in self.manifests]


def _batches(epochs: int, seed: int) -> list[list[object]]:
    rng = random.Random(seed)
    batches: list[list[object]] = [[Deposit(a, 100) for a in range(40)]]
    for epoch in range(1, epochs):
        batch: list[object] = [
            Transfer(rng.randrange(40), rng.randrange(40), rng.randrange(1, 60)) for _ in range(20)
        ]
        for key in TEMPORARY:
            phase = (epoch + 2 * key) % 11
            if phase == 0:
                batch.append(Deposit(key, 0))  # opens it (or touches it again)
            elif phase == 6:
                batch.append(Close(key))  # deletes it (its balance is 0)
        batches.append(batch)
    return batches


def build_history(root: Path, snapshots_wanted: int, seed: int = 7) -> History:
    """``snapshots_wanted`` committed snapshots (every third epoch), and one more pending."""
    epochs = SNAPSHOT_EVERY * (snapshots_wanted + 1)
    records = command_log(_batches(epochs, seed), snapshot_every=SNAPSHOT_EVERY)
    config = SnapshotConfig(str(root / "warehouse"), keep=0)  # keep all: tests expire by hand
    snapshots = DeltaSnapshots(app, config, partitions=4)
    snapshots.ensure_tables(app.code_hash())
    manifests, pending = asyncio.run(_take(snapshots, records, snapshots_wanted))
    oracle, accounts = SerialOracle(app), {}
    ssids = {m.ssid for m in manifests}
    for record in records:
        oracle.run_epoch(record)
        if record.epoch in ssids:
            accounts[record.epoch] = {
                ref.key: decode_canonical(data, Account)
                for ref, data in oracle.state.items()
                if ref.actor_type == "Account"
            }
    return History(snapshots, records, manifests, accounts, pending)


async def _take(
    snapshots: DeltaSnapshots, records: list[EpochRecord], wanted: int
) -> tuple[list[Manifest], SnapshotPart]:
    engine, manifests, start = Engine(app, 4, snapshots=True), [], 0
    for position, record in enumerate(records):
        result = await engine.run_epoch(record)
        if result.changes is None:
            continue
        part = snapshots.write(record.epoch, 0, result.changes,
                               commands=records[start : record.epoch + 1])  # fmt: skip
        part = with_log_position(part, record, position + 1, engine.carried)
        if len(manifests) == wanted:
            return manifests, part
        manifests.append(snapshots.commit([part], record.epoch))
        start = record.epoch + 1
    raise AssertionError("the log ended before the pending snapshot")


def copy_history(history: History, root: Path) -> DeltaSnapshots:
    """The same tables in another warehouse, to change (expire, leave a commit unfinished)."""
    shutil.copytree(history.warehouse, root / "warehouse")
    copy = DeltaSnapshots(app, SnapshotConfig(str(root / "warehouse"), keep=0), partitions=4)
    copy.ensure_tables(app.code_hash())
    return copy
