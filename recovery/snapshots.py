"""Snapshots in Delta Lake through delta-rs: no JVM on the workers' path.

Tables under ``<warehouse>/<app>/``, columns from the actor schemas
(:mod:`epochal.schemas.arrow`), so any Spark user reads them as plain Delta tables:

- ``state/<actor_type>``: one row per actor; a Delta version per snapshot that changed the type,
  so time travel is history;
- ``changes/<actor_type>``: append-only change rows (``_ssid``, ``_epoch``, ``_key``,
  ``_deleted``, the value);
- ``commands`` and ``outbox``: append-only log tables (:mod:`epochal.recovery.log_tables`);
  the committer joins the outcomes every worker reports onto the archived epochs;
- ``snapshots``: the manifest, a row per complete snapshot, appended **last**.

The work is split so that no epoch waits for Delta: each worker writes its changed actors as
Parquet files into ``changes/<type>`` without committing them (:meth:`DeltaSnapshots.write`, on a
thread), and one committer (worker 0) turns the parts of every worker into one Delta version of
each changes table, merges them into the state tables and appends the manifest row
(:meth:`DeltaSnapshots.commit`, on a thread; delta-rs works outside the GIL).

Nothing half-done is ever used: a snapshot without its manifest row does not exist, and a
commit first puts back, to the versions the last manifest row names, any table an unfinished
commit (a process killed mid-snapshot) moved on. Recovery (:meth:`DeltaSnapshots.restore`) takes
the newest snapshot whose tables read back complete, skipping, with a warning, one that does not.
"""

from __future__ import annotations

import functools
import logging
import operator
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import msgspec
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable, Field, write_deltalake
from deltalake.exceptions import DeltaError, TableNotFoundError
from deltalake.fs import DeltaStorageHandler
from deltalake.transaction import AddAction, RemoveAction

from epochal.actors.api import App
from epochal.actors.digest import DigestSum, hash_sum
from epochal.actors.snapshots import Reported, Restored
from epochal.actors.store import Change, changes_by_type
from epochal.config import SnapshotConfig
from epochal.errors import RecoveryError
from epochal.log.client import KafkaClients
from epochal.recovery.log_tables import (
    COMMANDS_DISTINCT,
    COMMANDS_SCHEMA,
    OUTBOX_SCHEMA,
    ArchivedEpoch,
    archived_epoch,
    commands_table,
    epochs_of,
    interior_table,
    outbox_table,
    outcomes_of,
    outcomes_table,
    reported_commands_table,
    with_outcomes,
)
from epochal.recovery.schema_evolution import app_schemas, evolve_table, migrations_for
from epochal.schemas.arrow import RowLayout
from epochal.schemas.commands import ActorKey, EpochRecord
from epochal.schemas.snapshots import (
    ChangeFile,
    LogFile,
    Manifest,
    OutboxRow,
    Outcomes,
    SnapshotPart,
)

__all__ = [
    "ACTOR_COLUMNS",
    "DeltaSnapshots",
    "Warehouse",
    "actor_rows",
    "expiry_batch",
    "read_manifests",
    "snapshot_bytes",
]

logger = logging.getLogger(__name__)

_MANIFEST_SCHEMA = pa.schema([
    pa.field("ssid", pa.int64(), nullable=False),
    pa.field("epoch", pa.int64(), nullable=False),
    pa.field("time", pa.timestamp("ms", tz="UTC"), nullable=False),
    pa.field("command_log_position", pa.int64(), nullable=False),
    pa.field("input_positions", pa.map_(pa.string(), pa.int64())),
    pa.field("state_versions", pa.map_(pa.string(), pa.int64())),
    pa.field("change_versions", pa.map_(pa.string(), pa.int64())),
    pa.field("actors", pa.map_(pa.string(), pa.int64())),
    pa.field("digest", pa.string(), nullable=False),
    pa.field("carried", pa.binary()),
    pa.field("partitions", pa.int64(), nullable=False),
    pa.field("code_hash", pa.string(), nullable=False),
    pa.field("log_versions", pa.map_(pa.string(), pa.int64())),
    pa.field("recovery", pa.string(), nullable=False),
    pa.field("points", pa.string()),  # JSON: {actor type: [split point, ...]}
    pa.field("partition_actors", pa.list_(pa.int64())),
    pa.field("schemas", pa.string()),  # JSON: {actor type: {field: {type, default}}}
])  # fmt: skip
_by_ssid = operator.attrgetter("ssid")
_LOG_TABLES = {"commands": COMMANDS_SCHEMA, "outbox": OUTBOX_SCHEMA}
_CHECKPOINT_EVERY = 20
_ARCHIVE_BATCH_TXNS = 10_000
"""Archived epochs are decoded and turned into rows this many transactions at a time."""


