"""A worker process: command log in, epochs executed, egress out exactly once.

The loop reads like the protocol: poll the command log (``read_committed``) → check that each
epoch follows the last one → execute it on this worker's partitions (exchanging reads and emits
with the other workers) → hand each partition's egress to its transactional writer → commit
egress every ``egress_interval_ms``, or sooner once a writer holds ``MAX_PENDING_EGRESS`` records
(a backlog of any size drains in bounded transactions).

A worker runs the layout (which partition owns which keys) the supervisor recorded with the
egress positions before the generation started, the same in every worker. It starts from the
latest complete snapshot (or the log's start, without one) and replays the command log after
it; a partition produces egress only for epochs after the position its writer last committed
(``log/egress.py``), so a restart never repeats an output. At the epochs
the sequencer marks, it hands its changed actors to :class:`_Snapshotting` (written off the loop,
committed by worker 0). In weak recovery the epochs come from the sequencer's feed instead of a
log, and egress (and the dead letters the feed carries, on partition 0) is held until the
snapshot that covers it commits. An epoch whose number does not follow the last one is
refused: two sequencers wrote the log. When the epoch just run emitted interior transactions
and no new epoch comes, worker 0 asks the sequencer for one (a *tick* on ``<app>.requests``),
so an idle input never strands them. Anything that is not a handler's exception (a lost peer,
Kafka failing, a bug) ends the process; the supervisor then rolls the whole cluster back to a
new generation (docs/concepts.md).
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import msgspec

from epochal.actors.api import App
from epochal.actors.egress import (
    DEAD_LETTER_PARTITION,
    MAX_PENDING_EGRESS,
    egress_records,
    held_dead_letters,
    layout_in_force,
    stage_egress,
)
from epochal.actors.engine import Engine, EpochResult, partitions_of
from epochal.actors.lifecycle import collect_less
from epochal.actors.outcome import Emitted
from epochal.actors.outcome_metrics import count_outcomes
from epochal.actors.partitioning import KeyRanges
from epochal.actors.plan import ensure_same_code
from epochal.actors.query_server import QueryServer, describe_query_metrics
from epochal.actors.snapshots import (
    SnapshotCommitter,
    Snapshots,
    SnapshotTaker,
    carried_of,
    with_log_position,
)
from epochal.actors.status_report import WorkerReport
from epochal.actors.store import Change
from epochal.actors.transport import CommittedFrame, PartFrame, Peers
from epochal.config import KafkaConfig, WorkerConfig
from epochal.errors import ConfigError, LogError
from epochal.log.amendments import Amendments, read_amendments
from epochal.log.client import KafkaClients
from epochal.log.command_log import EpochPoller, KafkaCommandLog, LoggedEpoch
from epochal.log.egress import EgressWriter, read_egress_state
from epochal.log.epoch_feed import EpochFeed, FeedClosed, FeedHello, stopping_soon
from epochal.log.membership import while_member, worker_member
from epochal.log.status import StatusPublisher
from epochal.metrics import Metrics, serve_metrics
from epochal.schemas.codec import encode
from epochal.schemas.commands import ClientRequest, EpochRecord, PartitionId
from epochal.schemas.snapshots import Manifest, OutboxRow, SnapshotPart
from epochal.schemas.status import ProcessState

__all__ = ["Worker"]

logger = logging.getLogger(__name__)

_POLL_CHUNKS = 16
"""Command-log records decoded per poll: a backlog is read a few epochs at a time (librdkafka
prefetches the rest), so a worker's memory does not grow with the backlog."""


