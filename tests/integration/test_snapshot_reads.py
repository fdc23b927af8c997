"""Reads of a retained snapshot from Delta without Spark (``SnapshotReader``, the client's
``SNAPSHOT(ssid)`` level) give exactly what Spark reads ``VERSION AS OF`` the version the
manifest names for that ssid; an expired or never-taken ssid is ``SnapshotNotRetainedError``."""

from __future__ import annotations

import asyncio
import csv
import io
import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from epochal.actors.engine import Engine
from epochal.cli import main
from epochal.config import SnapshotConfig
from epochal.errors import QueryError, SnapshotNotRetainedError
from epochal.log.command_log import MemoryCommandLog
from epochal.log.ordering import EpochStamp, order
from epochal.recovery.snapshot_reads import SnapshotReader
from epochal.recovery.snapshots import DeltaSnapshots
from epochal.schemas.canonical import encode_canonical
from epochal.schemas.codec import encode
from epochal.schemas.commands import InputRecord
from tests.integration.snapshot_history import History, build_history, copy_history

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> History:
    return build_history(tmp_path_factory.mktemp("reads"), snapshots_wanted=6)


def _spark_rows(spark: SparkSession, history: History, name: str, ssid: int) -> dict[object, bytes]:
    """``_key -> _state`` of ``state/<name>`` as plain Spark reads it at snapshot ``ssid``."""
    manifest = next(m for m in history.manifests if m.ssid == ssid)
    frame = (
        spark.read.format("delta")
        .option("versionAsOf", manifest.state_versions[name])
        .load(history.snapshots.warehouse.state(name))
    )
    return {row["_key"]: bytes(row["_state"]) for row in frame.select("_key", "_state").collect()}


