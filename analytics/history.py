"""Spark SQL over an app's history: temp views on any SparkSession that has Delta configured.

:func:`register_views` reads the app's tables under ``<warehouse>/<app>/`` (docs/recovery.md) and
registers, for each actor type (view names are the type's name in lower case; ``prefix`` goes
before every view's name):

- ``<actor>``: the actors at the latest snapshot;
- ``<actor>_history``: the actors at every retained snapshot, a row per actor per snapshot, with
  the snapshot's ``_ssid``, ``_epoch`` and ``_time`` first;
- ``<actor>_changes``: the change rows, a row per changed actor per snapshot;

and, once per app, ``snapshots`` (the manifest) and ``commands`` (the archived command log).

**A Delta version is not an ssid.** Every view reads its table at the version the latest
manifest row names, never simply the newest one: a snapshot being committed moves the tables on
before its manifest row exists, and must not be seen. ``<actor>_history`` is built from the
change rows, not from one time-travel read per snapshot: a change of a key holds from its
snapshot until the next change of that key, and joining these spans with the manifest gives
each retained snapshot's actors in one scan, whatever the number of snapshots. The change
tables are never trimmed, so this stays right after old snapshots expire and their state files
are vacuumed.

    >>> register_views(spark, "bank", "warehouse")
    >>> spark.sql("SELECT _ssid, sum(balance) FROM account_history GROUP BY _ssid").show()
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from epochal.config import resolve_warehouse
from epochal.errors import QueryError, SnapshotNotRetainedError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["query_rows", "register_views", "state_at"]

logger = logging.getLogger(__name__)


class AppLike(Protocol):
    """What the views need of an :class:`epochal.App`: its name and its actor types' names."""

    name: str

    @property
    def actor_types(self) -> Mapping[str, object]: ...


@dataclass(frozen=True)
class _Snapshot:
    """The part of a manifest row the views need."""

    ssid: int
    time_ms: int
    state_versions: Mapping[str, int]
    change_versions: Mapping[str, int]
    log_versions: Mapping[str, int]


@dataclass(frozen=True)
class _Tables:
    """An app's Delta tables, read through one Spark session."""

    spark: SparkSession
    root: str
    app: str
    options: Mapping[str, str]

    def uri(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), self.app, *parts])

    def read(self, *parts: str, version: int | None = None) -> DataFrame:
        """The table at ``<root>/<app>/<parts>``, at ``version`` (None: the newest)."""
        from pyspark.errors import AnalysisException

        reader = self.spark.read.format("delta").options(**self.options)
        if version is not None:
            reader = reader.option("versionAsOf", version)
        try:
            return reader.load(self.uri(*parts))
        except AnalysisException as exc:
            raise QueryError(
                "cannot read a table of the app (wrong warehouse or app name?)",
                table=self.uri(*parts), version=version, reason=_reason(exc),
            ) from exc  # fmt: skip

    def manifest(self) -> DataFrame:
        """The manifest at its newest version, pinned: views built on it never see a snapshot
        committed after they were registered, whose changes they do not read."""
        from delta.tables import DeltaTable
        from pyspark.errors import AnalysisException

        uri = self.uri("snapshots")
        try:
            if _jvm(self.spark) is None:  # Spark Connect: DeltaTable needs Delta's server plugin
                if self.options:
                    raise QueryError(
                        "storage options need a session with a JVM: give them to the Spark "
                        "Connect server as spark.hadoop.* settings", table=uri,
                    )  # fmt: skip
                history = self.spark.sql(f"DESCRIBE HISTORY delta.`{uri}` LIMIT 1")
            else:
                history = DeltaTable.forPath(self.spark, uri, dict(self.options)).history(1)
            version = int(history.select("version").collect()[0][0])
        except AnalysisException as exc:
            raise QueryError(
                "the app has no snapshot manifest here (wrong warehouse or app name?)",
                table=uri, reason=_reason(exc),
            ) from exc  # fmt: skip
        return self.read("snapshots", version=version)


def _snapshots(manifest: DataFrame) -> list[_Snapshot]:
    """Every snapshot of ``manifest``, oldest first."""
    rows = manifest.selectExpr(
        "ssid", "unix_millis(time) AS time_ms", "state_versions", "change_versions",
        "log_versions",
    ).collect()  # fmt: skip
    snapshots = [
        _Snapshot(
            r.ssid, r.time_ms, r.state_versions or {}, r.change_versions or {}, r.log_versions or {}
        )
        for r in rows
    ]
    return sorted(snapshots, key=lambda s: s.ssid)


