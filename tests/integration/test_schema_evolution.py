"""Actor schemas across deploys, as an operator meets them with ``epochal run`` and Spark SQL:
a widened number, an added field and a removed actor type start without a migration; a rename
and a changed type are refused at start naming the field; a rename with a migration carries every
value over, once; the history views read every snapshot before and after each change."""

from __future__ import annotations

import logging
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession

from epochal.actors.api import App
from epochal.actors.store import Change
from epochal.analytics.history import register_views
from epochal.config import SnapshotConfig
from epochal.errors import RecoveryError
from epochal.recovery.schema_evolution import check_schemas, evolve_table
from epochal.recovery.snapshots import DeltaSnapshots
from epochal.schemas.actor_schemas import actor_schema
from epochal.schemas.codec import decode
from epochal.schemas.commands import KeyRef, PartitionId
from epochal.schemas.egress import EgressRecord
from epochal.schemas.snapshots import Manifest
from tests.integration.cluster import EPOCHAL, ROOT, Cluster, wait_until
from tests.integration.evolving import s1, s2, s4

pytestmark = pytest.mark.integration

S1, S2, S3, S4, S5, S6 = (f"tests.integration.evolving.s{n}:app" for n in range(1, 7))


def _deposit(cluster: Cluster, deposits: list[tuple[int, int]]) -> None:
    values = [msgspec.msgpack.encode(s1.Deposit(a, amount)) for a, amount in deposits]
    cluster.produce_values(values, topic="in.deposits")


def _receipts(cluster: Cluster) -> list[dict[str, float]]:
    records = [decode(value, EgressRecord) for value in cluster.read("out.receipts")]
    return [msgspec.msgpack.decode(r.value) for r in records]