def expiry_batch(keep: int) -> int:
    """How many snapshots past ``keep`` a running cluster lets gather before it expires them
    together: half of ``keep``, at least one. An expiry (the manifest rows deleted, the state
    tables' files listed by delta-rs and those no kept snapshot reads deleted) cost ~55 ms of
    CPU whether one snapshot went or several, more than the commit itself, at each snapshot
    (every second by default); so between ``keep`` and ``keep + keep // 2`` are kept (10 to
    15 by default; with ``keep`` 1, 2 or 3 they expire at every snapshot)."""
    return max(1, keep // 2)


@dataclass(frozen=True)
class Warehouse:
    """Where an app's tables live: ``<root>/<app>/...``; ``root`` is a path or any URI delta-rs
    takes (``s3://...``), ``storage_options`` its credentials."""

    root: str
    app: str
    storage_options: Mapping[str, str] | None = None

    def uri(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), self.app, *parts])

    def state(self, actor_type: str) -> str:
        return self.uri("state", actor_type)

    def changes(self, actor_type: str) -> str:
        return self.uri("changes", actor_type)

    def log(self, table: str) -> str:
        """``commands`` or ``outbox``."""
        return self.uri(table)

    @property
    def manifest(self) -> str:
        return self.uri("snapshots")

    @property
    def options(self) -> dict[str, str] | None:
        return dict(self.storage_options) if self.storage_options else None

    def files(self, uri: str) -> tuple[pafs.FileSystem, str]:
        """A filesystem for the Parquet files under ``uri`` (a table of this warehouse), and
        ``uri``'s path in it: a local path as it is; any other URI through delta-rs's object
        store, so the files go where the Delta commits do, with the same storage options
        (pyarrow's own ``from_uri`` would not see them)."""
        if "://" not in self.root:
            return pafs.LocalFileSystem(), uri
        root = self.root.rstrip("/")
        handler = DeltaStorageHandler(root, self.options)
        return pafs.PyFileSystem(handler), uri.removeprefix(root).strip("/")


def _manifest_row(manifest: Manifest) -> pa.Table:
    row = msgspec.structs.asdict(manifest)
    row["time"] = manifest.time_ms
    del row["time_ms"]
    row["points"] = msgspec.json.encode(manifest.points).decode() if manifest.points else None
    row["schemas"] = msgspec.json.encode(manifest.schemas).decode() if manifest.schemas else None
    return pa.Table.from_pylist([row], schema=_MANIFEST_SCHEMA)


def _manifest_of(row: dict[str, object]) -> Manifest:
    time_value = row.pop("time")
    row["time_ms"] = round(time_value.timestamp() * 1000)  # type: ignore[attr-defined]
    for name in ("input_positions", "state_versions", "change_versions", "actors", "log_versions"):
        row[name] = dict(row[name] or [])  # type: ignore[call-overload]
    points = row.get("points")
    row["points"] = msgspec.json.decode(points) if isinstance(points, str) else {}
    schemas = row.get("schemas")
    row["schemas"] = msgspec.json.decode(schemas) if isinstance(schemas, str) else {}
    row["partition_actors"] = row.get("partition_actors") or []
    return msgspec.convert(row, Manifest)


def read_manifests(warehouse: Warehouse, table: DeltaTable | None = None) -> list[Manifest]:
    """Every complete snapshot in ``warehouse``, oldest first (none before the first); from
    ``table``, the manifest table already open, if given."""
    try:
        table = table or DeltaTable(warehouse.manifest, storage_options=warehouse.options)
    except TableNotFoundError:
        return []
    rows = sorted(table.to_pyarrow_table().to_pylist(), key=lambda row: row["ssid"])
    return [_manifest_of(row) for row in rows]


def snapshot_bytes(warehouse: Warehouse, manifest: Manifest) -> int:
    """The bytes of the state files a snapshot holds: each actor type's state table at the
    version the manifest row names (what a restore reads)."""
    total = 0
    for actor_type, version in manifest.state_versions.items():
        table = DeltaTable(
            warehouse.state(actor_type), version=version, storage_options=warehouse.options
        )
        sizes = pa.table(table.get_add_actions(flatten=True)).column("size_bytes")
        total += sum(size for size in sizes.to_pylist() if size is not None)
    return total


ACTOR_COLUMNS = ("_key", "_state")  # what a restore needs of a state row