class Worker:
    """``Worker(app, config, kafka, snapshots).run(should_stop)`` in a worker process.

    With ``snapshots`` (``recovery.snapshots.DeltaSnapshots``, say) the worker resumes from the
    latest complete snapshot and takes one at every epoch the sequencer marks; without, it
    replays the command log from its start.
    """

    def __init__(
        self, app: App, config: WorkerConfig, kafka: KafkaConfig, snapshots: Snapshots | None = None
    ) -> None:
        self.app = app
        self.config = config
        self.snapshots = snapshots
        self.clients = KafkaClients(kafka)
        self.code_hash = app.code_hash()  # reads source files: once, not per epoch
        self.amendments = Amendments()  # read at start: skipped transactions, re-coded epochs
        self.weak = bool(config.feed)  # weak recovery: epochs from the sequencer, egress held
        if self.weak and snapshots is None:
            raise ConfigError("weak recovery needs snapshots: they release its egress")
        self.metrics = Metrics(app=app.name, worker=str(config.worker))
        self.metrics.describe("epochal_transactions_total", "counter", "transactions by outcome")
        self.metrics.describe("epochal_aborts_total", "counter", "aborts by handler and reason")
        self.metrics.describe("epochal_epochs_total", "counter", "epochs executed")
        self.metrics.describe("epochal_epoch_seconds_sum", "counter", "time executing epochs")
        self.metrics.describe("epochal_command_log_position", "gauge", "last epoch executed")
        self.metrics.describe("epochal_snapshot_write_seconds_sum", "counter",
                              "time writing snapshot parts, off the loop")  # fmt: skip
        self.metrics.describe("epochal_snapshot_actors_total", "counter", "actors snapshotted")
        self.metrics.describe("epochal_snapshot_bytes_total", "counter", "bytes of change files")
        self.metrics.describe(
            "epochal_snapshots_total", "counter", "snapshots committed (worker 0)"
        )
        self.metrics.describe("epochal_snapshot_commit_seconds_sum", "counter",
                              "time committing snapshots (worker 0)")  # fmt: skip
        self.metrics.describe("epochal_snapshot_lag_epochs", "gauge",
                              "epochs since the last committed snapshot (worker 0)")  # fmt: skip
        self.metrics.describe("epochal_recovery_seconds", "gauge",
                              "start until caught up with the log: load, replay")  # fmt: skip
        self.metrics.describe("epochal_recovery_replayed_records", "gauge",
                              "command-log records replayed since the start")  # fmt: skip
        self.metrics.describe("epochal_recovery_remaining_records", "gauge",
                              "command-log records still to replay (0 once caught up)")  # fmt: skip
        self.metrics.describe("epochal_resume_seconds", "gauge", "time to load the snapshot")
        self.metrics.describe("epochal_partition_actors", "gauge", "actors each partition holds")
        self.metrics.describe(
            "epochal_partition_transactions_total",
            "counter",
            "transactions each partition took part in",
        )
        if config.query:
            describe_query_metrics(self.metrics)
        self.status: StatusPublisher | None = None  # started once the worker knows its layout
        self.report: WorkerReport | None = None

    def run(self, should_stop: Callable[[], bool]) -> None:
        if self.config.cpu is not None and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {self.config.cpu})
        if self.config.metrics_port:
            port = self.config.metrics_port + self.config.worker
            serve_metrics(self.metrics, port, f"worker {self.config.worker}")
        member = worker_member(self.clients, self.config, self.app.topics.command_log)
        collect_less()
        stopped = False
        try:
            try:
                import uvloop

                uvloop.run(while_member(member, self._run(should_stop)))
            except ImportError:  # uvloop is Linux/macOS only
                asyncio.run(while_member(member, self._run(should_stop)))
            stopped = True
        finally:
            if self.status is not None and self.report is not None:
                self.status.stop(self.report(ProcessState.STOPPED) if stopped else None)

    async def _run(self, should_stop: Callable[[], bool]) -> None:
        config = self.config
        peers = None
        if config.workers > 1:
            peers = Peers(config.worker, list(config.peers), config.generation,
                          failure_timeout_s=config.failure_timeout_ms / 1000)  # fmt: skip
        started = time.perf_counter()
        phases = _Phases()
        writers, ranges = await self._start_egress(phases)
        engine = Engine(self.app, config.partitions, config.worker, config.workers, peers,
                        track_digest=config.track_digest, snapshots=self.snapshots is not None,
                        queries=bool(config.query), ranges=ranges)  # fmt: skip
        resumed = await self._resume(engine)
        phases.done("snapshot")
        if peers is not None:
            peers.resumed = resumed.ssid if resumed else -1
        taking = _Snapshotting(self, engine, peers, writers) if self.snapshots is not None else None
        if taking is not None and resumed is not None:
            taking.committed_ssid = resumed.ssid
        queries = await self._serve_queries(engine)  # before peers connect: a taken port
        if peers is not None:  # ends the start with nothing to cancel
            await peers.start()
        progress = _Progress.after(resumed)
        self._report_status(ranges, engine.partitions, progress)
        poller, head = await self._epochs_from(progress, writers, resumed)
        phases.done("peers")
        recovery = _Recovery(self, progress.next, head, started, resumed, queries=queries)
        ticker = _InteriorTicker(self.clients, self.app, config)
        self._count_partitions(engine)
        logger.info("worker started worker=%d partitions=%s generation=%d from_epoch=%d "
                    "partition_actors=%s seconds=%s", config.worker, list(engine.partitions),
                    config.generation, progress.epoch, dict(engine.store.actors),
                    phases)  # fmt: skip
        try:
            while not should_stop():
                _check(peers, taking)
                epochs = await self._poll(poller, should_stop)
                for logged in epochs:
                    await self._epoch(engine, logged, writers, taking, progress)
                recovery.after_poll(progress.next, bool(epochs))
                # egress goes out on an interval, or at once when the log is read to its end
                # (nothing to batch it with, and waiting is all latency)
                due = (bool(epochs) and poller.drained) or (
                    time.monotonic() - progress.committed_at >= config.egress_interval_ms / 1000
                )
                if due and not self.weak:  # weak: egress goes out when a snapshot commits
                    await progress.commit(writers)
                ticker.after_poll(bool(epochs), progress.epoch - 1, bool(engine.carried))
                if progress.final is not None:
                    await _end_at_savepoint(peers, taking, progress.final)
                    break
            if not self.weak:
                await progress.commit(writers)
        finally:
            poller.close()
            ticker.close()
            await _close(taking, writers, peers, queries)

    def _report_status(
        self, ranges: KeyRanges, partitions: tuple[PartitionId, ...], progress: _Progress
    ) -> None:
        """Write this worker's status record every second, from a thread (``log/status.py``)."""
        report = WorkerReport(self.config, self.metrics, ranges, partitions, lambda: progress.epoch)
        self.status = StatusPublisher(self.clients, self.app.name, report)
        self.report = report
        self.status.start()

    async def _serve_queries(self, engine: Engine) -> QueryServer | None:
        """Start this worker's live query server, if the cluster serves queries."""
        config = self.config
        if not config.query:
            return None
        tls = None
        if config.query_tls:
            tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            tls.load_cert_chain(*config.query_tls)
        server = QueryServer(engine, list(config.query), config.generation,
                             token=config.query_token, tls=tls, metrics=self.metrics)  # fmt: skip
        await server.start()
        return server

    @staticmethod
    async def _poll(
        poller: EpochFeed | EpochPoller, should_stop: Callable[[], bool]
    ) -> list[LoggedEpoch]:
        """The next epochs; none if the sequencer closed its feed because the cluster stops
        (the same SIGTERM reaches this worker a moment later)."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(None, poller.poll, 0.05, _POLL_CHUNKS)
        except FeedClosed:
            if await loop.run_in_executor(None, stopping_soon, should_stop):
                return []
            raise

    async def _epoch(
        self,
        engine: Engine,
        logged: LoggedEpoch,
        writers: dict[PartitionId, EgressWriter],
        taking: _Snapshotting | None,
        progress: _Progress,
    ) -> None:
        """One epoch: check it follows → execute → stage egress → maybe snapshot."""
        progress.epoch = _follows(logged, progress.epoch)
        logged = self.amendments.amend(logged)
        if not self.weak and taking is not None:
            logged = await self._before_failed_epoch(logged, taking)
        if logged.record.final:
            progress.final = logged.record.epoch
        result = await self._execute(engine, logged)
        if taking is not None:
            taking.archive(logged.record)
        if self.weak:
            assert taking is not None, "weak recovery takes snapshots"
            taking.hold(logged, result)
        else:
            stage_egress(self.app, writers, logged, result)
        progress.next = logged.position + 1
        snapshot = result.changes if taking is not None else None
        full = any(w.pending >= MAX_PENDING_EGRESS for w in writers.values())
        if not self.weak and (snapshot is not None or full):
            await progress.commit(writers)  # a snapshot's egress is out before it exists
        if snapshot is not None and taking is not None:
            taking.take(logged, snapshot, engine.carried)

    async def _before_failed_epoch(self, logged: LoggedEpoch, taking: _Snapshotting) -> LoggedEpoch:
        """The last generation failed at epoch E (``snapshot_before``): snapshot the epoch
        before it, and run E only once that snapshot is committed, so that the last good state
        survives a crash loop and a fixed version resumes from it (docs/operations.md)."""
        failed, epoch = self.config.snapshot_before, logged.record.epoch
        if failed < 0 or taking.committed_ssid >= failed - 1 or epoch < failed - 1:
            return logged
        if epoch == failed - 1:
            record = msgspec.structs.replace(logged.record, snapshot=True)
            return LoggedEpoch(logged.position, record, logged.dead)
        while taking.committed_ssid < failed - 1:  # epoch E: wait for the snapshot before it
            taking.check()
            await asyncio.sleep(0.01)
        return logged

    async def _resume(self, engine: Engine) -> Manifest | None:
        """Load the latest complete snapshot into ``engine`` (worker 0 makes sure the tables
        exist first); None if there is none (or no snapshots): replay from the start."""
        if self.snapshots is None:
            return None
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        if self.config.worker == 0:
            await loop.run_in_executor(None, self.snapshots.ensure_tables, self.code_hash)
        restored = await loop.run_in_executor(None, self.snapshots.restore)
        if restored is None:
            return None
        manifest = restored.manifest
        mode = "weak" if self.weak else "strong"
        if manifest.recovery != mode:
            raise ConfigError(
                f"the app's latest snapshot was taken in {manifest.recovery} recovery mode; "
                f"running it in {mode} mode would misread its positions (start a new app, or "
                "keep the mode)", ssid=manifest.ssid,
            )  # fmt: skip
        engine.load(restored.actors, manifest.epoch, carried_of(manifest), restored.migrations)
        self.metrics.set("epochal_resume_seconds", time.perf_counter() - started)
        logger.info("resumed from snapshot ssid=%d actors=%s seconds=%.2f", manifest.ssid,
                    manifest.actors, time.perf_counter() - started)  # fmt: skip
        return manifest

    async def _start_egress(
        self, phases: _Phases
    ) -> tuple[dict[PartitionId, EgressWriter], KeyRanges]:
        """Open this worker's egress writers, learn where each resumes and, in strong mode,
        read the operator's amendments; each step timed for the start line."""
        config = self.config
        loop = asyncio.get_running_loop()
        mine = partitions_of(config.worker, config.partitions, config.workers)
        # off the loop: fencing the last generation's producers waits for the broker to abort
        # their open transactions, and a loop blocked past the failure bound leaves the group
        writers = await loop.run_in_executor(None, self._open_egress, mine)
        phases.done("fence")
        ranges = await loop.run_in_executor(None, self._egress_positions, writers)
        phases.done("positions")
        if not self.weak:  # weak mode has no command log to amend
            self.amendments = await loop.run_in_executor(
                None, read_amendments, self.clients, self.app.name
            )
            phases.done("amendments")
        return writers, ranges

    def _open_egress(self, partitions: tuple[PartitionId, ...]) -> dict[PartitionId, EgressWriter]:
        """Open (and so fence) this worker's egress writers."""
        config = self.config

        def open_writer(partition: PartitionId) -> EgressWriter:
            return EgressWriter(self.clients, self.app.name, partition, config.partitions,
                                config.transaction_timeout_ms)  # fmt: skip

        # at once: each writer's fencing waits on the broker (after a kill, for it to abort
        # the dead incarnation's open transaction), and a rollback waits on the slowest
        with ThreadPoolExecutor(max(1, len(partitions)), "egress-open") as pool:
            return dict(zip(partitions, pool.map(open_writer, partitions), strict=True))

    def _egress_positions(self, writers: dict[PartitionId, EgressWriter]) -> KeyRanges:
        """Once every writer is open: where each resumes, and the layout the cluster runs (the
        supervisor recorded it before the workers started)."""
        config = self.config
        state = read_egress_state(self.clients, self.app.name)
        if state.layout is None or state.layout.partitions != config.partitions:
            raise ConfigError(
                "the egress layout differs from this worker's partition count: start the "
                "cluster with `epochal run`, which moves egress to a new count first",
                partitions=config.partitions,
                layout=state.layout.partitions if state.layout else None,
            )
        for partition, writer in writers.items():
            writer.covered = state.start(partition)
        ranges = layout_in_force(self.app, state)
        assert ranges is not None, "a layout is recorded"
        return ranges

    def _count_partitions(self, engine: Engine) -> None:
        """Each partition's share: the actors it holds, the transactions it took part in."""
        for partition, count in engine.store.actors.items():
            self.metrics.set("epochal_partition_actors", count, partition=str(partition))
        for partition, count in engine.ran.items():
            self.metrics.set(
                "epochal_partition_transactions_total", count, partition=str(partition)
            )

    async def _epochs_from(
        self, progress: _Progress, writers: dict[PartitionId, EgressWriter],
        resumed: Manifest | None,
    ) -> tuple[EpochFeed | EpochPoller, int]:  # fmt: skip
        """Where epochs come from, and the log's end now (what recovery replays up to): the
        command log after the snapshot, or (weak mode) the sequencer's feed, once the egress
        the snapshot held is out."""
        loop = asyncio.get_running_loop()
        if self.weak:
            await self._release_held(writers, resumed)
            return await loop.run_in_executor(None, self._feed, resumed), 0
        log = self.app.topics.command_log
        head = await loop.run_in_executor(None, self.clients.end_offset, log)
        return KafkaCommandLog(self.clients, log).poller(progress.next), head

    def _feed(self, resumed: Manifest | None) -> EpochFeed:
        """Weak mode: connect to the sequencer, saying where this worker resumed."""
        config = self.config
        hello = FeedHello(config.generation, config.worker, -1, 0, 0, {})
        if resumed is not None:
            hello = FeedHello(config.generation, config.worker, resumed.ssid, resumed.epoch + 1,
                              resumed.time_ms, dict(resumed.input_positions))  # fmt: skip
        return EpochFeed(config.feed, hello, connect_timeout_s=config.failure_timeout_ms / 1000 * 5)

    async def _release_held(
        self, writers: dict[PartitionId, EgressWriter], resumed: Manifest | None
    ) -> None:
        """Weak mode: the egress and dead letters a committed snapshot held that a crash kept
        from going out."""
        if resumed is None or self.snapshots is None:
            return
        snapshots = self.snapshots
        owed = [p for p, w in writers.items() if w.covered <= resumed.ssid]
        if not owed:
            return
        start = min(writers[p].covered for p in owed)
        loop = asyncio.get_running_loop()
        rows = await loop.run_in_executor(None, snapshots.outbox, resumed, owed, start)
        for row in rows:
            writer = writers[PartitionId(row.partition)]
            if row.epoch >= writer.covered:
                writer.add(row.topic, row.value, row.key)
        await loop.run_in_executor(None, _commit_all, {p: writers[p] for p in owed},
                                   resumed.ssid + 1)  # fmt: skip
        logger.info("held egress released after a restart ssid=%d records=%d partitions=%s",
                    resumed.ssid, len(rows), owed)  # fmt: skip

    async def _execute(self, engine: Engine, logged: LoggedEpoch) -> EpochResult:
        record = logged.record
        ensure_same_code(record, self.code_hash, self.config.allow_code_change)
        started = time.perf_counter()
        result = await engine.run_epoch(record)
        self.metrics.inc("epochal_epochs_total")
        self.metrics.inc("epochal_epoch_seconds_sum", time.perf_counter() - started)
        self.metrics.set("epochal_command_log_position", logged.position)
        self._count_partitions(engine)
        count_outcomes(self.metrics, result.outcomes)
        return result