def _actor_types(tables: _Tables, snapshots: list[_Snapshot]) -> list[str]:
    """The actor types whose tables are under ``state/``, and any the manifest names."""
    names = {name for s in snapshots for name in s.state_versions}
    jvm = _jvm(tables.spark)
    if jvm is None:  # a Spark Connect session: no JVM here, the manifest must do
        return sorted(names)
    conf = jvm.org.apache.hadoop.conf.Configuration(
        tables.spark.sparkContext._jsc.hadoopConfiguration()
    )
    for key, value in tables.options.items():
        conf.set(key, value)
    path = jvm.org.apache.hadoop.fs.Path(tables.uri("state"))
    filesystem = path.getFileSystem(conf)
    if filesystem.exists(path):
        names.update(s.getPath().getName() for s in filesystem.listStatus(path) if s.isDirectory())
    return sorted(names)


def _jvm(spark: SparkSession) -> Any:
    """The session's JVM gateway; None for a Spark Connect session, whose JVM is a server's."""
    return getattr(spark, "_jvm", None)


def _tables(
    spark: SparkSession, app: AppLike | str, warehouse: str, options: Mapping[str, str] | None
) -> _Tables:
    name = app if isinstance(app, str) else app.name
    return _Tables(spark, resolve_warehouse(warehouse), name, dict(options or {}))


def register_views(
    spark: SparkSession,
    app: AppLike | str,
    warehouse: str = "warehouse",
    storage_options: Mapping[str, str] | None = None,
    *,
    prefix: str = "",
) -> list[str]:
    """Register the app's views (module docstring) as temp views of ``spark``; their names.

    ``app`` is an :class:`epochal.App` or an app's name (its actor types are then the folders
    under ``<warehouse>/<app>/state``). ``storage_options`` pass to every Delta read (Hadoop
    file-system settings such as ``fs.s3a.access.key``). The views are fixed at the latest
    snapshot when registered; register again to see newer ones.

    >>> register_views(spark, app, "warehouse", prefix="bank_")
    ['bank_account', 'bank_account_changes', 'bank_account_history', 'bank_commands', ...]
    """
    tables = _tables(spark, app, warehouse, storage_options)
    manifest = tables.manifest()
    snapshots = _snapshots(manifest)
    latest = snapshots[-1] if snapshots else None
    types = list(app.actor_types) if not isinstance(app, str) else _actor_types(tables, snapshots)
    views: dict[str, DataFrame] = {
        f"{prefix}snapshots": manifest,
        f"{prefix}commands": tables.read(
            "commands", version=latest.log_versions.get("commands", 0) if latest else 0
        ),
    }
    for actor_type in types:
        name = f"{prefix}{actor_type.lower()}"
        changes = tables.read(
            "changes", actor_type,
            version=latest.change_versions.get(actor_type, 0) if latest else 0,
        )  # fmt: skip
        state = tables.read(
            "state", actor_type, version=latest.state_versions.get(actor_type, 0) if latest else 0
        )
        for view, frame in ((name, state), (f"{name}_history", _history(changes, manifest)),
                            (f"{name}_changes", changes)):  # fmt: skip
            if view in views:
                raise QueryError(
                    "two views would have the same name: rename with a prefix",
                    view=view, actor_type=actor_type,
                )  # fmt: skip
            views[view] = frame
    _create_views(views)
    logger.info("views registered app=%s views=%d latest_ssid=%s", tables.app, len(views),
                latest.ssid if latest else None)  # fmt: skip
    return sorted(views)


def _create_views(views: Mapping[str, DataFrame]) -> None:
    """Temp views of the frames; on Spark Connect a missing table shows here, not at its read."""
    from pyspark.errors import PySparkException

    for view, frame in views.items():
        try:
            frame.createOrReplaceTempView(view)
        except PySparkException as exc:
            raise QueryError(
                "cannot read a table of the app (wrong warehouse or app name?)",
                view=view, reason=_reason(exc),
            ) from exc  # fmt: skip


