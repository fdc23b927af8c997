"""A worker process: command log in, epochs executed, egress out exactly once.

The loop reads like the protocol: poll the command log (``read_committed``) → check that each
epoch follows the last one → execute it on this worker's partitions (exchanging reads and emits
with the other workers) → hand each partition's egress to its transactional writer → release
egress every ``egress_interval_ms`` (at once when the log is read to its end), or sooner once a
writer holds ``MAX_PENDING_EGRESS`` records (a backlog of any size drains in bounded
transactions). Egress commits run off the loop, one at a time (:class:`EgressRelease`): the loop
executes the next epochs while the broker commits.

A worker runs the layout (which partition owns which keys) the supervisor recorded with the
egress positions before the generation started, the same in every worker. It starts from the
latest complete snapshot (or the log's start, without one) and replays the command log after
it; a partition produces egress only for epochs after the position its writer last committed
(``log/egress.py``), so a restart never repeats an output. At the epochs
the sequencer marks, it hands its changed actors to :class:`SnapshotSide` (written off the loop,
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
import functools
import logging
import os
import ssl
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor

import msgspec

from epochal.actors.api import App
from epochal.actors.egress import (
    MAX_PENDING_EGRESS,
    EpochEgress,
    layout_in_force,
)
from epochal.actors.egress_release import EgressRelease
from epochal.actors.engine import Engine, EpochResult, OnReported, partitions_of
from epochal.actors.interior_ticker import InteriorTicker
from epochal.actors.lifecycle import collect_less
from epochal.actors.outcome import TxnOutcome
from epochal.actors.outcome_metrics import count_outcomes
from epochal.actors.partitioning import KeyRanges
from epochal.actors.plan import ensure_same_code
from epochal.actors.query_server import QueryServer, describe_query_metrics
from epochal.actors.snapshot_process import ForkedSnapshots
from epochal.actors.snapshot_side import SnapshotSide
from epochal.actors.snapshots import Restored, Snapshots, carried_of
from epochal.actors.status_report import WorkerReport
from epochal.actors.transport import Peers
from epochal.actors.worker_progress import CatchUp, Progress, StartPhases
from epochal.config import KafkaConfig, WorkerConfig
from epochal.errors import ConfigError, LogError
from epochal.log.amendments import Amendments, read_amendments
from epochal.log.client import KafkaClients
from epochal.log.command_log import EpochPoller, KafkaCommandLog, LoggedEpoch
from epochal.log.egress import EgressWriter, commit_all, read_egress_state
from epochal.log.epoch_feed import EpochFeed, FeedClosed, FeedHello, stopping_soon
from epochal.log.membership import while_member, worker_member
from epochal.log.status import StatusPublisher
from epochal.metrics import Metrics, serve_metrics
from epochal.schemas.commands import PartitionId
from epochal.schemas.snapshots import Manifest
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
        self.weak = bool(config.feed)  # weak recovery: epochs from the sequencer, egress held
        # what the start waits on the broker and the warehouse for begins now, in threads, while
        # the rest starts: fencing the last generation's egress writers (after a kill, half a
        # second for the broker to abort their open transactions), reading the operator's
        # amendments (skipped transactions, re-coded epochs) and, in strong mode, the latest
        # snapshot (see _egress_and_snapshot; weak mode has no command log to amend either)
        starting = ThreadPoolExecutor(3, "worker-start")
        mine = partitions_of(config.worker, config.partitions, config.workers)
        self._egress_opened = starting.submit(self._open_egress, mine)
        self._amendments_read = (
            None if self.weak else starting.submit(read_amendments, self.clients, app.name)
        )
        self.amendments = Amendments()  # until they are read
        self.code_hash = app.code_hash()  # reads source files: once, not per epoch
        self._snapshot_read = None if self.weak else starting.submit(self._read_snapshot)
        starting.shutdown(wait=False)
        if self.weak and snapshots is None:
            raise ConfigError("weak recovery needs snapshots: they release its egress")
        self.metrics = Metrics(app=app.name, worker=str(config.worker))
        self.metrics.describe("epochal_transactions_total", "counter", "transactions by outcome")
        self.metrics.describe("epochal_aborts_total", "counter", "aborts by handler and reason")
        self.metrics.describe("epochal_epochs_total", "counter", "epochs executed")
        self.metrics.describe("epochal_epoch_seconds_sum", "counter", "time executing epochs")
        self.metrics.describe("epochal_command_log_position", "gauge", "last epoch executed")
        self.metrics.describe("epochal_egress_commits_total", "counter", "egress commits")
        self.metrics.describe("epochal_egress_commit_seconds_sum", "counter",
                              "time the broker took to commit egress, off the loop")  # fmt: skip
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
        if isinstance(snapshots, ForkedSnapshots):
            self.metrics.watch_process(snapshots.pid, "epochal_snapshots")
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
                          failure_timeout_s=config.failure_timeout_ms / 1000,
                          stopping=should_stop)  # fmt: skip
        started = time.perf_counter()
        phases = StartPhases()
        (writers, ranges), (restored, read_s) = await self._egress_and_snapshot(phases)
        engine = Engine(self.app, config.partitions, config.worker, config.workers, peers,
                        track_digest=config.track_digest, snapshots=self.snapshots is not None,
                        queries=bool(config.query), ranges=ranges)  # fmt: skip
        resumed = self._resume(engine, restored, read_s)
        phases.done("snapshot")
        if peers is not None:
            peers.resumed = resumed.ssid if resumed else -1
        taking = None
        if self.snapshots is not None:
            taking = SnapshotSide(self.app, config, self.snapshots, metrics=self.metrics,
                                  engine=engine, peers=peers, writers=writers,
                                  weak=self.weak)  # fmt: skip
        if taking is not None and resumed is not None:
            taking.committed_ssid = resumed.ssid
        queries = await self._serve_queries(engine)  # before peers connect: a taken port
        if peers is not None:  # ends the start with nothing to cancel
            await peers.start()
        progress = Progress.after(resumed)
        self._report_status(ranges, engine.partitions, progress)
        poller, head = await self._epochs_from(progress, writers, resumed)
        phases.done("peers")
        release = _released_in_background(writers, None if self.weak else taking, self.metrics)
        recovery = CatchUp(self.metrics, config.worker, progress.next, head, started=started,
                           resumed=resumed, queries=queries)  # fmt: skip
        ticker = InteriorTicker(self.clients, self.app, config)
        self._count_partitions(engine)
        logger.info("worker started worker=%d partitions=%s generation=%d from_epoch=%d "
                    "partition_actors=%s seconds=%s", config.worker, list(engine.partitions),
                    config.generation, progress.epoch, dict(engine.store.actors),
                    phases)  # fmt: skip
        try:
            while not should_stop():
                _check(peers, taking, release)
                epochs = await self._poll(poller, should_stop)
                for logged in epochs:
                    await self._epoch(engine, logged, writers, taking=taking, progress=progress,
                                      release=release)  # fmt: skip
                recovery.after_poll(progress.next, bool(epochs))
                # egress goes out on an interval, or at once when the log is read to its end
                # (nothing to batch it with, and waiting is all latency)
                due = (bool(epochs) and poller.drained) or (
                    time.monotonic() - release.committed_at >= config.egress_interval_ms / 1000
                )
                if due and not self.weak:  # weak: egress goes out when a snapshot commits
                    release.up_to(progress.next)
                ticker.after_poll(bool(epochs), progress.epoch - 1, bool(engine.carried))
                if progress.final is not None:
                    await _end_at_savepoint(peers, taking, release, progress.final)
                    break
            if not self.weak:
                await release.through(progress.next)
        finally:
            poller.close()
            ticker.close()
            await release.settle()
            await _close(taking, writers, peers, queries)

    def _report_status(
        self, ranges: KeyRanges, partitions: tuple[PartitionId, ...], progress: Progress
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
        *,
        taking: SnapshotSide | None,
        progress: Progress,
        release: EgressRelease,
    ) -> None:
        """One epoch: check it follows → execute → stage egress → maybe snapshot."""
        progress.epoch = _follows(logged, progress.epoch)
        logged = self.amendments.amend(logged)
        if not self.weak and taking is not None:
            logged = await self._before_failed_epoch(logged, taking, release)
        if logged.record.final:
            progress.final = logged.record.epoch
        if self.weak:
            assert taking is not None, "weak recovery takes snapshots"
            taking.hold_dead_letters(logged)
            held = functools.partial(taking.hold, logged.record.epoch)
            result = await self._execute(engine, logged, held)
        else:
            egress = EpochEgress(self.app, writers, logged)
            result = await self._execute(engine, logged, egress.add)
            egress.stage()
        if taking is not None:
            taking.archive(logged)
        progress.next = logged.position + 1
        snapshot = result.changes if taking is not None else None
        if not self.weak and snapshot is not None:
            release.up_to(progress.next)  # its part is handed on once this is out
        if not self.weak and any(w.pending >= MAX_PENDING_EGRESS for w in writers.values()):
            await release.through(progress.next)  # a backlog: bounded transactions
        if snapshot is not None and taking is not None:
            await taking.room()
            taking.take(logged, snapshot, engine.carried)

    async def _before_failed_epoch(
        self, logged: LoggedEpoch, taking: SnapshotSide, release: EgressRelease
    ) -> LoggedEpoch:
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
            _check(None, taking, release)  # (its part waits for its egress)
            await asyncio.sleep(0.01)
        return logged

    async def _egress_and_snapshot(
        self, phases: StartPhases
    ) -> tuple[tuple[dict[PartitionId, EgressWriter], KeyRanges], tuple[Restored | None, float]]:
        """The egress writers opened (fencing the last generation's) and the latest snapshot
        read: at once in strong mode, where every committed snapshot's egress is already out (a
        part is handed on only once its egress commits), so any snapshot read is safe to resume
        from. In weak mode a snapshot's egress is released after it commits, so the snapshot is
        read only once the fence stops the last generation's workers from releasing any more."""
        egress = await self._start_egress(phases)
        if self._snapshot_read is None:  # weak mode: read once fenced
            return egress, await asyncio.get_running_loop().run_in_executor(
                None, self._read_snapshot
            )
        return egress, await asyncio.wrap_future(self._snapshot_read)

    def _read_snapshot(self) -> tuple[Restored | None, float]:
        """The latest complete snapshot (worker 0 makes sure the tables exist first), and the
        seconds reading it took; None if there is none (or no snapshots). Off the loop."""
        if self.snapshots is None:
            return None, 0.0
        started = time.perf_counter()
        if self.config.worker == 0:
            self.snapshots.ensure_tables(self.code_hash)
        return self.snapshots.restore(), time.perf_counter() - started

    def _resume(self, engine: Engine, restored: Restored | None, read_s: float) -> Manifest | None:
        """Load ``restored`` (read in ``read_s``) into ``engine``; None without one: replay
        from the start."""
        if restored is None:
            return None
        started = time.perf_counter()
        manifest = restored.manifest
        mode = "weak" if self.weak else "strong"
        if manifest.recovery != mode:
            raise ConfigError(
                f"the app's latest snapshot was taken in {manifest.recovery} recovery mode; "
                f"running it in {mode} mode would misread its positions (start a new app, or "
                "keep the mode)", ssid=manifest.ssid,
            )  # fmt: skip
        engine.load(restored.actors, manifest.epoch, carried_of(manifest), restored.migrations)
        loaded_s = time.perf_counter() - started
        self.metrics.set("epochal_resume_seconds", read_s + loaded_s)
        logger.info("resumed from snapshot ssid=%d actors=%s seconds=%.2f (read %.2f while the "
                    "egress writers fenced, loaded %.2f)", manifest.ssid, manifest.actors,
                    read_s + loaded_s, read_s, loaded_s)  # fmt: skip
        return manifest

    async def _start_egress(
        self, phases: StartPhases
    ) -> tuple[dict[PartitionId, EgressWriter], KeyRanges]:
        """This worker's egress writers once open, where each resumes and, in strong mode, the
        operator's amendments; each step timed for the start line. Off the loop: one blocked
        past the failure bound leaves the group."""
        loop = asyncio.get_running_loop()
        writers = await asyncio.wrap_future(self._egress_opened)
        phases.done("fence")
        ranges = await loop.run_in_executor(None, self._egress_positions, writers)
        phases.done("positions")
        if self._amendments_read is not None:
            self.amendments = await asyncio.wrap_future(self._amendments_read)
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
        self, progress: Progress, writers: dict[PartitionId, EgressWriter],
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
        await loop.run_in_executor(None, commit_all, {p: writers[p] for p in owed},
                                   resumed.ssid + 1)  # fmt: skip
        logger.info("held egress released after a restart ssid=%d records=%d partitions=%s",
                    resumed.ssid, len(rows), owed)  # fmt: skip

    async def _execute(
        self, engine: Engine, logged: LoggedEpoch, egress: OnReported
    ) -> EpochResult:
        """Run the epoch; its outcomes, a slice at a time, are counted and go to ``egress``
        (staged, or held until a snapshot in weak mode)."""
        record = logged.record
        ensure_same_code(record, self.code_hash, self.config.allow_code_change)
        metrics = self.metrics

        def on_reported(reported: Mapping[PartitionId, list[TxnOutcome]]) -> None:
            for outcomes in reported.values():
                count_outcomes(metrics, outcomes)
            egress(reported)

        started = time.perf_counter()
        result = await engine.run_epoch(record, on_reported)
        self.metrics.inc("epochal_epochs_total")
        self.metrics.inc("epochal_epoch_seconds_sum", time.perf_counter() - started)
        self.metrics.set("epochal_command_log_position", logged.position)
        self._count_partitions(engine)
        return result