def _run_refused(cluster: Cluster, spec: str) -> str:
    """``epochal run spec`` over the cluster's snapshots: it must refuse; its error line."""
    flags = ["--name", cluster.name, "--bootstrap", cluster.kafka.config.bootstrap_servers,
             "--run-dir", str(cluster.run_dir), "--warehouse", str(cluster.warehouse),
             "--workers", "1", "--partitions", "2"]  # fmt: skip
    wide = {**os.environ, "COLUMNS": "300"}
    done = subprocess.run([EPOCHAL, "run", spec, *flags], cwd=ROOT, env=wide, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    return line


def _deploy(cluster: Cluster, spec: str, deposits: list[tuple[int, int]], total: int) -> int:
    """Start ``spec``, feed it ``deposits``, wait for ``total`` receipts in all, stop it (a
    savepoint); the savepoint's ssid."""
    cluster.app_spec = spec
    before = len(cluster.log())
    cluster.start(workers=1, partitions=2, snapshot_ms=60_000)  # only the stop snapshots
    _deposit(cluster, deposits)
    wait_until(lambda: len(_receipts(cluster)) == total, 60, "no receipts", log=cluster.log)
    cluster.stop()
    (ssid,) = re.findall(r"stopped at a savepoint ssid=(\d+)", cluster.log()[before:])
    return int(ssid)


def test_schemas_evolve_across_deploys_and_history_reads_every_snapshot(
    cluster: Cluster, spark: SparkSession
) -> None:
    first = [(a, 10 * (a + 1)) for a in range(8)]  # accounts 0..7 hold 10, 20, ... 80
    one = _deploy(cluster, S1, first, len(first))

    second = [(a, 5) for a in range(4)]  # accounts 4..7 keep their version-1 values
    before = len(cluster.log())
    two = _deploy(cluster, S2, second, len(first) + len(second))
    said = cluster.log()[before:]
    assert (
        f"actor schema of Account changed since snapshot ssid={one}: Account.balance: int -> "
        "float (widened); Account.deposits: - -> int (added)"
    ) in said, said
    assert (
        f"actor type Audit is not in this version of the app: the 1 actors snapshot ssid={one}"
        in said
    )
    balances = {a: 10.0 * (a + 1) + (5 if a < 4 else 0) for a in range(8)}
    assert {r["account"]: r["balance"] for r in _receipts(cluster)} == balances

    renamed = _run_refused(cluster, S3)
    assert renamed.startswith(
        "error: actor field Account.balance (float) is not in this version of the app (renamed "
        f"to 'funds'? a rename resets every value), but 8 actors of snapshot ssid={two} hold"
    ), renamed
    assert "@app.migration(Account)" in renamed
    retyped = _run_refused(cluster, S5)
    assert retyped.startswith(
        "error: actor field Account.deposits changed type from int to Deposits{count: int, "
        f"total: float}} since snapshot ssid={two}"
    ), retyped

    before = len(cluster.log())
    three = _deploy(cluster, S4, [(0, 1)], len(first) + len(second) + 1)
    assert "its migration balance_to_funds runs over its 8 actors" in cluster.log()[before:]
    balances[0] += 1
    assert _receipts(cluster)[-1] == {"account": 0, "balance": balances[0]}

    migrated = cluster.snapshots_of(s4.app).restore()  # every actor, changed or not, migrated
    assert migrated is not None and migrated.manifest.ssid == three
    assert not migrated.migrations  # it records version 4's schema: no start migrates again
    accounts = {k: msgspec.msgpack.decode(v, type=s4.Account)
                for k, v in migrated.actors["Account"]}  # fmt: skip
    assert {k: a.funds for k, a in accounts.items()} == balances
    assert {k: a.deposits for k, a in accounts.items()} == {
        a: int(a < 4) + (a == 0) for a in range(8)
    }

    register_views(spark, cluster.name, str(cluster.warehouse))
    rows = spark.sql(
        "SELECT _ssid, sum(balance) AS balance, sum(funds) AS funds, count(deposits) AS counted,"
        " typeof(first(balance)) AS type FROM account_history"
        f" WHERE _ssid IN ({one}, {two}, {three}) GROUP BY _ssid ORDER BY _ssid"
    ).collect()
    assert [tuple(r) for r in rows] == [
        (one, 360.0, None, 0, "double"),  # version 1's longs, read as doubles; no deposits yet
        (two, 380.0, None, 4, "double"),  # the 4 accounts version 2 changed count deposits
        (three, None, 381.0, 8, "double"),  # every actor rewritten by the migration: funds
    ]
    latest = spark.sql("SELECT count(balance), sum(funds), count(*) FROM account").collect()
    assert tuple(latest[0]) == (0, 381.0, 8)  # the renamed field's column is null from then on


def test_a_migration_that_fails_stops_the_start_in_one_line_naming_it(cluster: Cluster) -> None:
    _deploy(cluster, S1, [(a, 10 * (a + 1)) for a in range(4)], 4)
    flags = ["--name", cluster.name, "--bootstrap", cluster.kafka.config.bootstrap_servers,
             "--run-dir", str(cluster.run_dir), "--warehouse", str(cluster.warehouse),
             "--workers", "1", "--partitions", "2", "--startup-timeout-ms", "20000"]  # fmt: skip
    wide = {**os.environ, "COLUMNS": "300"}
    done = subprocess.run([EPOCHAL, "run", S6, *flags], cwd=ROOT, env=wide, capture_output=True,
                          text=True, timeout=90, check=False)  # fmt: skip
    said = done.stdout + done.stderr
    assert done.returncode != 0, said
    assert "the migration buggy of Account failed: ZeroDivisionError" in said, said
    assert "key=2" in said and "fix the migration and start again" in said
    assert "restarting would not help" in said  # no crash loop: the cluster stops
    assert said.count("rolling back") == 0


def _ledger(version: Any, warehouse: Path) -> DeltaSnapshots:
    return DeltaSnapshots(version.app, SnapshotConfig(str(warehouse)), partitions=1)


def _snapshot(snapshots: DeltaSnapshots, ssid: int, accounts: dict[int, bytes]) -> Manifest:
    changes = [Change(KeyRef("Account", k), PartitionId(0), None, v) for k, v in accounts.items()]
    snapshots.ensure_tables("code")
    return snapshots.commit([snapshots.write(ssid, 0, changes)], ssid)


def test_a_removed_field_is_refused_only_while_it_holds_data_and_old_manifests_pass(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """In process, over real Delta tables: what a start decides from the latest snapshot."""
    v2 = _ledger(s2, tmp_path)
    plain = msgspec.msgpack.encode(s2.Account(balance=3.0))  # deposits at its default
    manifest = _snapshot(v2, 1, {1: plain, 2: plain})
    assert manifest.schemas == {"Account": actor_schema(s2.Account)}

    dropped = App("ledger")  # version 2 without ``deposits``: nothing held in it, nothing lost
    dropped.actor(key=int, name="Account")(type("Account", (msgspec.Struct,), {
        "__annotations__": {"balance": float}, "balance": 0.0}))  # fmt: skip
    check_schemas(dropped, manifest, v2.states)

    counted = msgspec.msgpack.encode(s2.Account(balance=3.0, deposits=2))
    manifest = _snapshot(v2, 2, {2: counted})
    with pytest.raises(RecoveryError, match=r"Account.deposits \(int\) is not in this version "
                       r"of the app, but 1 actors of snapshot ssid=2 hold"):  # fmt: skip
        check_schemas(dropped, manifest, v2.states)

    older = msgspec.structs.replace(manifest, schemas={})  # taken by an older epochal
    with caplog.at_level(logging.WARNING):
        check_schemas(dropped, older, v2.states)
    assert "records no actor schemas (taken by an older epochal)" in caplog.text


def test_a_changed_column_is_rewritten_once_cast_or_null_and_removed_columns_stay(
    tmp_path: Path,
) -> None:
    uri = str(tmp_path / "table")
    old = pa.schema([("_key", pa.int64()), ("n", pa.int64()), ("s", pa.string()),
                     ("gone", pa.string())])  # fmt: skip
    write_deltalake(uri, pa.table({"_key": [1, 2], "n": [5, 6], "s": ["a", "b"],
                                   "gone": ["x", "y"]}, schema=old))  # fmt: skip
    new = pa.schema([("_key", pa.int64()), ("n", pa.float64()), ("s", pa.int64()),
                     ("added", pa.bool_())])  # fmt: skip
    assert evolve_table(uri, new, None)
    rows = DeltaTable(uri).to_pyarrow_table().sort_by("_key").to_pylist()
    assert rows == [
        {"_key": 1, "n": 5.0, "s": None, "added": None, "gone": "x"},
        {"_key": 2, "n": 6.0, "s": None, "added": None, "gone": "y"},
    ]
    assert DeltaTable(uri, version=0).to_pyarrow_table().column("n").type == pa.int64()
    assert not evolve_table(uri, new, None)  # once: a second start changes nothing
    assert DeltaTable(uri).version() == 1
    assert evolve_table(uri, pa.schema([*new, ("more", pa.string())]), None)  # no rewrite
    assert DeltaTable(uri).version() == 2 and DeltaTable(uri).to_pyarrow_table().num_rows == 2