def _history(changes: DataFrame, manifest: DataFrame) -> DataFrame:
    """Each retained snapshot's actors from the change rows: a change holds from its snapshot
    until the next change of its key (a deleted actor's change holds nothing)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    spans = changes.withColumn(
        "_until", F.lead("_ssid").over(Window.partitionBy("_key").orderBy("_ssid"))
    ).alias("c")
    cuts = manifest.select(
        F.col("ssid").alias("_cut_ssid"),
        F.col("epoch").alias("_cut_epoch"),
        F.col("time").alias("_cut_time"),
    )
    within = (F.col("_cut_ssid") >= F.col("c._ssid")) & (
        F.col("c._until").isNull() | (F.col("_cut_ssid") < F.col("c._until"))
    )
    values = [c for c in changes.columns if c not in ("_ssid", "_epoch", "_deleted")]
    return (
        spans.join(F.broadcast(cuts), within)
        .where(~F.col("c._deleted"))
        .select(
            F.col("_cut_ssid").alias("_ssid"),
            F.col("_cut_epoch").alias("_epoch"),
            F.col("_cut_time").alias("_time"),
            *(F.col(f"c.`{c}`") for c in values),
        )
    )


def state_at(
    spark: SparkSession,
    app: AppLike | str,
    actor_type: str,
    *,
    ssid: int | None = None,
    time: datetime.datetime | int | None = None,
    warehouse: str = "warehouse",
    storage_options: Mapping[str, str] | None = None,
) -> DataFrame:
    """The actors of ``actor_type`` at snapshot ``ssid``, or at the newest snapshot taken at or
    before ``time`` (a datetime, naive ones taken as UTC, or milliseconds since the Unix epoch),
    or at the latest snapshot if neither is given.

    Raises :class:`SnapshotNotRetainedError` when no retained snapshot matches.

    >>> state_at(spark, "bank", "Account", ssid=120).agg({"balance": "sum"}).show()
    """
    if ssid is not None and time is not None:
        raise QueryError("give ssid or time, not both", ssid=ssid, time=time)
    tables = _tables(spark, app, warehouse, storage_options)
    snapshot = _pick(_snapshots(tables.read("snapshots")), ssid, time)
    return tables.read("state", actor_type, version=snapshot.state_versions.get(actor_type, 0))


def _pick(
    snapshots: list[_Snapshot], ssid: int | None, time: datetime.datetime | int | None
) -> _Snapshot:
    """The snapshot ``ssid``, or the newest taken at or before ``time``, or the latest."""
    time_ms = None if time is None else _millis(time)
    if ssid is None and time_ms is None:
        chosen = snapshots[-1:]
    elif time_ms is not None:
        chosen = [s for s in snapshots if s.time_ms <= time_ms][-1:]
    else:
        chosen = [s for s in snapshots if s.ssid == ssid]
    if not chosen:
        retained = (
            {"oldest": snapshots[0].ssid, "newest": snapshots[-1].ssid}
            if snapshots
            else {"retained": "none"}
        )
        raise SnapshotNotRetainedError(
            "no retained snapshot matches: expired, or never taken", ssid=ssid, time_ms=time_ms,
            **retained,
        )  # fmt: skip
    return chosen[0]


def _millis(time: datetime.datetime | int) -> int:
    if isinstance(time, datetime.datetime):
        aware = time if time.tzinfo is not None else time.replace(tzinfo=datetime.UTC)
        return round(aware.timestamp() * 1000)
    return int(time)


def query_rows(spark: SparkSession, query: str) -> tuple[list[str], list[list[Any]]]:
    """Run a SQL query: its column names and its rows as plain Python values (structs as dicts);
    a bad query is a :class:`QueryError` that quotes Spark's reason."""
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    _quiet_query_errors()
    try:
        frame = spark.sql(query)
        rows = [[_python(value) for value in row] for row in frame.collect()]
    except (PySparkException, Py4JError) as exc:  # a failed read in the JVM is a Py4J error
        raise QueryError("the query failed", reason=_reason(exc)) from exc
    return frame.columns, rows


def _quiet_query_errors() -> None:
    """PySpark logs every failed query, JVM stack and all, as JSON on stderr before raising it;
    the error raised says what went wrong in one line."""
    from pyspark.logger import PySparkLogger

    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        PySparkLogger.getLogger(name).disabled = True


def _python(value: Any) -> Any:
    from pyspark.sql import Row

    if isinstance(value, Row):
        return value.asDict(recursive=True)
    if isinstance(value, list):
        return [_python(v) for v in value]
    if isinstance(value, dict):
        return {k: _python(v) for k, v in value.items()}
    return value


def _reason(exc: Exception) -> str:
    """The first line of a Spark error (its message, without the JVM's stack)."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
