"""Egress released off the epoch loop: the loop stages the next epochs while a commit waits on
the broker, each record goes out once and in order, a failed commit fails the worker, and a
snapshot part is handed on only once the egress of its epochs is out."""

from __future__ import annotations

import asyncio
import threading

import pytest

from epochal.actors.egress_release import EgressRelease
from epochal.actors.engine import Engine
from epochal.actors.snapshot_side import SnapshotSide
from epochal.config import WorkerConfig
from epochal.errors import LogError
from epochal.log.command_log import LoggedEpoch
from epochal.log.egress import Staged
from epochal.metrics import Metrics
from epochal.schemas.commands import EpochRecord, PartitionId
from examples.bank.app import app
from tests.unit.actors.snapshot_twins import SlowSnapshots


class _SlowWriter:
    """An egress writer's twin: each commit waits for ``go`` (a broker slow to answer), then
    records the values it wrote and the position it covers, or fails."""

    def __init__(self, fails: bool = False) -> None:
        self.go = threading.Event()
        self.fails = fails
        self.covered = 0
        self.commits: list[tuple[list[bytes], int]] = []
        self._pending: list[Staged] = []

    def add(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        self._pending.append((topic, value, key))

    def take(self) -> list[Staged]:
        batch, self._pending = self._pending, []
        return batch

    def commit_batch(self, batch: list[Staged], next_position: int) -> None:
        assert self.go.wait(10)
        if self.fails:
            raise LogError("egress commit failed", transactional_id="twin")
        self.commits.append(([value for _, value, _ in batch], next_position))
        self.covered = next_position


def _release(*writers: _SlowWriter, metrics: Metrics | None = None) -> EgressRelease:
    return EgressRelease({PartitionId(p): w for p, w in enumerate(writers)}, metrics)  # type: ignore[misc]


def test_the_loop_stages_the_next_epochs_while_a_commit_waits_on_the_broker() -> None:
    first, second = _SlowWriter(), _SlowWriter()
    metrics = Metrics(app="bank")

    async def main() -> None:
        release = _release(first, second, metrics=metrics)
        first.add("bank.out.receipts", b"a")
        release.up_to(1)  # returns at once: the commit waits on a thread
        first.add("bank.out.receipts", b"b")
        second.add("bank.out.receipts", b"c")
        release.up_to(2)  # asked while the first is in flight: the next one
        await asyncio.sleep(0.05)
        assert release.released == 0
        first.go.set()
        second.go.set()
        await asyncio.wait_for(release.through(2), 5)
        assert release.released == 2

    asyncio.run(main())
    assert first.commits == [([b"a"], 1), ([b"b"], 2)]
    assert second.commits == [([], 1), ([b"c"], 2)]
    served = metrics.render()
    assert 'epochal_egress_commits_total{app="bank"} 2' in served
    seconds = float(served.split('epochal_egress_commit_seconds_sum{app="bank"} ')[1].split()[0])
    assert seconds >= 0.05  # the first commit waited on the broker at least that long


def test_a_failed_commit_fails_the_worker_and_every_wait_for_it() -> None:
    broken = _SlowWriter(fails=True)
    broken.go.set()

    async def main() -> None:
        release = _release(broken)
        broken.add("bank.out.receipts", b"a")
        with pytest.raises(LogError, match="egress commit failed"):
            await asyncio.wait_for(release.through(1), 5)
        with pytest.raises(LogError):
            release.check()
        with pytest.raises(LogError):
            release.up_to(2)

    asyncio.run(main())


def test_a_snapshot_is_committed_only_once_the_egress_of_its_epochs_is_out() -> None:
    """A start reads the latest committed snapshot while it fences the egress writers, and
    replays only what comes after it: a snapshot committed before its egress was out would
    lose that egress for good."""
    writer = _SlowWriter()
    snapshots = SlowSnapshots()
    snapshots.go.set()  # parts are written at once

    async def main() -> None:
        release = _release(writer)
        side = SnapshotSide(app, WorkerConfig(app.name, partitions=2), snapshots,  # type: ignore[arg-type]
                            metrics=Metrics(), engine=Engine(app, 2), peers=None, writers={},
                            weak=False)  # fmt: skip
        side.wait_for_egress(release)
        writer.add("bank.out.receipts", b"a")
        release.up_to(8)
        side.take(LoggedEpoch(7, EpochRecord(3, 0, 0, "x", snapshot=True)), [], [])
        await asyncio.sleep(0.3)  # the part is written at once; its egress still waits
        assert snapshots.committed == []
        writer.go.set()
        for _ in range(500):
            if snapshots.committed:
                break
            await asyncio.sleep(0.01)
        side.close()

    asyncio.run(main())
    assert snapshots.committed == [3]
    assert writer.commits == [([b"a"], 8)]
