"""Weak recovery as a PySpark job (``epochal recover --mode weak``): re-sequence the input
topics after the latest snapshot into a new snapshot, with no command log (docs/recovery.md).

An app run with ``--recovery weak`` logs nothing; its input topics are the only log. This job
reads them with the **Spark Kafka source** from the input positions of the latest (weak-mode)
snapshot to their ends (a position no longer held is a :class:`LogTruncatedError` before
anything is written), orders them anew into epochs, replays those on the snapshot's state with
the application's own handlers, and commits one snapshot at the last epoch:

- **Order.** Records of one input partition keep their offset order; partitions interleave by
  record timestamp (a k-way merge, so a producer's out-of-order timestamps never reorder a
  partition). Epochs hold ``max_records`` each, as the sequencer's would; the epoch's time is
  its latest record's timestamp (never going back), its seed derives from the epoch number.
  The same input always gives the same epochs. Records that cannot become transactions become
  dead letters, as the sequencer makes them.
- **Replay** runs in one ordered pass on the driver: re-sequencing fixes one total order, and
  the replay of a backlog of ``n`` records is the same work the engine would do on restart.
- **Egress** of the replayed epochs is held in the snapshot's ``outbox`` rows, for the
  partitions of the snapshot's layout, and so are their dead letters (on partition 0, as the
  workers hold them); the cluster, restarted, releases them (exactly once: each partition
  releases only the epochs after those it already released). The job writes nothing to
  Kafka itself: a job run again, or a crash of it, writes no dead letter twice. The epochs are
  archived in ``commands``, with their outcomes, like any snapshot's.

Run it while the cluster is stopped: both would otherwise sequence the same input.
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

import msgspec
from pyspark.sql import SparkSession

from epochal.actors.api import App
from epochal.actors.egress import EgressEncoder, held_dead_letters
from epochal.actors.engine import Engine
from epochal.actors.partitioning import KeyRanges
from epochal.actors.snapshots import carried_of, with_log_position
from epochal.config import KafkaConfig, SnapshotConfig
from epochal.errors import RecoveryError
from epochal.log.amendments import read_amendments
from epochal.log.client import KafkaClients
from epochal.log.ordering import EpochStamp, SequencedEpoch, order, position_key
from epochal.recovery.snapshots import DeltaSnapshots
from epochal.schemas.commands import EpochRecord, InputRecord
from epochal.schemas.snapshots import Manifest, OutboxRow

__all__ = ["WeakRecoveryReport", "recover_weak", "resequence"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WeakRecoveryReport:
    """What a weak recovery did: from which snapshot, how many input records it re-sequenced
    into how many epochs and transactions, and into how many dead letters, the new snapshot
    (None if there was nothing to do), its digest, and the egress records it holds for release
    (the dead letters are held too, not counted there)."""

    from_ssid: int
    records: int
    epochs: int
    transactions: int
    dead_letters: int
    ssid: int | None
    digest: str
    egress: int
    seconds: float


def _merge(records: Iterable[InputRecord]) -> list[InputRecord]:
    """Each partition in offset order; partitions interleaved by timestamp."""
    by_partition: dict[tuple[str, int], list[InputRecord]] = {}
    for record in records:
        by_partition.setdefault((record.topic, record.partition), []).append(record)
    runs = [sorted(run, key=lambda r: r.offset) for _, run in sorted(by_partition.items())]
    return list(heapq.merge(*runs, key=lambda r: r.timestamp_ms))


def _seed(epoch: int) -> int:
    digest = hashlib.blake2b(f"weak-recovery:{epoch}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def resequence(
    app: App,
    after: Manifest,
    records: Iterable[InputRecord],
    max_records: int,
    skipped: AbstractSet[tuple[str, int, int]] = frozenset(),
) -> Iterator[SequencedEpoch]:
    """The epochs after snapshot ``after``: ``records`` (the input from its positions on)
    merged and cut into epochs of ``max_records``, ordered as the sequencer orders a batch
    (``skipped``: the inputs an operator sent to the dead letters)."""
    merged = _merge(records)
    requests_topic = app.topics.requests
    positions = dict(after.input_positions)
    now_ms, seen = after.time_ms, set[str]()
    for n, start in enumerate(range(0, len(merged), max_records)):
        batch = merged[start : start + max_records]
        epoch = after.epoch + 1 + n
        now_ms = max([now_ms, *(r.timestamp_ms for r in batch)])
        stamp = EpochStamp(epoch, now_ms, _seed(epoch), app.code_hash(), False)
        inputs = [r for r in batch if r.topic != requests_topic]
        requests = [r for r in batch if r.topic == requests_topic]
        sequenced = order(app, stamp, inputs, requests, sequenced_requests=seen,
                          positions=positions, skipped=skipped)  # fmt: skip
        seen |= set(sequenced.requests_seen)
        positions = dict(sequenced.record.next_offsets)
        yield sequenced


class _Input:
    """The input topics' records after a snapshot, read with the Spark Kafka source."""

    def __init__(self, app: App, spark: SparkSession, clients: KafkaClients) -> None:
        self.app = app
        self.spark = spark
        self.clients = clients

    def starts(self, manifest: Manifest) -> dict[str, dict[str, int]]:
        """Where each partition of each input topic starts, checked to be still held."""
        metadata = self.clients.admin().list_topics(timeout=30)
        names = self.app.topics
        read = set(self.app.input_topics())
        unread = {t for t in metadata.topics if names.is_input(t)}  # dead letters, as in the run
        topics = sorted(read | unread | {names.requests})
        starts: dict[str, dict[str, int]] = {}
        for topic in topics:
            if topic not in metadata.topics:
                continue
            for partition in sorted(metadata.topics[topic].partitions):
                position = manifest.input_positions.get(position_key(topic, partition), 0)
                self.clients.check_position("weak recovery cannot re-sequence the input", topic,
                                            partition, position)  # fmt: skip
                starts.setdefault(topic, {})[str(partition)] = position
        return starts

    def read(self, starts: dict[str, dict[str, int]]) -> list[InputRecord]:
        if not starts:
            return []
        frame = (
            self.spark.read.format("kafka")
            .option("kafka.bootstrap.servers", self.clients.config.bootstrap_servers)
            .option("kafka.isolation.level", "read_committed")
            .option("assign", json.dumps({t: [int(p) for p in ps] for t, ps in starts.items()}))
            .option("startingOffsets", json.dumps(starts))
            .option("endingOffsets", "latest")
            .load()
            .selectExpr(
                "topic",
                "partition",
                "offset",
                "value",
                "key",
                "CAST(unix_millis(timestamp) AS LONG) AS ts",
            )
        )
        return [
            InputRecord(
                row.topic,
                row.partition,
                row.offset,
                bytes(row.value or b""),
                bytes(row.key) if row.key is not None else None,
                row.ts,
            )
            for row in frame.toLocalIterator()
        ]


