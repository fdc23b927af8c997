"""Strong recovery as a Spark job (``local[2]``, the session fixture), against real Kafka and Delta:
its snapshot equals the in-engine replay and the serial oracle, and a cluster resumes from it
exactly once; a log of independent key groups replays in several tasks, one whose transactions
link every group (or an app with interior transactions) in one ordered task, saying why;
``into`` replays a fixed handler into separate tables without touching the original ones; a
truncated log, or a weak-mode snapshot, is refused before anything is written; ``epochal recover``
with no epoch after the latest snapshot says there was nothing to recover."""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from bench.recover import app as branch_app
from bench.recover import branch_log, fee_app, log_epochs, snapshot_log
from epochal.actors.api import App
from epochal.actors.oracle import SerialOracle
from epochal.cli import main
from epochal.config import SnapshotConfig
from epochal.errors import LogTruncatedError, RecoveryError
from epochal.log.client import KafkaClients
from epochal.log.command_log import KafkaCommandLog
from epochal.recovery.log_tables import epochs_of
from epochal.recovery.replay import replay_command_log
from epochal.recovery.snapshots import DeltaSnapshots
from epochal.recovery.spark_recovery import (
    RecoveryProgress,
    RecoveryReport,
    into_tables,
    recover_strong,
)
from epochal.schemas.commands import EpochRecord
from epochal.schemas.snapshots import Manifest
from tests.integration.cluster import Cluster, app_named, wait_until
from tests.unit.actors.workload import app as workload_app

pytestmark = pytest.mark.integration

BRANCHES = "bench.recover:app"
FIXED = "bench.recover:fee_app"


@dataclasses.dataclass
class Logged:
    """A branch log written to Kafka, and the snapshots a cluster would have taken of it."""

    app: App
    config: SnapshotConfig
    records: list[EpochRecord]
    positions: list[int]
    kafka: KafkaClients

    @property
    def snapshots(self) -> DeltaSnapshots:
        return DeltaSnapshots(self.app, self.config, 1)

    def oracle(self, upto: int | None = None, then: App | None = None) -> dict[int, str]:
        """The serial oracle's digest after each epoch; from epoch ``upto`` + 1 on, under the
        app ``then``, if given."""
        return {r.epoch: r.digest for r in self.oracle_results(upto, then)}

    def oracle_results(self, upto: int | None = None, then: App | None = None) -> list[Any]:
        """The serial oracle's result of each epoch, as :meth:`oracle` runs it."""
        oracle, results = SerialOracle(self.app), []
        for record in self.records:
            if then is not None and upto is not None and record.epoch == upto + 1:
                oracle.app = dataclasses.replace(then, name=self.app.name)
            results.append(oracle.run_epoch(record))
        return results

    def in_engine(self) -> str:
        """The in-engine strong replay from the latest snapshot to the log's end."""
        restored = self.snapshots.restore()
        assert restored is not None
        logged = KafkaCommandLog(self.kafka, self.app.topics.command_log).epochs(
            restored.manifest.command_log_position, to_end=True
        )
        return replay_command_log(self.app, logged, restored=restored)[0].digest()


def _logged(
    kafka: KafkaClients, tmp_path: Path, *, snapshot_every: int = 0, until: int = 0,
    census_at: int | None = None, transactions: int = 3000, chunk_bytes: int = 4096,
) -> Logged:  # fmt: skip
    app = dataclasses.replace(branch_app, name=f"r{uuid.uuid4().hex[:8]}")
    records = branch_log(  # small opening balances: overdrafts abort, so order matters
        app, transactions, 200, 20, per_epoch=300, opening=60, census_at=census_at,
        snapshot_every=snapshot_every,
    )  # fmt: skip
    positions = log_epochs(kafka, app.topics.command_log, records, chunk_bytes)
    config = SnapshotConfig(str(tmp_path / "warehouse"))
    snapshot_log(app, config, records, positions, until=until)
    return Logged(app, config, records, positions, kafka)


def _recover(
    logged: Logged, spark: SparkSession, spec: str = BRANCHES, **flags: Any
) -> RecoveryReport:
    return recover_strong(spec, logged.app.name, logged.config, spark,
                          kafka=logged.kafka.config, **flags)  # fmt: skip


