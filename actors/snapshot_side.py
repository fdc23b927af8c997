"""A worker's side of snapshots: each cut handed to the writer thread with the epochs since
the last one, worker 0's committer, and in weak recovery the egress held until the snapshot
that covers it commits."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Mapping, Sequence

import msgspec

from epochal.actors.api import App
from epochal.actors.egress import DEAD_LETTER_PARTITION, EgressEncoder, held_dead_letters
from epochal.actors.egress_release import EgressRelease
from epochal.actors.engine import Engine
from epochal.actors.outcome import Emitted, TxnOutcome
from epochal.actors.snapshots import SnapshotCommitter, Snapshots, SnapshotTaker, with_log_position
from epochal.actors.store import Change
from epochal.actors.transport import CommittedFrame, PartFrame, Peers
from epochal.config import WorkerConfig
from epochal.log.command_log import LoggedEpoch
from epochal.log.egress import EgressWriter, commit_all
from epochal.metrics import Metrics
from epochal.schemas.commands import PartitionId
from epochal.schemas.snapshots import Manifest, OutboxRow, SnapshotPart

__all__ = ["SnapshotSide"]

logger = logging.getLogger(__name__)


class SnapshotSide:
    """This worker's side of snapshots: hand each cut to the writer thread, with the epochs
    since the last one and what this worker's transactions did in them (it archives the
    transactions it reported, with their outcomes, in ``commands``); on worker 0, also collect
    every worker's part and commit (others send theirs over TCP). In weak mode, egress and dead
    letters are held here until the snapshot that covers them commits, then released."""

    def __init__(
        self,
        app: App,
        config: WorkerConfig,
        snapshots: Snapshots,
        *,
        metrics: Metrics,
        engine: Engine,
        peers: Peers | None,
        writers: dict[PartitionId, EgressWriter],
        weak: bool,
    ) -> None:
        self.app = app
        self.config = config
        self.weak = weak
        self.engine = engine
        self.peers = peers
        self.writers = writers
        self.metrics = metrics
        self.committer: SnapshotCommitter | None = None
        if config.worker == 0:
            self.committer = SnapshotCommitter(snapshots, config.workers, self._committed)
            engine.on_part = self.committer.receive
        engine.on_committed = self.release
        self.taker = SnapshotTaker(snapshots, config.worker, self._written)
        self.last_epoch = 0
        self._epochs: list[msgspec.Raw] = []  # the epochs since the last snapshot, as msgpack
        self._held: list[OutboxRow] = []  # weak mode: egress since the last snapshot
        self._holding: dict[int, list[OutboxRow]] = {}  # weak mode: per snapshot, until commit
        self._releasing = asyncio.Lock()
        self._tasks: set[asyncio.Future[None]] = set()
        self._error: BaseException | None = None
        self.committed_ssid = -1  # the latest snapshot known committed (worker 0 tells)
        self.egress: EgressRelease | None = None  # strong mode: parts wait for their egress
        self._owed: deque[int] = deque()  # per part being written: the position it covers
        self._written_parts: deque[tuple[SnapshotPart, float]] = deque()  # waiting for egress

    def wait_for_egress(self, release: EgressRelease) -> None:
        """Strong mode: hand each written part on only once ``release`` has committed the
        egress of the epochs it covers: a committed snapshot never holds state whose egress
        is not out, so a start may read any committed snapshot while it fences the writers."""
        self.egress = release
        release.on_released.append(lambda position: self._hand_on())

    @property
    def busy(self) -> bool:
        """Frames or held egress still going out."""
        return bool(self._tasks)

    def archive(self, logged: LoggedEpoch) -> None:
        """Keep the epoch for the next snapshot's ``commands`` rows, as the bytes it was
        logged as: the snapshot process decodes them."""
        self._epochs.append(logged.msgpack())

    def hold_dead_letters(self, logged: LoggedEpoch) -> None:
        """Weak mode: this epoch's dead letters (on the worker of their partition) wait for the
        snapshot that covers it, before its egress."""
        if DEAD_LETTER_PARTITION in self.writers:
            self._held += held_dead_letters(self.app, logged.record.epoch, logged.dead)

    def hold(self, epoch: int, reported: Mapping[PartitionId, Sequence[TxnOutcome]]) -> None:
        """Weak mode: the egress of outcomes of ``epoch`` (a slice of them, as the engine
        reports them) waits for the snapshot that covers it."""
        records = EgressEncoder(self.app).records
        for partition, outcomes in reported.items():
            for outcome in outcomes:
                for topic, value in records(outcome):
                    self._held.append(OutboxRow(epoch, partition, topic, value))

    async def room(self) -> None:
        """Wait until the snapshot process can take another part (:meth:`SnapshotTaker.room`)."""
        await self.taker.room()

    def take(self, logged: LoggedEpoch, changes: Sequence[Change], carried: list[Emitted]) -> None:
        record, position = logged.record, logged.position + 1
        self.last_epoch = record.epoch
        self._owed.append(position)
        archived, self._epochs = self._epochs, []
        outbox, self._held = self._held, []
        reported = self.engine.take_reported()
        if self.weak:
            self._holding[record.epoch] = outbox
        shares = {int(p): n for p, n in self.engine.store.actors.items()}
        if self.committer is not None:
            points = self.engine.ranges.recorded()

            def head(part: SnapshotPart) -> SnapshotPart:
                part = with_log_position(part, record, position, carried)
                return msgspec.structs.replace(part, partition_actors=shares, points=points)

            self.taker.take(record.epoch, changes, head, archived=archived, outbox=outbox,
                            reported=reported)  # fmt: skip
        else:

            def share(part: SnapshotPart) -> SnapshotPart:
                return msgspec.structs.replace(part, partition_actors=shares)

            self.taker.take(record.epoch, changes, share, archived=archived, outbox=outbox,
                            reported=reported)  # fmt: skip

    def _written(self, part: SnapshotPart, seconds: float) -> None:
        self._written_parts.append((part, seconds))
        self._hand_on()

    def _hand_on(self) -> None:
        """Hand on the parts written whose egress is out, in the order they were taken."""
        while self._written_parts and (
            self.egress is None or self.egress.released >= self._owed[0]
        ):
            self._owed.popleft()
            self._deliver(*self._written_parts.popleft())

    def _deliver(self, part: SnapshotPart, seconds: float) -> None:
        self.metrics.inc("epochal_snapshot_write_seconds_sum", seconds)
        self.metrics.inc("epochal_snapshot_actors_total", part.changed)
        self.metrics.inc("epochal_snapshot_bytes_total", sum(f.size for f in part.files))
        if self.committer is not None:
            self.committer.receive(part)
        elif self.peers is not None:
            self.peers.send(0, PartFrame(self.peers.generation, part))
            self._spawn(self.peers.flush())

    def _committed(self, manifest: Manifest, seconds: float) -> None:
        self.metrics.inc("epochal_snapshots_total")
        self.metrics.inc("epochal_snapshot_commit_seconds_sum", seconds)
        self.metrics.set("epochal_snapshot_lag_epochs", self.last_epoch - manifest.ssid)
        logger.info("snapshot committed ssid=%d actors=%s seconds=%.2f", manifest.ssid,
                    manifest.actors, seconds)  # fmt: skip
        if self.peers is not None:  # weak mode releases egress then; a stop ends at it
            for peer in range(self.config.workers):
                if peer != self.config.worker:
                    self.peers.send(peer, CommittedFrame(self.peers.generation, manifest.ssid))
            self._spawn(self.peers.flush())
        self.release(manifest.ssid)

    def release(self, ssid: int) -> None:
        """Snapshot ``ssid`` committed: in weak mode, what it (and any before) held goes out,
        in one Kafka transaction per partition, recording ``ssid + 1`` as released."""
        self.committed_ssid = max(self.committed_ssid, ssid)
        if not self.weak:
            return
        ready = sorted(s for s in self._holding if s <= ssid)
        rows = [row for s in ready for row in self._holding.pop(s)]
        self._spawn(self._release(rows, ssid))

    async def _release(self, rows: list[OutboxRow], ssid: int) -> None:
        async with self._releasing:
            for row in rows:
                self.writers[PartitionId(row.partition)].add(row.topic, row.value, row.key)
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, commit_all, self.writers, ssid + 1)

    def _spawn(self, awaitable: Awaitable[None]) -> None:
        task = asyncio.ensure_future(awaitable)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Future[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._error = self._error or task.exception()

    def check(self) -> None:
        if self._error is not None:
            raise self._error
        self.taker.check()
        if self.committer is not None:
            self.committer.check()

    def close(self) -> None:
        self.taker.close()
        if self.committer is not None:
            self.committer.close()