def recover_weak(
    app: App,
    snapshot_config: SnapshotConfig,
    spark: SparkSession,
    kafka: KafkaConfig,
    *,
    max_records: int = 5000,
    progress: Callable[[str, int, int], None] = lambda phase, done, total: None,
) -> WeakRecoveryReport:
    """Re-sequence the input after the latest snapshot and commit the state it leads to (see
    the module docstring). ``progress(phase, done, total)`` is called as it goes."""
    started = time.perf_counter()
    clients = KafkaClients(kafka)
    config = SnapshotConfig(snapshot_config.warehouse, snapshot_config.storage_options,
                            keep=0, recovery="weak")  # fmt: skip
    probe = DeltaSnapshots(app, config, partitions=1)
    restored = probe.restore()
    if restored is None or restored.manifest.recovery != "weak":
        raise RecoveryError("weak recovery starts from a snapshot taken in weak mode",
                            app=app.name, warehouse=probe.warehouse.uri())  # fmt: skip
    manifest = restored.manifest
    source = _Input(app, spark, clients)
    records = source.read(source.starts(manifest))
    progress("reading the input", len(records), len(records))
    snapshots = DeltaSnapshots(app, config, manifest.partitions, clients)
    snapshots.ensure_tables(app.code_hash())
    points = manifest.points or None  # the snapshot's layout: its outbox rows are released
    ranges = KeyRanges.of(app, manifest.partitions, points)  # by that layout's writers
    engine = Engine(app, manifest.partitions, snapshots=True, ranges=ranges)
    engine.load(restored.actors, manifest.epoch, carried_of(manifest), restored.migrations)
    epochs: list[EpochRecord] = []
    outbox: list[OutboxRow] = []
    dead: list[OutboxRow] = []

    async def replay() -> None:
        done = 0
        skipped = read_amendments(clients, app.name).inputs
        egress_of = EgressEncoder(app).records
        for sequenced in resequence(app, manifest, records, max_records, skipped):
            record = sequenced.record
            dead.extend(held_dead_letters(app, record.epoch, sequenced.dead))
            result = await engine.run_epoch(record)
            epochs.append(record)
            for partition, outcomes in result.by_partition.items():
                for outcome in outcomes:
                    outbox.extend(
                        OutboxRow(record.epoch, partition, topic, value)
                        for topic, value in egress_of(outcome)
                    )
            done += len(record.txns) + len(sequenced.dead)
            progress("replaying", done, len(records))

    asyncio.run(replay())
    if not epochs:
        return WeakRecoveryReport(manifest.ssid, 0, 0, 0, 0, None, manifest.digest, 0,
                                  time.perf_counter() - started)  # fmt: skip
    last = epochs[-1]
    changes = engine.store.take_changes(last.epoch)
    part = snapshots.write(last.epoch, 0, changes, commands=epochs, outbox=dead + outbox,
                           reported=engine.take_reported())  # fmt: skip
    part = with_log_position(part, last, last.epoch + 1, engine.carried)
    shares = {int(p): n for p, n in engine.store.actors.items()}
    part = msgspec.structs.replace(part, points=ranges.recorded(), partition_actors=shares)
    committed = snapshots.commit([part], last.epoch)
    progress("committing", 1, 1)
    logger.info("weak recovery committed ssid=%d from_ssid=%d records=%d epochs=%d",
                committed.ssid, manifest.ssid, len(records), len(epochs))  # fmt: skip
    return WeakRecoveryReport(
        manifest.ssid, len(records), len(epochs), sum(len(e.txns) for e in epochs), len(dead),
        committed.ssid, committed.digest, len(outbox), time.perf_counter() - started,
    )  # fmt: skip