class _Phases:
    """Seconds of each step of a worker's start, for its ``worker started`` line: where a
    rollback's time goes. ``fence``: the egress writers opened, which fences the last
    generation's; ``positions``: where each resumes read; ``amendments``: the operator's
    amendments read (strong mode); ``snapshot``: the latest loaded; ``peers``: the
    other workers connected, the command log or epoch feed opened."""

    def __init__(self) -> None:
        self._last = time.perf_counter()
        self._seconds: dict[str, float] = {}

    def done(self, phase: str) -> None:
        now = time.perf_counter()
        self._seconds[phase], self._last = now - self._last, now

    def __str__(self) -> str:
        return ",".join(f"{phase}:{s:.2f}" for phase, s in self._seconds.items())


async def _close(
    taking: _Snapshotting | None, writers: dict[PartitionId, EgressWriter], peers: Peers | None,
    queries: QueryServer | None,
) -> None:  # fmt: skip
    """Stop what a worker started, its query server first."""
    if queries is not None:
        await queries.close()
    if taking is not None:
        await asyncio.get_running_loop().run_in_executor(None, taking.close)
    for writer in writers.values():
        writer.close()
    if peers is not None:
        await peers.close()


def _commit_all(writers: dict[PartitionId, EgressWriter], next_position: int) -> None:
    for writer in writers.values():
        writer.commit(next_position)