def test_reads_at_an_ssid_equal_spark_version_as_of(spark: SparkSession, history: History) -> None:
    reader = SnapshotReader(SnapshotConfig(history.warehouse), "testbank")
    assert reader.ssids() == history.ssids and reader.latest() == history.ssids[-1]
    for ssid in (history.ssids[0], history.ssids[len(history.ssids) // 2], history.ssids[-1]):
        spark_rows = _spark_rows(spark, history, "Account", ssid)
        # the oracle agrees: the bytes are the canonical ones of its accounts
        assert spark_rows == {k: encode_canonical(a) for k, a in history.accounts[ssid].items()}
        assert reader.scan("Account", None, None, ssid) == sorted(spark_rows.items())
        keys = [*range(0, 40, 3), 100, 101, 104, 999]
        assert reader.get("Account", keys, ssid) == {k: spark_rows.get(k) for k in keys}
        assert reader.scan("Account", 10, 20, ssid) == sorted(
            (k, v)
            for k, v in spark_rows.items()
            if 10 <= k < 20  # type: ignore[operator]
        )
        assert (
            reader.scan("Account", 30, None, ssid, limit=3)
            == sorted(
                (k, v)
                for k, v in spark_rows.items()
                if k >= 30  # type: ignore[operator]
            )[:3]
        )
        audit = _spark_rows(spark, history, "AuditLog", ssid)  # str keys
        assert reader.get("AuditLog", ["audit", "nope"], ssid) == {
            "audit": audit.get("audit"), "nope": None
        }  # fmt: skip
        assert reader.scan("AuditLog", "a", "b", ssid) == sorted(audit.items())
    # an actor that a later snapshot deleted is still there at an earlier one
    latest = history.accounts[history.ssids[-1]]
    earlier = next(s for s in history.ssids if set(history.accounts[s]) - set(latest))
    gone = sorted(set(history.accounts[earlier]) - set(latest))
    assert reader.get("Account", gone, history.ssids[-1]) == dict.fromkeys(gone)
    assert all(v is not None for v in reader.get("Account", gone, earlier).values())


def test_expired_and_never_taken_ssids_are_not_retained(history: History, tmp_path: Path) -> None:
    copy = copy_history(history, tmp_path)
    reader = SnapshotReader(SnapshotConfig(copy.config.warehouse), "testbank")
    first, latest = history.ssids[0], history.ssids[-1]
    before = reader.get("Account", [1], first)  # opened and cached before it expires
    assert before[1] is not None
    oldest = copy.expire(keep=2, keep_ms=0, now_ms=0)
    assert oldest is not None and oldest.ssid == history.ssids[-2]
    for ssid in (
        first,
        history.ssids[1],
        latest + 1,
        first + 1,
    ):  # expired, expired, not yet, never
        with pytest.raises(SnapshotNotRetainedError) as caught:
            reader.get("Account", [1], ssid)
        assert caught.value.context == {"ssid": ssid, "app": "testbank", "oldest": oldest.ssid,
                                        "newest": latest}  # fmt: skip
        assert f"ssid={ssid}" in str(caught.value)
    assert reader.ssids() == history.ssids[-2:]
    with pytest.raises(SnapshotNotRetainedError):
        reader.scan("Account", None, None, first)
    assert reader.get("Account", [1], latest)[1] is not None


def test_bad_reads_say_what_is_wrong(history: History) -> None:
    reader = SnapshotReader(SnapshotConfig(history.warehouse), "testbank")
    ssid = history.ssids[-1]
    with pytest.raises(QueryError, match="unknown actor type"):
        reader.get("Nope", [1], ssid)
    with pytest.raises(QueryError, match="wrong type"):
        reader.get("Account", ["1"], ssid)
    with pytest.raises(QueryError, match="wrong type"):
        reader.get("Account", [True], ssid)
    with pytest.raises(QueryError, match="wrong type"):
        reader.scan("AuditLog", 0, None, ssid)
    empty = SnapshotReader(SnapshotConfig(history.warehouse), "noapp")
    assert empty.ssids() == [] and empty.latest() is None
    with pytest.raises(SnapshotNotRetainedError, match="retained=none"):
        empty.get("Account", [1], ssid)


def test_string_keys_read_back_after_a_merge_rewrote_the_state_files(
    spark: SparkSession, tmp_path: Path
) -> None:
    """delta-rs's merge writes string columns as Arrow ``string_view``, which pyarrow cannot
    compare: point reads and ranges of str keys must still work once a snapshot merged."""
    from examples.bank.app import Deposit, Transfer, account_key
    from examples.bank.app import app as bank

    accounts = [account_key(i) for i in range(50)]
    batches = [[Deposit(a, 10) for a in accounts],
               [Transfer(accounts[i], accounts[i + 1], 3) for i in range(0, 48, 2)]]  # fmt: skip
    log, offset = MemoryCommandLog(), 0
    for epoch, batch in enumerate(batches):
        inputs = [InputRecord(bank.topics.input("transfers"), 0, offset + i, encode(event))
                  for i, event in enumerate(batch)]  # fmt: skip
        offset += len(batch)
        log.append(order(bank, EpochStamp(epoch, 1_000 + epoch, 7, bank.code_hash(), True),
                         inputs).record)  # fmt: skip
    snapshots = DeltaSnapshots(bank, SnapshotConfig(str(tmp_path / "wh"), keep=0), partitions=2)
    snapshots.ensure_tables(bank.code_hash())

    async def run() -> None:
        engine = Engine(bank, 2, snapshots=True)
        for logged in log.epochs():
            result = await engine.run_epoch(logged.record)
            assert result.changes is not None
            snapshots.commit([snapshots.write(logged.record.epoch, 0, result.changes)],
                             logged.record.epoch)  # fmt: skip

    asyncio.run(run())
    reader = SnapshotReader(SnapshotConfig(str(tmp_path / "wh")), "bank")
    ssid = reader.latest()
    assert ssid == 1
    manifest = reader.manifest(ssid)
    frame = (spark.read.format("delta").option("versionAsOf", manifest.state_versions["Account"])
             .load(reader.warehouse.state("Account")))  # fmt: skip
    by_spark = {r["_key"]: bytes(r["_state"]) for r in frame.collect()}
    assert len(by_spark) == 50
    wanted = [accounts[0], accounts[1], accounts[31], "acct-nope"]
    assert reader.get("Account", wanted, ssid) == {k: by_spark.get(k) for k in wanted}
    lo, hi = accounts[10], accounts[20]
    assert reader.scan("Account", lo, hi, ssid) == sorted(
        (k, v)
        for k, v in by_spark.items()
        if lo <= k < hi  # type: ignore[operator]
    )


def test_epochal_snapshots_lists_the_manifest_as_json_csv_or_a_whole_table(
    capsys: pytest.CaptureFixture[str], history: History
) -> None:
    flags = ["snapshots", "tests.unit.actors.workload:app", "--warehouse", history.warehouse]
    assert main([*flags, "--format", "json"]) == 0
    listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["ssid"] for row in listed] == history.ssids
    last = history.manifests[-1]
    assert listed[-1]["epoch"] == last.epoch and listed[-1]["digest"] == last.digest
    assert listed[-1]["actors"] == last.actors
    assert listed[-1]["command_log_position"] == last.command_log_position

    assert main([*flags, "--format", "csv"]) == 0
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert rows[0][:3] == ["ssid", "epoch", "time"] and len(rows) == 1 + len(history.ssids)
    assert rows[-1][rows[0].index("digest")] == last.digest

    assert main(flags) == 0  # stdout is not a terminal here: nothing is cut to fit 80 columns
    table = capsys.readouterr().out
    assert f"snapshots of testbank in {history.snapshots.warehouse.uri()}" in table
    assert "…" not in table and f"{len(history.ssids)} rows" in table
    lines = [line for line in table.splitlines() if line.startswith("│")]
    assert len(lines) == len(history.ssids), table  # a row per line, none wrapped
    assert all(row["time"] in line for row, line in zip(listed, lines, strict=True)), table