async def _close(
    taking: SnapshotSide | None, writers: dict[PartitionId, EgressWriter], peers: Peers | None,
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


async def _end_at_savepoint(
    peers: Peers | None, taking: SnapshotSide | None, release: EgressRelease, final: int
) -> None:
    """The sequencer's final epoch ran: wait until its snapshot is committed (worker 0 commits
    it and tells the others) and, in weak mode, the egress it held is released; then the
    worker stops, and a start after it replays nothing. The supervisor bounds the wait.
    Once that snapshot is committed a peer may stop before this worker has released its
    egress: a peer gone then is no failure."""
    while taking is not None and (taking.committed_ssid < final or taking.busy):
        _check(peers if taking.committed_ssid < final else None, taking, release)
        await asyncio.sleep(0.01)
    logger.info("worker stops at a savepoint epoch=%d", final)


def _check(peers: Peers | None, taking: SnapshotSide | None, release: EgressRelease) -> None:
    """Fail now if a peer was lost (even while idle), a snapshot thread or an egress commit
    failed."""
    if peers is not None and peers.failed.done():
        peers.failed.result()
    if taking is not None:
        taking.check()
    release.check()


def _released_in_background(
    writers: dict[PartitionId, EgressWriter], taking: SnapshotSide | None, metrics: Metrics
) -> EgressRelease:
    """Egress released off the loop; a snapshot part (strong mode: ``taking``) is handed on
    only once its epochs' egress is out, so every committed snapshot's egress is."""
    release = EgressRelease(writers, metrics)
    if taking is not None:
        taking.wait_for_egress(release)
    return release


def _follows(logged: LoggedEpoch, expected: int) -> int:
    """The epoch after ``logged``, if ``logged`` is the epoch expected; else refuse it."""
    if logged.record.epoch != expected:
        raise LogError(
            "the command log holds an epoch out of sequence (did two sequencers write it?)",
            epoch=logged.record.epoch, expected=expected, offset=logged.position,
        )  # fmt: skip
    return expected + 1