@dataclass
class _Progress:
    """Where this worker stands in the command log."""

    next: int  # the command-log position after the last epoch executed
    epoch: int  # the epoch that must come next
    committed_at: float = field(default_factory=time.monotonic)  # egress last committed
    final: int | None = None  # the final epoch of a clean stop, once executed

    @classmethod
    def after(cls, resumed: Manifest | None) -> _Progress:
        if resumed is None:
            return cls(0, 0)
        return cls(resumed.command_log_position, resumed.epoch + 1)

    async def commit(self, writers: dict[PartitionId, EgressWriter]) -> None:
        """Release every partition's staged egress up to here (off the loop: Kafka waits)."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, _commit_all, writers, self.next)
        self.committed_at = time.monotonic()


class _Recovery:
    """A (re)started worker until it has replayed the command log as far as it reached at the
    start (or the log goes idle): how much is left, and how long catching up took."""

    def __init__(
        self, worker: Worker, start: int, head: int, started: float, resumed: Manifest | None,
        *, queries: QueryServer | None = None,
    ) -> None:  # fmt: skip
        self.metrics = worker.metrics
        self.queries = queries  # answers once caught up
        self.worker = worker.config.worker
        self.start = start
        self.head = head  # the log's end at the start: a transaction marker follows the last epoch
        self.started = started
        self.ssid = resumed.ssid if resumed else -1
        self.done = False
        self._logged = started
        self.metrics.set("epochal_recovery_remaining_records", max(0, head - 1 - start))

    def after_poll(self, next_position: int, got_epochs: bool) -> None:
        if self.done:
            return
        self.metrics.set("epochal_recovery_replayed_records", next_position - self.start)
        self.metrics.set(
            "epochal_recovery_remaining_records", max(0, self.head - 1 - next_position)
        )
        if got_epochs and next_position < self.head - 1:
            now = time.perf_counter()
            if now - self._logged >= 2.0:  # a long replay says how far it is
                self._logged = now
                logger.info("recovering worker=%d replayed_records=%d of=%d", self.worker,
                            next_position - self.start, self.head - 1 - self.start)  # fmt: skip
            return
        self.done = True
        if self.queries is not None:
            self.queries.ready = True
        seconds = time.perf_counter() - self.started
        self.metrics.set("epochal_recovery_seconds", seconds)
        self.metrics.set("epochal_recovery_remaining_records", 0)
        logger.info("recovered worker=%d from_ssid=%d from_position=%d replayed_records=%d "
                    "seconds=%.3f", self.worker, self.ssid, self.start,
                    next_position - self.start, seconds)  # fmt: skip


async def _end_at_savepoint(peers: Peers | None, taking: _Snapshotting | None, final: int) -> None:
    """The sequencer's final epoch ran: wait until its snapshot is committed (worker 0 commits
    it and tells the others) and, in weak mode, the egress it held is released; then the
    worker stops, and a start after it replays nothing. The supervisor bounds the wait.
    Once that snapshot is committed a peer may stop before this worker has released its
    egress: a peer gone then is no failure."""
    while taking is not None and (taking.committed_ssid < final or taking.busy):
        _check(peers if taking.committed_ssid < final else None, taking)
        await asyncio.sleep(0.01)
    logger.info("worker stops at a savepoint epoch=%d", final)


def _check(peers: Peers | None, taking: _Snapshotting | None) -> None:
    """Fail now if a peer was lost (even while idle) or a snapshot thread failed."""
    if peers is not None and peers.failed.done():
        peers.failed.result()
    if taking is not None:
        taking.check()


def _follows(logged: LoggedEpoch, expected: int) -> int:
    """The epoch after ``logged``, if ``logged`` is the epoch expected; else refuse it."""
    if logged.record.epoch != expected:
        raise LogError(
            "the command log holds an epoch out of sequence (did two sequencers write it?)",
            epoch=logged.record.epoch, expected=expected, offset=logged.position,
        )  # fmt: skip
    return expected + 1


class _InteriorTicker:
    """Asks the sequencer for an epoch when interior transactions wait and the input is idle.

    Interior transactions emitted in epoch e run at the start of e+1; the sequencer logs an
    epoch only when something arrives. Worker 0 (every worker derives the same pending set)
    sends one tick per epoch: a request with an empty handler name, which the sequencer turns
    into an epoch without transactions.
    """

    def __init__(self, clients: KafkaClients, app: App, config: WorkerConfig) -> None:
        self.enabled = config.worker == 0
        self.after_s = config.interior_tick_ms / 1000
        self.topic = app.topics.requests
        self.clients = clients
        self._producer: Any = None
        self._last_epoch_at = time.monotonic()
        self._ticked: int | None = None

    def after_poll(self, got_epochs: bool, last_epoch: int, pending: bool) -> None:
        now = time.monotonic()
        if got_epochs:
            self._last_epoch_at = now
        if not (self.enabled and pending) or self._ticked == last_epoch:
            return
        if now - self._last_epoch_at < self.after_s:
            return
        if self._producer is None:
            self._producer = self.clients.producer(**{"enable.idempotence": True})
        self._producer.produce(self.topic, encode(ClientRequest.tick(last_epoch)))
        self._producer.flush(10)
        self._ticked = last_epoch

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(5)


class _Snapshotting:
    """This worker's side of snapshots: hand each cut to the writer thread, with the epochs
    since the last one and what this worker's transactions did in them (it archives the
    transactions it reported, with their outcomes, in ``commands``); on worker 0, also collect
    every worker's part and commit (others send theirs over TCP). In weak mode, egress and dead
    letters are held here until the snapshot that covers them commits, then released."""

    def __init__(
        self,
        worker: Worker,
        engine: Engine,
        peers: Peers | None,
        writers: dict[PartitionId, EgressWriter],
    ) -> None:
        assert worker.snapshots is not None
        self.worker = worker
        self.engine = engine
        self.peers = peers
        self.writers = writers
        self.metrics = worker.metrics
        self.committer: SnapshotCommitter | None = None
        if worker.config.worker == 0:
            self.committer = SnapshotCommitter(worker.snapshots, worker.config.workers,
                                               self._committed)  # fmt: skip
            engine.on_part = self.committer.receive
        engine.on_committed = self.release
        self.taker = SnapshotTaker(worker.snapshots, worker.config.worker, self._written)
        self.last_epoch = 0
        self._epochs: list[EpochRecord] = []  # the epochs since the last snapshot
        self._held: list[OutboxRow] = []  # weak mode: egress since the last snapshot
        self._holding: dict[int, list[OutboxRow]] = {}  # weak mode: per snapshot, until commit
        self._releasing = asyncio.Lock()
        self._tasks: set[asyncio.Future[None]] = set()
        self._error: BaseException | None = None
        self.committed_ssid = -1  # the latest snapshot known committed (worker 0 tells)

    @property
    def busy(self) -> bool:
        """Frames or held egress still going out."""
        return bool(self._tasks)

    def archive(self, record: EpochRecord) -> None:
        self._epochs.append(record)

    def hold(self, logged: LoggedEpoch, result: EpochResult) -> None:
        """Weak mode: this epoch's dead letters (on the worker of their partition) and egress
        wait for the snapshot that covers it."""
        app, epoch = self.worker.app, logged.record.epoch
        if DEAD_LETTER_PARTITION in self.writers:
            self._held += held_dead_letters(app, epoch, logged.dead)
        for partition, outcomes in result.by_partition.items():
            for outcome in outcomes:
                for topic, value in egress_records(app, outcome):
                    self._held.append(OutboxRow(epoch, partition, topic, value))

    def take(self, logged: LoggedEpoch, changes: Sequence[Change], carried: list[Emitted]) -> None:
        record, position = logged.record, logged.position + 1
        self.last_epoch = record.epoch
        archived, self._epochs = self._epochs, []
        outbox, self._held = self._held, []
        reported = self.engine.take_reported()
        if self.worker.weak:
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
            for peer in range(self.worker.config.workers):
                if peer != self.worker.config.worker:
                    self.peers.send(peer, CommittedFrame(self.peers.generation, manifest.ssid))
            self._spawn(self.peers.flush())
        self.release(manifest.ssid)

    def release(self, ssid: int) -> None:
        """Snapshot ``ssid`` committed: in weak mode, what it (and any before) held goes out,
        in one Kafka transaction per partition, recording ``ssid + 1`` as released."""
        self.committed_ssid = max(self.committed_ssid, ssid)
        if not self.worker.weak:
            return
        ready = sorted(s for s in self._holding if s <= ssid)
        rows = [row for s in ready for row in self._holding.pop(s)]
        self._spawn(self._release(rows, ssid))

    async def _release(self, rows: list[OutboxRow], ssid: int) -> None:
        async with self._releasing:
            for row in rows:
                self.writers[PartitionId(row.partition)].add(row.topic, row.value, row.key)
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, _commit_all, self.writers, ssid + 1)

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
