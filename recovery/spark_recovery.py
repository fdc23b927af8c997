"""Strong recovery as a PySpark job: a snapshot plus the command log after it give a new snapshot,
replayed in parallel where the log allows it (``epochal recover --mode strong``).

**Reads.** The command log, from the snapshot's position to its end, through the Spark Kafka
source (``read_committed``), in slices; the few epochs a slice boundary cuts are stitched on the
driver. A log that no longer holds the start is a :class:`LogTruncatedError` before anything is
read or written. The snapshot (``from_ssid``, default the latest) at the table versions its
manifest row names, with delta-rs on the executors: the driver lists each version's Parquet
files (delta-rs, milliseconds) and checks their row counts against the manifest, executors read
the files in parallel and send each actor on to the task that replays it. Spark's own Delta
reader would plan every table on the driver first, seconds per table (tens in a fresh session)
before a row moves, which is longer than replaying a small log; the tables are epochal's own,
written by delta-rs without deletion vectors (refused if one appears).

**In parallel where the log allows it.** A transaction reads and writes only the keys it
declared, and its time and randomness come from its timestamp (``ctx.now`` is its epoch's,
``ctx.random`` is seeded by seed, epoch and seq): the transactions of one connected set of keys
give, per key, the same result run alone in (epoch, seq) order as within the whole log.
Union-find over the declared key sets (:class:`KeyGroups`, per slice, merged on the driver)
finds these groups; they are packed into tasks by transaction count, biggest first onto the
least loaded, and each task replays its groups' transactions on an engine loaded with only
their actors. Interior transactions break this: an emitted event's keys are known only once its
parent has run. An app with interior handlers, a snapshot that carries interior transactions,
or key sets that link every transaction, replay in **one ordered task** over the whole state;
the report and the log say why.

**Writes.** Each task writes its changed actors as uncommitted Parquet parts on its executor
(:meth:`DeltaSnapshots.write`, no JVM); the driver commits them (:meth:`DeltaSnapshots.commit`)
as a snapshot at the last replayed epoch, with the command-log position after it, that epoch's
input positions and the interior transactions still to run: the engine resumes from it as from
any other. In place, the replay stops where the egress the cluster released stops, so that the
restarted cluster still writes the egress after it; run it while the cluster is stopped.
``into=<namespace>`` replays under the current code (another code hash is fine) into the tables
of the app name ``<app>/into/<namespace>`` (a name with ``/`` is no topic name, so it never
clashes with an app's): a copy of the starting snapshot, then a snapshot at every original ssid
in the replayed range and at its end, so corrected history and what ran compare ssid by ssid.

Executors report the transactions they replayed over TCP to the driver as they go (Spark's
accumulators arrive only when a task ends), for a progress bar.

    >>> report = recover_strong("examples.bank.app:app", "bank", SnapshotConfig("warehouse"),
    ...                         spark, kafka=KafkaConfig("127.0.0.1:9092"))
    >>> report.ssids, report.tasks, report.ordered_reason
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
import json
import logging
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable
from py4j.protocol import Py4JError
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from epochal.actors.api import App, load_app, named
from epochal.actors.digest import DigestSum
from epochal.actors.outcome import Emitted
from epochal.actors.plan import ensure_same_code
from epochal.actors.snapshots import carried_of, with_log_position
from epochal.config import KafkaConfig, SnapshotConfig
from epochal.errors import ConfigError, RecoveryError, SnapshotMissingError
from epochal.log.amendments import read_amendments
from epochal.log.client import KafkaClients
from epochal.log.command_log import EpochAssembler
from epochal.log.egress import ensure_positions_topic, read_egress_state
from epochal.recovery.schema_evolution import migrations_for
from epochal.recovery.snapshots import DeltaSnapshots
from epochal.recovery.spark_tasks import (
    CHUNK,
    EPOCH,
    EpochInfo,
    KeyGroups,
    ProgressServer,
    RecoveryProgress,
    TaskResult,
    TaskSetup,
    assemble,
    copy_state,
    replay_task,
    route_log,
    route_state,
    summarize,
)
from epochal.schemas.codec import encode
from epochal.schemas.commands import KeyRef
from epochal.schemas.snapshots import Manifest, SnapshotPart

__all__ = ["RecoveryProgress", "RecoveryReport", "into_tables", "recover_strong"]

logger = logging.getLogger(__name__)

_NAMESPACE = re.compile(r"[A-Za-z0-9_.-]{1,100}")


@dataclass(frozen=True)
class RecoveryReport:
    """What a strong recovery did.

    ``tables`` is the app name the snapshots went under (``<app>`` or ``<app>/into/<ns>``),
    ``ssids`` those it committed (into a namespace, the copy of the starting one first);
    ``groups`` the key groups found (0 when the app or the snapshot ruled a parallel replay out
    before looking); ``ordered_reason`` why the replay ran as one ordered task ("" when in
    parallel); ``command_log_position`` where an engine resuming from the last snapshot reads on.
    """

    app: str
    tables: str
    from_ssid: int | None
    ssids: tuple[int, ...]
    epochs: int
    transactions: int
    groups: int
    tasks: int
    ordered_reason: str
    digest: str
    command_log_position: int
    seconds: float

    @property
    def parallel(self) -> bool:
        return not self.ordered_reason


def into_tables(app_name: str, namespace: str) -> str:
    """The app name whose tables ``into=namespace`` writes: ``<app>/into/<namespace>``."""
    if not _NAMESPACE.fullmatch(namespace):
        raise ConfigError("a namespace is letters, digits, '_', '.' or '-'", namespace=namespace)
    return f"{app_name}/into/{namespace}"


def _quiet(progress: RecoveryProgress) -> None:
    """No progress shown."""


def recover_strong(
    app_spec: str,
    app_name: str | None,
    snapshot_config: SnapshotConfig,
    spark: SparkSession,
    *,
    kafka: KafkaConfig | None = None,
    from_ssid: int | None = None,
    into: str | None = None,
    allow_code_change: bool = False,
    progress: Callable[[RecoveryProgress], None] = _quiet,
) -> RecoveryReport:
    """Replay the command log after a snapshot in Spark and commit the state it leads to as a
    new snapshot (see the module docstring).

    ``app_spec`` is ``module:attribute`` (executors import it), ``app_name`` the name the
    cluster ran it under (its topics and tables; None: the App's own). ``from_ssid``: the
    snapshot to start from (default the latest; in place it must be the latest). ``into``: a
    namespace to replay into under the current code, leaving the app's tables alone.
    ``progress`` is called on driver threads. Raises LogTruncatedError if the log no longer
    holds the start, SnapshotMissingError for an unknown ``from_ssid``, RecoveryError if the
    log was written by other code (unless ``allow_code_change`` or ``into``) or Spark fails.
    """
    started = time.perf_counter()
    recovery = _Recovery(
        app_spec, app_name, snapshot_config, spark, kafka=kafka, from_ssid=from_ssid, into=into,
        allow_code_change=allow_code_change or into is not None, progress=progress,
    )  # fmt: skip
    report = recovery.run()
    return dataclasses.replace(report, seconds=time.perf_counter() - started)


def _spark_action(what: str, action: Callable[[], Any]) -> Any:
    """Run a Spark action; its failures become RecoveryError (users never catch Spark's)."""
    try:
        return action()
    except (PySparkException, Py4JError) as exc:
        lines = [line.strip() for line in str(exc).splitlines() if "Error" in line]
        reason = (lines[-1] if lines else str(exc).strip().splitlines()[0])[:500]
        raise RecoveryError(f"{what} failed in Spark: {reason}") from exc


def _import_roots(app_spec: str) -> tuple[str, ...]:
    """The sys.path entry the app's module was imported from (executors in local mode add it)."""
    module_name = app_spec.partition(":")[0]
    path = getattr(sys.modules.get(module_name), "__file__", None)
    if path is None:
        return ()
    root = Path(path).absolute().parent  # not resolved: symlinked packages stay as imported
    for _ in module_name.split(".")[1 if Path(path).name != "__init__.py" else 0 :]:
        root = root.parent
    return (str(root),)


def _ordered_reason(app: App, carried: Sequence[Emitted]) -> str:
    """Why the replay must run as one ordered task whatever the key sets ("" if it need not)."""
    interior = sorted(h.name for h in app.handlers.values() if h.interior)
    if interior:
        return (f"the app has interior transactions ({', '.join(interior)}): an emitted event's "
                "keys are known only once its parent has run")  # fmt: skip
    if carried:
        return f"the snapshot carries {len(carried)} interior transactions to run first"
    return ""


def _pack(groups: Sequence[tuple[list[KeyRef], int]], slots: int) -> tuple[int, dict[KeyRef, int]]:
    """Groups into at most ``slots`` tasks, the biggest first onto the least loaded task."""
    tasks = max(1, min(slots, len(groups)))
    loads = [(0, task) for task in range(tasks)]
    task_of: dict[KeyRef, int] = {}
    for refs, weight in sorted(groups, key=lambda group: -group[1]):
        load, task = heapq.heappop(loads)
        task_of.update(dict.fromkeys(refs, task))
        heapq.heappush(loads, (load + weight, task))
    return tasks, task_of


def _egress_released(clients: KafkaClients, app_name: str, end: int) -> int:
    """The command-log position up to which every partition released its egress (``end`` if
    no cluster ever wrote any): a snapshot further on would lose the egress after it."""
    ensure_positions_topic(clients, app_name)  # what any cluster creates: empty if none ran
    state = read_egress_state(clients, app_name)
    if state.layout is None:
        return end
    return min(end, *(state.start(p) for p in range(state.layout.partitions)))


@contextlib.contextmanager
def _progress_server(
    host: str, total: int, report: Callable[[RecoveryProgress], None]
) -> Iterator[ProgressServer | None]:
    """A progress server on the driver's address, or None (no progress) if none can listen."""
    try:
        server = ProgressServer(host, total, report)
    except OSError as exc:
        logger.warning("no progress from the executors: cannot listen on %s: %s", host, exc)
        yield None
        return
    with server:
        yield server


@dataclass
class _Read:
    """The log as read and grouped: its epochs (an RDD of ``(position, record msgpack)``),
    what the driver keeps of each, and the key groups."""

    epochs: Any = None
    infos: list[EpochInfo] = field(default_factory=list)
    groups: list[tuple[list[KeyRef], int]] = field(default_factory=list)

    @property
    def transactions(self) -> int:
        return sum(info.txns for info in self.infos)


class _Recovery:
    """One recovery as the driver runs it: plan (here) → read and group the log → replay →
    commit."""

    def __init__(
        self, app_spec: str, app_name: str | None, config: SnapshotConfig, spark: SparkSession,
        *, kafka: KafkaConfig | None, from_ssid: int | None, into: str | None,
        allow_code_change: bool, progress: Callable[[RecoveryProgress], None],
    ) -> None:  # fmt: skip
        self.allow_code_change, self.progress = allow_code_change, progress
        loaded = load_app(app_spec)
        self.app, self.app_spec, self.spark = (
            named(loaded, app_name or loaded.name),
            app_spec,
            spark,
        )
        self.config = dataclasses.replace(config, recovery="strong")  # what it commits
        self.manifests = DeltaSnapshots(self.app, self.config, 1).manifests()
        self.base = self._base(from_ssid, into)
        if self.base is not None and migrations_for(self.app, self.base):
            raise RecoveryError(
                f"snapshot ssid={self.base.ssid} was taken under other actor schemas of "
                f"{sorted(migrations_for(self.app, self.base))}, which this version migrates: "
                "start the app with `epochal run` once (its start runs the migrations and its "
                "first snapshot holds their results), then recover from that snapshot"
            )
        partitions = self.base.partitions if self.base else 1
        self.original = DeltaSnapshots(self.app, self.config, partitions)
        self.target, self.into = self.original, into
        if into is not None:
            tables = named(self.app, into_tables(self.app.name, into))
            self.target = DeltaSnapshots(tables, self.config, partitions)
            if self.target.manifests():
                raise RecoveryError(
                    "the namespace holds snapshots already: choose another, or delete its folder",
                    tables=self.target.warehouse.uri(),
                )
        self.clients = KafkaClients(kafka or KafkaConfig())
        self.topic = self.app.topics.command_log
        self.start = self.base.command_log_position if self.base else 0
        self.clients.check_position("strong recovery", self.topic, 0, self.start)
        self.end = self.clients.end_offset(self.topic)
        self.amendments = read_amendments(self.clients, self.app.name)
        if into is None:
            self.end = _egress_released(self.clients, self.app.name, self.end)

    def _base(self, from_ssid: int | None, into: str | None) -> Manifest | None:
        """The snapshot to start from: ``from_ssid``, else the latest (None: there is none)."""
        latest = self.manifests[-1] if self.manifests else None
        base = latest
        if from_ssid is not None:
            base = next((m for m in self.manifests if m.ssid == from_ssid), None)
            if base is None:
                raise SnapshotMissingError("no complete snapshot with this ssid", ssid=from_ssid,
                                           kept=[m.ssid for m in self.manifests])  # fmt: skip
        if into is None and base is not latest:
            raise RecoveryError("in place, recovery starts from the latest snapshot: replay an "
                                "older one into a namespace", ssid=from_ssid,
                                latest=latest.ssid if latest else None)  # fmt: skip
        if base is not None and base.recovery != "strong":
            raise RecoveryError("a weak-mode snapshot has no command log to replay after it",
                                ssid=base.ssid, recovery=base.recovery)  # fmt: skip
        return base

    # --- the steps ---------------------------------------------------------------------------

    def run(self) -> RecoveryReport:
        reason = _ordered_reason(self.app, carried_of(self.base) if self.base else [])
        read, pieces = _Read(), None
        try:
            if self.start < self.end:
                read, pieces = self._read(link=not reason)
            self._check(read.infos)
            if not reason and len(read.groups) < 2:
                reason = "the declared key sets link every transaction into one group"
            return self._replay_and_commit(read, reason)
        finally:
            if pieces is not None:
                pieces.unpersist()

    def _read(self, link: bool) -> tuple[_Read, Any]:
        """The log through the Spark Kafka source, in slices; epochs that a slice boundary
        cuts are stitched here; then every slice's epochs summarized (and grouped if ``link``)."""
        records = self.end - self.start
        self.progress(RecoveryProgress("reading", 0, records))
        slices = 2 * max(1, self.spark.sparkContext.defaultParallelism)
        settings = {f"kafka.{k}": v for k, v in self.clients.config.settings.items()}
        frame = (
            self.spark.read.format("kafka")
            .options(**settings)
            .option("kafka.bootstrap.servers", self.clients.config.bootstrap_servers)
            .option("kafka.isolation.level", "read_committed")
            .option("assign", json.dumps({self.topic: [0]}))
            .option("startingOffsets", json.dumps({self.topic: {"0": self.start}}))
            .option("endingOffsets", json.dumps({self.topic: {"0": self.end}}))
            .option("failOnDataLoss", "true")
            .option("minPartitions", str(slices))
            .load()
            .select("offset", "value")
        )
        pieces = frame.rdd.mapPartitions(assemble).persist()
        cut = _spark_action("reading the command log",
                            lambda: pieces.filter(lambda p: p[0] == CHUNK).collect())  # fmt: skip
        assembler, stitched = EpochAssembler(), []
        for _, offset, value in sorted(cut, key=lambda piece: piece[1]):
            logged = assembler.add(offset, value)
            if logged is not None:
                stitched.append((logged.position, encode(logged.record)))
        epochs = pieces.filter(lambda p: p[0] == EPOCH).map(lambda p: (p[1], p[2]))
        if stitched:
            epochs = epochs.union(self.spark.sparkContext.parallelize(stitched, 1))
        found = _spark_action("reading the command log",
                              lambda: epochs.mapPartitions(summarize(link)).collect())  # fmt: skip
        read, merged = _Read(epochs), KeyGroups()
        for infos, groups in found:
            read.infos += infos
            for refs, weight in groups:
                merged.link(refs, weight)
        read.infos.sort(key=lambda info: info.position)
        read.groups = merged.groups()
        self.progress(RecoveryProgress("reading", records, records))
        return read, pieces

    def _check(self, infos: Sequence[EpochInfo]) -> None:
        """The epochs follow the snapshot one by one, logged by this code (unless allowed)."""
        expected = self.base.epoch + 1 if self.base else 0
        running = self.app.code_hash()
        for info in infos:
            if info.epoch != expected:
                raise RecoveryError(
                    "the command log skips or repeats an epoch", topic=self.topic,
                    offset=info.position, epoch=info.epoch, expected=expected,
                )  # fmt: skip
            header = self.amendments.apply(info.header())
            ensure_same_code(header, running, self.allow_code_change)
            expected += 1

    def _boundaries(self, infos: Sequence[EpochInfo]) -> list[int]:
        """The ssids to snapshot at: the last epoch, and into a namespace every original ssid
        in the replayed range too."""
        if not infos:
            return []
        last, first = infos[-1].epoch, infos[0].epoch
        kept = {m.ssid for m in self.manifests if first <= m.ssid <= last} if self.into else set()
        return sorted(kept | {last})

    def _state_files(self) -> list[tuple[str, str]]:
        """The Parquet files of the starting snapshot's state tables, ``(actor type, URI)``,
        checked against the manifest's actor counts."""
        base, files = self.base, []
        if base is None:
            return []
        for name in self.app.actor_types:
            uri, version = self.original.warehouse.state(name), base.state_versions.get(name, 0)
            table = DeltaTable(
                uri, version=version, storage_options=self.original.warehouse.options
            )
            if "deletionVectors" in (table.protocol().reader_features or []):
                raise RecoveryError("a state table uses deletion vectors, which epochal never "
                                    "writes", table=uri, version=version)  # fmt: skip
            rows = sum(
                pa.table(table.get_add_actions(flatten=True)).column("num_records").to_pylist()
            )
            if rows != base.actors.get(name, 0):
                raise RecoveryError(
                    "a snapshot's state table holds another number of actors than its manifest "
                    "says", ssid=base.ssid, table=uri, version=version, rows=rows,
                    expected=base.actors.get(name, 0),
                )  # fmt: skip
            files += [(name, file) for file in table.file_uris()]
        return files

    def _replay_and_commit(self, read: _Read, reason: str) -> RecoveryReport:
        boundaries = self._boundaries(read.infos)
        slots = 2 * max(1, self.spark.sparkContext.defaultParallelism)
        tasks, task_of = (1, None) if reason else _pack(read.groups, slots)
        if not read.infos:
            logger.info("strong recovery: nothing to replay app=%s", self.app.name)
        elif reason:
            logger.info("strong recovery in one ordered task app=%s: %s", self.app.name, reason)
        else:
            logger.info("strong recovery in parallel app=%s groups=%d tasks=%d", self.app.name,
                        len(read.groups), tasks)  # fmt: skip
        files = self._state_files()
        host = self.spark.sparkContext.getConf().get("spark.driver.host") or "127.0.0.1"
        with _progress_server(host, read.transactions, self.progress) as server:
            setup = self._setup(boundaries, server.address if server else None)
            copied = self._copy_base(setup, files) if self.into is not None else None
            results: list[TaskResult] = []
            if read.infos:
                results = self._replay(read, task_of, tasks, setup, files)
        manifests = [copied] if copied else []
        manifests += self._commit({i.epoch: i for i in read.infos}, boundaries, results)
        newest = manifests[-1] if manifests else self.base
        return RecoveryReport(
            self.app.name, self.target.app.name, self.base.ssid if self.base else None,
            tuple(m.ssid for m in manifests), len(read.infos), read.transactions,
            len(read.groups), tasks, reason, newest.digest if newest else DigestSum().hex(),
            newest.command_log_position if newest else self.start, 0.0,
        )  # fmt: skip

    def _setup(self, boundaries: Sequence[int], progress: tuple[str, int] | None) -> TaskSetup:
        base = self.base
        return TaskSetup(
            self.app_spec, self.app.name, self.target.app.name, self.config,
            self.original.partitions, _import_roots(self.app_spec), base.epoch if base else -1,
            tuple(carried_of(base)) if base else (), tuple(boundaries), progress,
            self.amendments,
        )  # fmt: skip

    def _copy_base(self, setup: TaskSetup, files: list[tuple[str, str]]) -> Manifest | None:
        """``into``: the namespace starts with a copy of the snapshot the replay starts from."""
        base = self.base
        self.target.ensure_tables(self.app.code_hash())
        if base is None:
            return None
        context, copy = self.spark.sparkContext, copy_state(setup, base.ssid)
        slices = max(1, min(len(files), context.defaultParallelism))
        parts = _spark_action("copying the snapshot", lambda: context.parallelize(files, slices)
                              .mapPartitionsWithIndex(copy).collect()) if files else []  # fmt: skip
        head = SnapshotPart(
            base.ssid, 0, (), DigestSum().hex(), 0, base.time_ms, base.command_log_position,
            dict(base.input_positions), base.carried, points=dict(base.points),
        )  # fmt: skip
        copied = self.target.commit([head, *parts], base.ssid)
        if copied.digest != base.digest:
            raise RecoveryError("the copy of the snapshot does not match it", ssid=base.ssid,
                                digest=copied.digest, expected=base.digest)  # fmt: skip
        return copied

    def _replay(
        self, read: _Read, task_of: dict[KeyRef, int] | None, tasks: int, setup: TaskSetup,
        files: list[tuple[str, str]],
    ) -> list[TaskResult]:  # fmt: skip
        """Every task's epochs and actors to it (one shuffle), then the tasks replay."""
        context = self.spark.sparkContext
        shared = None if task_of is None else context.broadcast(task_of)
        try:
            rows = read.epochs.mapPartitionsWithIndex(route_log(setup, shared))
            if files:
                slices = max(1, min(len(files), context.defaultParallelism))
                state = context.parallelize(files, slices).mapPartitions(route_state(shared))
                rows = rows.union(state)
            replay = replay_task(setup)
            results: list[TaskResult] = _spark_action(
                "replaying the command log",
                lambda: (
                    rows.partitionBy(tasks, lambda task: task)
                    .mapPartitionsWithIndex(replay)
                    .collect()
                ),
            )
        finally:
            if shared is not None:
                shared.unpersist()
        return results

    def _commit(
        self, infos: dict[int, EpochInfo], boundaries: Sequence[int],
        results: Sequence[TaskResult],
    ) -> list[Manifest]:  # fmt: skip
        """The tasks' parts as one snapshot per boundary, oldest first, each with a head part
        saying where the log stood (worker 0's in a cluster)."""
        parts: dict[int, list[SnapshotPart]] = {ssid: [] for ssid in boundaries}
        carried: dict[int, list[Emitted]] = {ssid: [] for ssid in boundaries}
        for result in results:
            for part in result.parts:
                parts[part.ssid].append(part)
            for ssid, emitted in result.carried.items():
                carried[ssid] += emitted
        if boundaries:
            self.target.ensure_tables(self.app.code_hash())
        manifests = []
        points = dict(self.base.points) if self.base else {}  # the layout replayed is the base's
        for done, ssid in enumerate(boundaries, 1):
            info = infos[ssid]
            head = with_log_position(SnapshotPart(ssid, 0, (), DigestSum().hex(), 0, points=points),
                                     info.header(), info.position + 1, carried[ssid])  # fmt: skip
            manifests.append(self.target.commit([head, *parts[ssid]], ssid))
            self.progress(RecoveryProgress("committing", done, len(boundaries)))
            logger.info("strong recovery committed ssid=%d tables=%s digest=%s", ssid,
                        self.target.app.name, manifests[-1].digest)  # fmt: skip
        return manifests