def test_the_spark_snapshot_equals_in_engine_replay_and_oracle_and_a_cluster_resumes_from_it(
    cluster: Cluster, spark: SparkSession
) -> None:
    cluster.start(workers=1, partitions=2, snapshot_ms=60_000)  # one snapshot: the first epoch
    cluster.produce(300, deposits=True)
    cluster.wait_for_egress()
    cluster.produce(700)
    cluster.wait_for_egress()
    # the snapshot process commits off the epoch loop: on a busy machine, after the egress
    wait_until(lambda: bool(cluster.snapshots().manifests()), 30, "no snapshot committed")
    cluster.processes[-1].kill()  # no savepoint: the log after the first snapshot stays to replay
    cluster.processes[-1].wait()
    (first,) = cluster.snapshots().manifests()
    restored = cluster.snapshots().restore()
    logged = KafkaCommandLog(cluster.kafka, f"{cluster.name}.cmd")
    engine, _ = replay_command_log(
        app_named(cluster.name), logged.epochs(first.command_log_position, to_end=True),
        restored=restored,
    )  # fmt: skip
    epochs = cluster.epochs()
    oracle = SerialOracle(workload_app).run(epochs)[-1].digest

    report = recover_strong("tests.unit.actors.workload:app", cluster.name,
                            SnapshotConfig(str(cluster.warehouse)), spark,
                            kafka=cluster.kafka.config)  # fmt: skip
    assert report.ssids == (epochs[-1].epoch,) and report.from_ssid == first.ssid
    assert report.digest == engine.digest() == oracle
    assert report.tasks == 1 and "interior transactions (audit, note)" in report.ordered_reason
    latest = cluster.snapshots().manifests()[-1]
    assert (latest.ssid, latest.digest) == (epochs[-1].epoch, oracle)

    cluster.start(workers=1, partitions=2, snapshot_ms=60_000)
    cluster.produce(300)
    cluster.check_against_the_oracle()  # every input once, every egress record once
    assert (
        f"resumed from snapshot ssid={latest.ssid}" in (cluster.run_dir / "run-1.log").read_text()
    )
    cluster.check_snapshots_against_the_oracle()
    cluster.stop()


def test_independent_key_groups_replay_in_parallel_tasks(
    kafka: KafkaClients, spark: SparkSession, tmp_path: Path
) -> None:
    logged = _logged(kafka, tmp_path, chunk_bytes=2000)  # epochs of many chunks: slices cut some
    assert logged.positions[-1] > 5 * len(logged.records)
    oracle = logged.oracle()
    in_engine = logged.in_engine()
    seen: list[RecoveryProgress] = []
    report = _recover(logged, spark, progress=seen.append)
    last = logged.records[-1].epoch
    assert report.parallel and report.groups == 20 and report.tasks == 4
    assert report.ssids == (last,) and report.transactions == 3000
    assert report.digest == in_engine == oracle[last]
    manifest = logged.snapshots.manifests()[-1]
    assert manifest.digest == oracle[last]
    assert manifest.command_log_position == logged.positions[-1] + 1
    assert manifest.input_positions == logged.records[-1].next_offsets
    commands = logged.snapshots._table(
        logged.snapshots.warehouse.log("commands"), manifest.log_versions["commands"]
    ).to_pyarrow_table(filters=[("ssid", "=", last)])
    assert [(r.epoch, r.txns) for r in epochs_of(commands)] == [
        (r.epoch, r.txns) for r in logged.records[1:]
    ]  # archived as a cluster's worker 0 does, with the outcomes the tasks replayed
    outcomes = {
        (o.epoch, o.seq): (o.committed, o.reason)
        for r in SerialOracle(logged.app).run(logged.records)[1:]
        for o in r.outcomes
    }
    archived = commands.select(["epoch", "seq", "committed", "reason"]).to_pylist()
    assert {(r["epoch"], r["seq"]): (r["committed"], r["reason"]) for r in archived} == outcomes
    assert len(archived) == len(outcomes) and not all(c for c, _ in outcomes.values())
    replaying = [p for p in seen if p.phase == "replaying"]
    assert replaying[-1].done == replaying[-1].total == 3000


