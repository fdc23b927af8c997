"""Spark SQL over the history of snapshots (real Spark, real Delta): the views hold what the serial
oracle says each snapshot holds, ignore a commit that never finished, stay right after old
snapshots expire; time travel by ssid and by time; ``epochal sql`` prints a table and JSON."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from epochal.analytics.history import register_views, state_at
from epochal.cli import main
from epochal.config import CacheConfig
from epochal.errors import QueryError, SnapshotNotRetainedError
from tests.integration.snapshot_history import History, build_history, copy_history
from tests.unit.actors.workload import app

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> History:
    return build_history(tmp_path_factory.mktemp("history"), snapshots_wanted=21)


def _accounts(history: History, ssid: int) -> dict[int, tuple[int, int]]:
    return {k: (a.balance, a.touched) for k, a in history.accounts[ssid].items()}


def _every_snapshot(history: History, ssids: list[int]) -> dict[tuple[int, int], tuple[int, int]]:
    return {(s, key): value for s in ssids for key, value in _accounts(history, s).items()}


def _rows(spark: SparkSession, query: str) -> list[tuple[object, ...]]:
    return [tuple(row) for row in spark.sql(query).collect()]


def test_history_of_every_snapshot_counts_and_sums(spark: SparkSession, history: History) -> None:
    assert len(history.ssids) >= 20
    views = register_views(spark, app, history.warehouse)
    assert views == ["account", "account_changes", "account_history", "auditlog",
                     "auditlog_changes", "auditlog_history", "commands", "snapshots"]  # fmt: skip
    totals = _rows(spark, """
        SELECT _ssid, count(*), sum(balance), sum(touched) FROM account_history
        GROUP BY _ssid ORDER BY _ssid""")  # fmt: skip
    expected = [
        (ssid, len(accounts), sum(a.balance for a in accounts.values()),
         sum(a.touched for a in accounts.values()))
        for ssid, accounts in sorted(history.accounts.items())
    ]  # fmt: skip
    assert totals == expected
    # accounts come and go: the counts differ between snapshots
    assert len({count for _, count, _, _ in totals}) > 1
    rows = _rows(spark, "SELECT _ssid, _key, balance, touched FROM account_history")
    assert {(s, k): (b, t) for s, k, b, t in rows} == _every_snapshot(history, history.ssids)
    # each row carries its snapshot's epoch and time, as the manifest says
    stamps = _rows(
        spark,
        """
        SELECT DISTINCT h._ssid, h._epoch, unix_millis(h._time) FROM account_history h""",
    )
    assert sorted(stamps) == [(m.ssid, m.epoch, m.time_ms) for m in history.manifests]


def test_the_actor_view_is_the_latest_snapshot_even_past_an_unfinished_commit(
    spark: SparkSession, history: History, tmp_path: Path
) -> None:
    copy = copy_history(history, tmp_path)
    latest = history.manifests[-1]
    # a committer killed after moving the changes and state tables on, before the manifest row
    for name in ("Account", "AuditLog"):
        files = [f for f in history.pending.files if f.actor_type == name]
        copy._append(copy.warehouse.changes(name), files)
        copy._merge_state(name, files)
        assert copy._table(copy.warehouse.state(name)).version() > latest.state_versions[name]
    register_views(spark, "testbank", copy.config.warehouse, prefix="unfinished_")
    rows = _rows(spark, "SELECT _key, balance, touched FROM unfinished_account")
    assert {k: (b, t) for k, b, t in rows} == _accounts(history, latest.ssid)
    assert _rows(spark, "SELECT max(_ssid) FROM unfinished_account_history") == [(latest.ssid,)]
    changes = _rows(spark, "SELECT max(_ssid) FROM unfinished_account_changes")
    assert changes == [(latest.ssid,)]


def test_history_stays_right_after_old_snapshots_expire(
    spark: SparkSession, history: History, tmp_path: Path
) -> None:
    copy = copy_history(history, tmp_path)
    latest = history.manifests[-1]
    oldest = copy.expire(keep=5, keep_ms=0, now_ms=latest.time_ms)
    assert oldest is not None and oldest.ssid == history.ssids[-5]
    register_views(spark, app, copy.config.warehouse, prefix="kept_")
    rows = _rows(spark, "SELECT _ssid, _key, balance, touched FROM kept_account_history")
    assert {(s, k): (b, t) for s, k, b, t in rows} == _every_snapshot(history, history.ssids[-5:])
    assert _rows(spark, "SELECT count(*) FROM kept_snapshots") == [(5,)]
    frame = state_at(spark, app, "Account", ssid=oldest.ssid, warehouse=copy.config.warehouse)
    assert {r._key: (r.balance, r.touched) for r in frame.collect()} == _accounts(
        history, oldest.ssid
    )
    with pytest.raises(SnapshotNotRetainedError) as caught:
        state_at(spark, app, "Account", ssid=history.ssids[0], warehouse=copy.config.warehouse)
    assert caught.value.context["oldest"] == oldest.ssid
    assert caught.value.context["newest"] == latest.ssid


def test_time_travel_by_ssid_and_by_time(spark: SparkSession, history: History) -> None:
    def accounts(**at: object) -> dict[int, tuple[int, int]]:
        frame = state_at(spark, app, "Account", warehouse=history.warehouse, **at)  # type: ignore[arg-type]
        return {r._key: (r.balance, r.touched) for r in frame.collect()}

    middle = history.manifests[len(history.manifests) // 2]
    assert accounts(ssid=middle.ssid) == _accounts(history, middle.ssid)
    assert accounts() == _accounts(history, history.ssids[-1])
    # by time: the newest snapshot taken at or before it (ms since the Unix epoch, or a datetime)
    just_before_next = history.manifests[len(history.manifests) // 2 + 1].time_ms - 1
    assert accounts(time=just_before_next) == _accounts(history, middle.ssid)
    as_datetime = datetime.datetime.fromtimestamp(middle.time_ms / 1000, datetime.UTC)
    assert accounts(time=as_datetime.replace(tzinfo=None)) == _accounts(history, middle.ssid)
    with pytest.raises(SnapshotNotRetainedError):
        accounts(time=history.manifests[0].time_ms - 1)
    with pytest.raises(SnapshotNotRetainedError):
        accounts(ssid=history.ssids[0] + 1)  # never taken
    with pytest.raises(QueryError):
        accounts(ssid=middle.ssid, time=middle.time_ms)


def test_the_commands_and_snapshots_views(spark: SparkSession, history: History) -> None:
    register_views(spark, "testbank", history.warehouse, prefix="log_")
    logged = [
        (r.epoch, t.seq, t.handler)
        for r in history.records[: history.ssids[-1] + 1]
        for t in r.txns
    ]
    rows = _rows(spark, "SELECT epoch, seq, handler FROM log_commands WHERE seq >= 0")
    assert sorted(rows) == sorted(logged)
    events = _rows(
        spark,
        """
        SELECT get_json_object(event_json, '$.amount') FROM log_commands
        WHERE handler = 'deposit' AND epoch = 0 ORDER BY seq""",
    )
    assert [int(e) for (e,) in events] == [100] * 40  # type: ignore[call-overload]
    columns = spark.table("log_commands").columns
    assert {"ssid", "epoch", "time", "seq", "handler", "event_json"} <= set(columns)
    snapshots = _rows(spark, "SELECT ssid, digest FROM log_snapshots ORDER BY ssid")
    assert snapshots == [(m.ssid, m.digest) for m in history.manifests]
    with pytest.raises(QueryError, match=r"cannot read|no snapshot manifest"):
        register_views(spark, "nosuchapp", history.warehouse)


def test_epochal_sql_prints_a_table_and_json(
    capsys: pytest.CaptureFixture[str], cache: CacheConfig, history: History, spark: SparkSession
) -> None:
    query = ("SELECT _ssid, count(*) AS accounts, sum(balance) AS total FROM account_history "
             "GROUP BY _ssid ORDER BY _ssid")  # fmt: skip
    # in this process, on the tests' session (tests/integration/test_sql_server.py: the server)
    flags = ["--cache", str(cache.root), "sql", query, "--no-server"]
    flags += ["--warehouse", history.warehouse]
    expected = [
        {"_ssid": ssid, "accounts": len(a), "total": sum(v.balance for v in a.values())}
        for ssid, a in sorted(history.accounts.items())
    ]
    assert main([*flags, "testbank", "--format", "json"]) == 0
    printed = capsys.readouterr().out
    assert [json.loads(line) for line in printed.splitlines()] == expected

    assert main([*flags, "tests.unit.actors.workload:app"]) == 0
    table = capsys.readouterr().out
    assert "_ssid" in table and "total" in table and f"{len(expected)} rows" in table
    first = expected[0]
    assert any(str(first["_ssid"]) in line and str(first["total"]) in line
               for line in table.splitlines())  # fmt: skip

    assert main([*flags, "testbank", "--format", "csv"]) == 0
    csv_lines = capsys.readouterr().out.splitlines()
    assert csv_lines[0] == "_ssid,accounts,total"
    assert csv_lines[1] == f"{first['_ssid']},{first['accounts']},{first['total']}"

    assert main(["--cache", str(cache.root), "sql", "SELECT nope FROM account", "testbank",
                 "--warehouse", history.warehouse, "--no-server"]) == 1  # fmt: skip
    said = capsys.readouterr().err
    assert "the query failed" in said and "UNRESOLVED_COLUMN" in said
    assert "at org.apache" not in said, said  # PySpark's JSON log of the JVM stack is off