def actor_rows(data: pa.Table) -> list[tuple[ActorKey, bytes]]:
    """``(key, canonical bytes)`` of state rows read with :data:`ACTOR_COLUMNS`: what a restore
    loads and a snapshot read (:mod:`epochal.recovery.snapshot_reads`) answers."""
    return list(zip(data.column("_key").to_pylist(), data.column("_state").to_pylist(),
                    strict=True))  # fmt: skip


class DeltaSnapshots:
    """One app's snapshots in its warehouse.

    >>> snapshots = DeltaSnapshots(app, SnapshotConfig("warehouse"), partitions=4)
    >>> part = snapshots.write(ssid=120, worker=0, changes=changes)   # each worker, on a thread
    >>> snapshots.commit([part, ...], epoch=120)                     # worker 0, on a thread
    """

    def __init__(
        self,
        app: App,
        config: SnapshotConfig,
        partitions: int,
        clients: KafkaClients | None = None,
    ) -> None:
        self.app = app
        self.config = config
        self.partitions = partitions
        self.clients = clients  # to trim the logs back to the oldest snapshot kept
        self.warehouse = Warehouse(config.warehouse, app.name, config.storage_options)
        self.layouts = {
            name: RowLayout.of(t.state, t.key_type) for name, t in app.actor_types.items()
        }
        self.schemas = app_schemas(app)  # recorded with every snapshot, checked at each start
        self._evolved = False  # the actor tables hold this code's columns (once per process)
        self._code_hash = ""
        self._unjoined: dict[str, pa.Table] = {}  # commands files written here, until committed
        self._open: dict[str, DeltaTable] = {}  # the committer's tables (:meth:`_current`)
        self._fresh: set[str] = set()  # of those, the ones brought up to date in this step
        self._known: tuple[int, list[Manifest]] | None = None  # manifests at a table version
        self._vacuumed: dict[str, int] = {}  # per state table, the oldest version kept then
        self._trimmed_to = -1  # the oldest snapshot kept when this process last trimmed the logs

    # --- tables --------------------------------------------------------------------------

    def ensure_tables(self, code_hash: str) -> None:
        """Create the app's empty tables if missing (at start, never inside a snapshot)."""
        self._step()
        self._code_hash = code_hash
        options = self.warehouse.options
        for name, layout in self.layouts.items():
            tables = [(self.warehouse.state(name), layout.state_schema()),
                      (self.warehouse.changes(name), layout.change_schema())]  # fmt: skip
            for uri, schema in tables:
                DeltaTable.create(uri, schema, mode="ignore", storage_options=options)
        for table, schema in _LOG_TABLES.items():
            DeltaTable.create(self.warehouse.log(table), schema, mode="ignore",
                              storage_options=options)  # fmt: skip
        DeltaTable.create(
            self.warehouse.manifest, _MANIFEST_SCHEMA, mode="ignore", storage_options=options
        )
        self._evolve(self.warehouse.manifest, _MANIFEST_SCHEMA)  # an app of an older epochal

    def _table(self, uri: str, version: int | None = None) -> DeltaTable:
        return DeltaTable(uri, version=version, storage_options=self.warehouse.options)

    def _current(self, uri: str) -> DeltaTable:
        """Table ``uri`` at its latest version, for the committer (its thread alone calls
        this). Each table is opened once, then brought up to date by reading only the commits
        since, once per step (:meth:`_step`): within one, this process is the only writer and
        its writes move the object on. Opening each table afresh read its last checkpoint and
        every commit after: a snapshot's commit and upkeep opened 17, half of their CPU."""
        table = self._open.get(uri)
        if table is None:
            table = self._open[uri] = self._table(uri)
        elif uri not in self._fresh:
            table.update_incremental()
        self._fresh.add(uri)
        return table

    def _step(self) -> None:
        """A commit or upkeep begins: another process may have moved any table on since."""
        self._fresh.clear()

    def _manifests(self) -> list[Manifest]:
        """:meth:`manifests`, for the committer: read again only if the manifest table has
        moved on since this process last read or wrote it."""
        table = self._current(self.warehouse.manifest)
        if self._known is None or self._known[0] != table.version():
            self._known = (table.version(), read_manifests(self.warehouse, table))
        return list(self._known[1])

    def manifests(self) -> list[Manifest]:
        """Every complete snapshot, oldest first."""
        return read_manifests(self.warehouse)

    def latest(self) -> Manifest | None:
        """The newest complete snapshot's manifest row, or None before the first."""
        manifests = self.manifests()
        return manifests[-1] if manifests else None

    def archived_epochs(self, manifest: Manifest) -> list[EpochRecord]:
        """Every epoch up to ``manifest``'s, as its ``commands`` archive holds them: the
        command log the serial oracle needs to check a snapshot, after retention trimmed it."""
        commands = self._table(self.warehouse.log("commands"), manifest.log_versions["commands"])
        return epochs_of(commands.to_pyarrow_table())

    # --- a worker's part ------------------------------------------------------------------

    def write(
        self,
        ssid: int,
        worker: int,
        changes: Sequence[Change],
        *,
        commands: Sequence[EpochRecord] = (),
        outbox: Sequence[OutboxRow] = (),
        reported: Sequence[Reported] = (),
        archived: Sequence[msgspec.Raw] = (),
    ) -> SnapshotPart:
        """Write ``changes`` (one worker's, at the end of epoch ``ssid``) as uncommitted Parquet
        files; the part says where they are and what they add to the digest. The log tables
        get their rows the same way: ``outbox`` (weak mode: the egress these epochs hold back),
        the interior transactions in ``reported`` (what this worker's transactions did since
        the last snapshot), and the epochs since the last snapshot, either as the logged
        transactions of ``reported`` among ``archived`` (each epoch's msgpack) with their
        outcomes (a cluster's workers, worker 0 adding the epochs without any) or whole
        (``commands``: then the part carries the outcomes of ``reported`` for the committer to
        join onto them)."""
        by_type = changes_by_type(changes)
        delta = sum(
            hash_sum(name, c.keys, c.after) - hash_sum(name, c.keys, c.before)
            for name, c in by_type.items()
        )
        files = tuple(
            self._write_file(
                name, self.layouts[name].change_table(ssid, ssid, c.keys, c.after), worker
            )
            for name, c in sorted(by_type.items())
        )
        logs = []
        archive = [commands_table(self.app, ssid, commands)] if commands else []
        archive += self._archived_tables(ssid, archived, reported, empty_epochs=worker == 0)
        if any(r.interior for r in reported):
            archive.append(interior_table(self.app, ssid, reported))
        archive = [table for table in archive if table.num_rows]
        if archive:
            table = pa.concat_tables(archive)
            logs.append(self._write_log("commands", table, worker))
            if commands:  # its outcomes are joined at the commit: spare reading it back there
                self._unjoined[logs[-1].path] = table
        if outbox:
            logs.append(self._write_log("outbox", outbox_table(ssid, outbox), worker))
        joined = reported and not archived  # archived rows carry their outcomes already
        outcomes = msgspec.msgpack.encode(outcomes_of(reported)) if joined else b""
        changed = sum(len(c.keys) for c in by_type.values())
        return SnapshotPart(ssid, worker, files, DigestSum(delta).hex(), changed,
                            logs=tuple(logs), outcomes=outcomes)  # fmt: skip

    def _archived_tables(
        self,
        ssid: int,
        archived: Sequence[msgspec.Raw],
        reported: Sequence[Reported],
        *,
        empty_epochs: bool,
    ) -> list[pa.Table]:
        """The ``commands`` rows of ``archived`` (:func:`reported_commands_table`), a batch of
        epochs at a time: decoded all at once, a snapshot interval's epochs (a dozen objects a
        transaction, 60-70k transactions in a drain) raised the snapshot process's memory to the
        largest interval it ever wrote, and kept it there."""
        rows = functools.partial(
            reported_commands_table, self.app, ssid, reported=reported, empty_epochs=empty_epochs
        )
        tables: list[pa.Table] = []
        batch: list[ArchivedEpoch] = []
        size = 0
        for raw in archived:  # a batch becomes rows before the next is decoded
            batch.append(archived_epoch(raw))
            size += len(batch[-1].txns)
            if size >= _ARCHIVE_BATCH_TXNS:
                tables.append(rows(batch))
                batch, size = [], 0
        if batch:
            tables.append(rows(batch))
        return tables

    def _write_file(self, actor_type: str, table: pa.Table, worker: int) -> ChangeFile:
        name, size = self._write_parquet(self.warehouse.changes(actor_type), table, worker)
        return ChangeFile(actor_type, name, size, table.num_rows)

    def _write_log(self, log_table: str, table: pa.Table, worker: int) -> LogFile:
        distinct = COMMANDS_DISTINCT if log_table == "commands" else frozenset()
        root = self.warehouse.log(log_table)
        name, size = self._write_parquet(root, table, worker, distinct=distinct)
        return LogFile(log_table, name, size, table.num_rows)

    def _write_parquet(
        self,
        root: str,
        table: pa.Table,
        worker: int,
        name: str = "",
        distinct: frozenset[str] = frozenset(),
    ) -> tuple[str, int]:
        """Write ``table`` as one Parquet file, its ``distinct`` columns (values that seldom
        repeat) without a dictionary; its name and size."""
        name = name or f"part-w{worker}-{uuid.uuid4().hex}.parquet"
        filesystem, path = self.warehouse.files(root)
        filesystem.create_dir(path, recursive=True)
        repeated = [c for c in table.column_names if c not in distinct] if distinct else True
        pq.write_table(table, f"{path}/{name}", filesystem=filesystem, use_dictionary=repeated)
        return name, int(filesystem.get_file_info(f"{path}/{name}").size)

    # --- the committer -------------------------------------------------------------------

    def commit(self, parts: Sequence[SnapshotPart], epoch: int) -> Manifest:
        """Make snapshot ``epoch`` from every worker's part: changes, state, manifest last.

        Idempotent: a snapshot already in the manifest is left as it is.
        """
        written = {f.path: self._unjoined.pop(f.path) for part in parts for f in part.logs
                   if f.path in self._unjoined}  # fmt: skip
        self._step()
        manifests = self._manifests()
        done = next((m for m in manifests if m.ssid == epoch), None)
        if done is not None:
            return done
        previous = manifests[-1] if manifests else None
        self._put_back(previous)
        files: dict[str, list[ChangeFile]] = {}
        for part in parts:
            for file in part.files:
                files.setdefault(file.actor_type, []).append(file)
        state_versions = dict(previous.state_versions) if previous else {}
        change_versions = dict(previous.change_versions) if previous else {}
        actors = dict(previous.actors) if previous else {}
        if not self._evolved:
            self._evolve_actor_tables(state_versions, change_versions)
        for name, type_files in sorted(files.items()):
            change_versions[name] = self._append(self.warehouse.changes(name), type_files)
            state_versions[name], added = self._merge_state(name, type_files)
            actors[name] = actors.get(name, 0) + added
        log_versions = dict(previous.log_versions) if previous else {}
        joined = self._join_outcomes(parts, epoch, written)
        for table, schema in _LOG_TABLES.items():
            log_files = [joined.get(f.path, f) for part in parts for f in part.logs
                         if f.table == table]  # fmt: skip
            if log_files:
                self._evolve(self.warehouse.log(table), schema)
                log_versions[table] = self._append(self.warehouse.log(table), log_files)
        head = next(p for p in parts if p.worker == 0)
        digest = DigestSum(int(previous.digest, 16) if previous else 0)
        for part in parts:
            digest.total = (digest.total + int(part.digest_delta, 16)) % 2**256
        manifest = Manifest(
            epoch, epoch, head.time_ms, head.command_log_position, dict(head.input_positions),
            state_versions, change_versions, actors, digest.hex(), head.carried, self.partitions,
            self._code_hash, log_versions, self.config.recovery,
            head.points, self._shares(parts), self.schemas,
        )  # fmt: skip
        rows = self._current(self.warehouse.manifest)
        write_deltalake(rows, _manifest_row(manifest), mode="append",
                        storage_options=self.warehouse.options)  # fmt: skip
        self._known = (rows.version(), sorted([*manifests, manifest], key=_by_ssid))
        self._evolved = True
        self._delete_replaced(joined)
        return manifest

    def _shares(self, parts: Sequence[SnapshotPart]) -> list[int]:
        """The actors of each partition, if every part counted its own (else unknown: [])."""
        shares = [0] * self.partitions
        for part in parts:
            if not part.partition_actors:
                return []
            for partition, count in part.partition_actors.items():
                if partition >= self.partitions:
                    return []
                shares[partition] += count
        return shares

    def _join_outcomes(
        self, parts: Sequence[SnapshotPart], ssid: int, written: Mapping[str, pa.Table]
    ) -> dict[str, LogFile]:
        """The ``commands`` files of ``parts`` with the outcomes the parts report joined on, as
        new files, by the path of the file each replaces (files that gain nothing stay).
        ``written``: the tables of files written by this process, not to read back."""
        reports = [msgspec.msgpack.decode(p.outcomes, type=Outcomes) for p in parts if p.outcomes]
        if not reports:
            return {}
        outcomes = outcomes_table(reports)
        root = self.warehouse.log("commands")
        filesystem, path = self.warehouse.files(root)
        joined: dict[str, LogFile] = {}
        for part in parts:
            for file in part.logs:
                if file.table != "commands":
                    continue
                table = written.get(file.path)
                if table is None:
                    table = pq.read_table(f"{path}/{file.path}", filesystem=filesystem)
                done = with_outcomes(table, outcomes)
                if done is None:
                    continue
                table, missing = done
                if missing:
                    logger.warning("archived transactions without an outcome ssid=%d rows=%d "
                                   "file=%s", ssid, missing, file.path)  # fmt: skip
                name = file.path.removesuffix(".parquet") + "-outcomes.parquet"
                _, size = self._write_parquet(root, table, part.worker, name, COMMANDS_DISTINCT)
                joined[file.path] = LogFile("commands", name, size, table.num_rows)
        return joined

    def _delete_replaced(self, joined: Mapping[str, LogFile]) -> None:
        """After the commit: the files the joined ones replaced are in no table version; delete
        them (a crash before leaves them behind, never read)."""
        self._delete(self.warehouse.log("commands"), list(joined))

    def _evolve(self, uri: str, schema: pa.Schema) -> None:
        """Add the columns of ``schema`` a table made by an older epochal lacks (rows written
        before read them as null)."""
        table = self._current(uri)
        have = set(table.schema().to_arrow().names)
        missing = [Field.from_arrow(f) for f in schema if f.name not in have]
        if missing:
            logger.info("table gains columns table=%s columns=%s", uri,
                        [f.name for f in missing])  # fmt: skip
            table.alter.add_columns(missing)

    def _put_back(self, previous: Manifest | None) -> None:
        """Undo what an unfinished commit left: every table back to the last manifest's version.

        Only :meth:`commit` makes versions of these tables (appends, merges, added columns and
        these restores); upkeep makes none (:meth:`_vacuum` commits nothing, a checkpoint is
        no version). So a table past the version the last manifest row names was moved on by a
        commit that never wrote its row, and nothing else: that is why the check is a plain
        version comparison and needs no reading of the tables' history."""
        state = previous.state_versions if previous else {}
        changes = previous.change_versions if previous else {}
        logs = previous.log_versions if previous else {}
        wanted = [(self.warehouse.log(name), logs.get(name, 0)) for name in _LOG_TABLES]
        for name in self.layouts:
            wanted.append((self.warehouse.state(name), state.get(name, 0)))
            wanted.append((self.warehouse.changes(name), changes.get(name, 0)))
        for uri, version in wanted:
            table = self._current(uri)
            if table.version() > version:
                logger.warning(
                    "putting back a table an unfinished snapshot moved on table=%s "
                    "version=%d to=%d", uri, table.version(), version,
                )  # fmt: skip
                table.restore(version)

    def _evolve_actor_tables(
        self, state_versions: dict[str, int], change_versions: dict[str, int]
    ) -> None:
        """Give the actor tables the columns of this code's schemas, the new versions in the
        manifest's maps (at the first commit of a process: after :meth:`_put_back`, so that an
        unfinished commit cannot take them back)."""
        for name, layout in self.layouts.items():
            for uri, schema, versions in (
                (self.warehouse.state(name), layout.state_schema(), state_versions),
                (self.warehouse.changes(name), layout.change_schema(), change_versions),
            ):
                if evolve_table(uri, schema, self.warehouse.options):
                    self._fresh.discard(uri)  # moved on by another object
                    versions[name] = int(self._current(uri).version())

    def _append(self, uri: str, files: Sequence[ChangeFile | LogFile]) -> int:
        """Add written files to an append-only table in one Delta version; that version. The
        table's schema stays (columns of removed fields read null in the new files)."""
        now = int(time.time() * 1000)
        actions: list[AddAction | RemoveAction] = [
            AddAction(f.path, f.size, {}, now, True, f'{{"numRecords":{f.rows}}}') for f in files
        ]
        table = self._current(uri)
        table.create_write_transaction(actions, "append", table.schema())
        table.update_incremental()  # the transaction leaves the table object where it was
        return int(table.version())

    def _merge_state(self, actor_type: str, files: list[ChangeFile]) -> tuple[int, int]:
        """Upsert and delete the changed actors into ``state/<type>``; (version, actors added).
        Columns of fields the code no longer has are null in the rows it writes, as in the
        change rows."""
        filesystem, root = self.warehouse.files(self.warehouse.changes(actor_type))
        changes = pa.concat_tables(
            [pq.read_table(f"{root}/{f.path}", filesystem=filesystem) for f in files]
        )
        layout = self.layouts[actor_type]
        columns = ["_key", "_state", *layout.fields]
        quoted = {c: f"`{c}`" for c in columns}
        table = self._current(self.warehouse.state(actor_type))
        assignments = {quoted[c]: f"s.{quoted[c]}" for c in columns}
        for field in table.schema().fields:  # a removed field's column: null from now on
            if field.name not in quoted:
                assignments[f"`{field.name}`"] = "NULL"
        merger = table.merge(changes, predicate="t._key = s._key", source_alias="s",
                             target_alias="t")  # fmt: skip
        merger = merger.when_matched_update(assignments, predicate="s._deleted = false")
        merger = merger.when_matched_delete(predicate="s._deleted = true")
        merger = merger.when_not_matched_insert(assignments, predicate="s._deleted = false")
        metrics = merger.execute()
        added = int(metrics.get("num_target_rows_inserted", 0)) - int(
            metrics.get("num_target_rows_deleted", 0)
        )
        return int(self._current(self.warehouse.state(actor_type)).version()), added

    def outbox(
        self, manifest: Manifest, partitions: Sequence[int], from_epoch: int
    ) -> list[OutboxRow]:
        """The held egress and dead letters of ``partitions`` from epoch ``from_epoch`` up to
        snapshot ``manifest``, in the order they were held (weak mode: what a crash kept from
        release). A table written before dead letters were held has no ``key``: None."""
        version = manifest.log_versions.get("outbox")
        if version is None or not partitions:
            return []
        table = self._table(self.warehouse.log("outbox"), version).to_pyarrow_table(
            filters=[("_epoch", ">=", from_epoch), ("_ssid", "<=", manifest.ssid),
                     ("partition", "in", list(partitions))],
        )  # fmt: skip
        table = table.sort_by([("_epoch", "ascending"), ("partition", "ascending"),
                               ("_n", "ascending")])  # fmt: skip
        return [
            OutboxRow(row["_epoch"], row["partition"], row["topic"], row["value"], row.get("key"))
            for row in table.to_pylist()
        ]

    # --- retention ---------------------------------------------------------------------------

    def retain(self, latest: Manifest) -> None:
        """Checkpoint the Delta logs now and then; expire snapshots beyond the configured count
        and age, in batches (:func:`expiry_batch`), then trim the command log and (unless
        ``keep_inputs``) the input topics back to the oldest snapshot kept, once each time it
        moves on. ``keep`` 0 keeps every snapshot and the whole logs."""
        self._step()
        self._checkpoint(latest)
        if self.config.keep <= 0:
            return
        batch = expiry_batch(self.config.keep)
        oldest = self.expire(self.config.keep, self.config.keep_ms, latest.time_ms, batch)
        if oldest is None or self.clients is None or oldest.ssid == self._trimmed_to:
            return
        before: dict[tuple[str, int], int] = {}
        if oldest.recovery == "strong":  # in weak mode there is no command log to trim
            before[self.app.topics.command_log, 0] = oldest.command_log_position
        if not self.config.keep_inputs:
            prefix = self.app.topics.input("")
            for key, offset in oldest.input_positions.items():
                topic, _, partition = key.rpartition(":")
                if topic.startswith(prefix):
                    before[topic, int(partition)] = offset
        self.clients.delete_records(before)
        self._trimmed_to = oldest.ssid

    def _checkpoint(self, latest: Manifest) -> None:
        """A Delta checkpoint every ``_CHECKPOINT_EVERY`` versions of a table: opening a table
        (each restart, each commit reads the manifest) then reads one Parquet file and a few
        commits, not every JSON commit since the table was made."""
        versions = [(self.warehouse.log(t), v) for t, v in latest.log_versions.items()]
        versions += [(self.warehouse.state(t), v) for t, v in latest.state_versions.items()]
        versions += [(self.warehouse.changes(t), v) for t, v in latest.change_versions.items()]
        versions.append((self.warehouse.manifest, self._current(self.warehouse.manifest).version()))
        for uri, version in versions:
            if version > 0 and version % _CHECKPOINT_EVERY == 0:
                self._current(uri).create_checkpoint()

    def expire(self, keep: int, keep_ms: int, now_ms: int, batch: int = 1) -> Manifest | None:
        """Forget snapshots beyond the newest ``keep`` and older than ``keep_ms`` (0: no age
        rule; the newest is always kept), once at least ``batch`` of them are there: their
        manifest rows go, and the state tables' files no kept snapshot reads are deleted,
        without a new table version (:meth:`_vacuum`). Returns the oldest snapshot kept."""
        self._step()
        manifests = self._manifests()
        if not manifests:
            return None
        kept = manifests[-max(1, keep) :]
        if keep_ms > 0:
            young = [m for m in manifests if now_ms - m.time_ms < keep_ms]
            kept = young if len(young) > len(kept) else kept
        if len(manifests) - len(kept) < batch:
            kept = manifests  # not yet: an expiry costs about as much for one as for a batch
        oldest = kept[0]
        if oldest is not manifests[0]:
            table = self._current(self.warehouse.manifest)
            table.delete(f"ssid < {oldest.ssid}")
            self._known = (table.version(), kept)
            for name in self.layouts:
                versions = sorted({m.state_versions.get(name, 0) for m in kept})
                self._vacuum(self.warehouse.state(name), versions)
            logger.info("snapshots expired before ssid=%d kept=%d", oldest.ssid, len(kept))
        return oldest

    def _vacuum(self, uri: str, keep_versions: Sequence[int]) -> None:
        """Delete the files of table ``uri`` that none of ``keep_versions`` reads, **without a
        Delta version**.

        delta-rs's vacuum commits two versions (VACUUM START, VACUUM END) whenever it deletes a
        file, and has no option against it; its listing also names, again, the files an earlier
        vacuum deleted, so every expiry would commit two. Versions a state table gains after
        the manifest row that names its last version are what :meth:`_put_back` takes for an
        unfinished snapshot, and it would restore over them at each commit: four versions per
        snapshot instead of one. So delta-rs only lists the files here (a dry run) and they are
        deleted directly; only those still present, as the listing keeps naming deleted ones.

        Skipped while the oldest version kept is the one kept at this process's last vacuum of
        the table: state versions grow with the snapshots, so then no version was let go (an
        actor type without changes keeps one version for ever), and the listing took longer
        than the commit's merge."""
        if self._vacuumed.get(uri) == keep_versions[0]:
            return
        stale = self._current(uri).vacuum(
            retention_hours=0,
            dry_run=True,
            enforce_retention_duration=False,
            keep_versions=list(keep_versions),
        )
        if stale:
            filesystem, path = self.warehouse.files(uri)
            present = {i.base_name for i in filesystem.get_file_info(pafs.FileSelector(path))}
            self._delete(uri, [name for name in stale if name in present])
        self._vacuumed[uri] = keep_versions[0]

    def _delete(self, uri: str, names: Sequence[str]) -> None:
        """Delete files of table ``uri`` that no table version the manifest names reads; one that
        cannot be deleted stays behind with a warning (it is never read)."""
        filesystem, path = self.warehouse.files(uri)
        for name in names:
            try:
                filesystem.delete_file(f"{path}/{name}")
            except OSError as exc:
                logger.warning(
                    "a file no snapshot reads stays behind table=%s file=%s: %s", uri, name, exc
                )

    # --- recovery -----------------------------------------------------------------------------

    def restore(self, ssid: int | None = None) -> Restored | None:
        """The newest complete snapshot (at or before ``ssid``, if given) whose tables read back
        whole, or None if there is none.

        A snapshot whose files are missing or unreadable, or whose actor counts differ from its
        manifest row, is skipped with a warning naming it; the one before is tried.
        """
        manifests = [m for m in self.manifests() if ssid is None or m.ssid <= ssid]
        for manifest in reversed(manifests):
            try:
                actors = {name: self._actors(name, manifest) for name in self.layouts}
            except (DeltaError, OSError, pa.ArrowException, RecoveryError) as exc:
                logger.warning("snapshot skipped ssid=%d: %s", manifest.ssid, exc)
                continue
            return Restored(manifest, actors, migrations_for(self.app, manifest))
        return None

    def states(
        self, actor_type: str, manifest: Manifest, columns: Sequence[str] = ("_state",)
    ) -> pa.Table:
        """``columns`` of ``actor_type``'s actors in snapshot ``manifest``."""
        version = manifest.state_versions.get(actor_type, 0)
        table = self._table(self.warehouse.state(actor_type), version)
        return table.to_pyarrow_table(columns=list(columns))

    def _actors(self, actor_type: str, manifest: Manifest) -> list[tuple[ActorKey, bytes]]:
        data = self.states(actor_type, manifest, ACTOR_COLUMNS)
        expected = manifest.actors.get(actor_type, 0)
        if data.num_rows != expected:
            raise RecoveryError(
                "a snapshot's state table holds another number of actors than its manifest says",
                ssid=manifest.ssid, table=self.warehouse.state(actor_type),
                version=manifest.state_versions.get(actor_type, 0), rows=data.num_rows,
                expected=expected,
            )  # fmt: skip
        return actor_rows(data)