def test_a_transaction_linking_every_group_replays_in_one_ordered_task(
    kafka: KafkaClients, spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    logged = _logged(kafka, tmp_path, census_at=1500)
    caplog.set_level("INFO", logger="epochal.recovery.spark_recovery")
    report = _recover(logged, spark)
    reason = "the declared key sets link every transaction into one group"
    assert (report.groups, report.tasks, report.ordered_reason) == (1, 1, reason)
    assert f"one ordered task app={logged.app.name}: {reason}" in caplog.text
    assert report.digest == logged.oracle()[logged.records[-1].epoch]


def _tables(snapshots: DeltaSnapshots) -> list[tuple[str, int]]:
    warehouse = snapshots.warehouse
    return [(uri, snapshots._table(uri).version()) for name in snapshots.layouts
            for uri in (warehouse.state(name), warehouse.changes(name))]  # fmt: skip


def _balances(snapshots: DeltaSnapshots, manifest: Manifest) -> dict[int, int]:
    uri = snapshots.warehouse.state("Account")
    table = DeltaTable(uri, version=manifest.state_versions["Account"]).to_pyarrow_table()
    return dict(zip(table.column("_key").to_pylist(), table.column("balance").to_pylist(),
                    strict=True))  # fmt: skip


def test_into_replays_a_fixed_handler_into_separate_tables(
    kafka: KafkaClients, spark: SparkSession, tmp_path: Path
) -> None:
    logged = _logged(kafka, tmp_path, snapshot_every=3, until=10)
    original = logged.snapshots.manifests()
    assert [m.ssid for m in original] == [0, 3, 6, 9]
    tables = _tables(logged.snapshots)
    with pytest.raises(RecoveryError, match="latest snapshot"):
        _recover(logged, spark, from_ssid=3)  # in place, only from the latest

    report = _recover(logged, spark, spec=FIXED, from_ssid=3, into="fee")
    assert report.tables == into_tables(logged.app.name, "fee") == f"{logged.app.name}/into/fee"
    assert report.ssids == (3, 6, 9, 10)  # a copy of the start, then the replay's
    assert logged.snapshots.manifests() == original and _tables(logged.snapshots) == tables
    fixed = DeltaSnapshots(dataclasses.replace(fee_app, name=report.tables), logged.config, 1)
    ran, corrected = logged.oracle(), logged.oracle(upto=3, then=fee_app)
    assert {m.ssid: m.digest for m in fixed.manifests()} == {
        ssid: corrected[ssid] for ssid in (3, 6, 9, 10)
    }
    assert corrected[3] == ran[3] and corrected[9] != ran[9]
    commands = DeltaTable(fixed.warehouse.log("commands")).to_pyarrow_table()
    archived = commands.select(["epoch", "seq", "committed", "reason"]).to_pylist()
    assert {(r["epoch"], r["seq"]): (r["committed"], r["reason"]) for r in archived} == {
        (o.epoch, o.seq): (o.committed, o.reason)
        for r in logged.oracle_results(upto=3, then=fee_app)[4:]
        for o in r.outcomes
    }  # the corrected outcomes of the replayed epochs

    # what the docs' Spark SQL compares (ssid 9 in both), read here with delta-rs: Spark's
    # planning of two Delta tables would cost this loaded machine more than the whole test
    balances = [_balances(s, m) for s, m in ((logged.snapshots, original[3]),
                                             (fixed, fixed.manifests()[2]))]  # fmt: skip
    assert balances[0].keys() == balances[1].keys()
    assert any(balances[0][key] != balances[1][key] for key in balances[0])


def test_a_weak_mode_snapshot_is_refused(
    kafka: KafkaClients, spark: SparkSession, tmp_path: Path
) -> None:
    logged = _logged(kafka, tmp_path, transactions=300)
    weak = dataclasses.replace(
        logged, config=SnapshotConfig(str(tmp_path / "weak"), recovery="weak")
    )
    snapshot_log(weak.app, weak.config, weak.records, weak.positions, until=0)
    with pytest.raises(RecoveryError, match="weak-mode snapshot has no command log"):
        _recover(weak, spark)


def test_a_truncated_log_is_refused_before_anything_is_written(
    kafka: KafkaClients, spark: SparkSession, tmp_path: Path
) -> None:
    logged = _logged(kafka, tmp_path, transactions=900)
    (manifest,) = logged.snapshots.manifests()
    topic = logged.app.topics.command_log
    kafka.delete_records({(topic, 0): logged.positions[2] + 1})
    with pytest.raises(LogTruncatedError) as raised:
        _recover(logged, spark)
    missing = f"{manifest.command_log_position}..{logged.positions[2]}"
    assert raised.value.context == {"topic": topic, "partition": 0, "missing": missing}
    assert logged.snapshots.manifests() == [manifest]


def test_epochal_recover_with_nothing_after_the_latest_snapshot_says_so(
    kafka: KafkaClients,
    spark: SparkSession,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Every epoch is in a snapshot: no replay and no new snapshot, and the command says which
    snapshot stays the latest (it announced ``snapshots []``)."""
    logged = _logged(kafka, tmp_path, snapshot_every=1, until=1 << 30, transactions=300)
    latest = logged.snapshots.manifests()[-1]
    assert latest.epoch == logged.records[-1].epoch
    monkeypatch.setenv("PYTHONHASHSEED", "0")  # else recover re-executes itself under it
    flags = ["recover", BRANCHES, "--name", logged.app.name]  # the jars: $EPOCHAL_CACHE's
    where = ["--warehouse", logged.config.warehouse, "--bootstrap", kafka.config.bootstrap_servers]
    assert main([*flags, *where]) == 0
    said = " ".join(capsys.readouterr().err.split())
    assert f"nothing to recover: snapshot ssid={latest.ssid} is already the latest" in said
    assert (
        f"`epochal run` resumes from it (command-log position {latest.command_log_position})"
        in said
    )
    assert "snapshots []" not in said and "replayed" not in said
    assert logged.snapshots.manifests()[-1] == latest
