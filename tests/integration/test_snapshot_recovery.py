"""Strong recovery from snapshots with real processes, Kafka and Delta: ``kill -9`` of a worker
while a snapshot is being written and between epochs, on 2 workers, recovers the oracle's state
with every input once and every egress record once; a restart resumes from the latest snapshot,
not from the log's start; retention trims the logs back to the oldest snapshot kept (then
``epochal replay --from-start`` says what to run instead); and snapshots on or off leave the same
final state."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
import uuid
from pathlib import Path

import msgspec
import pytest

from epochal.actors.digest import state_digest
from epochal.actors.engine import LocalEngine
from epochal.actors.oracle import SerialOracle
from epochal.actors.snapshots import carried_of
from epochal.cli import main
from epochal.config import KafkaConfig
from epochal.log.client import KafkaClients
from epochal.log.command_log import KafkaCommandLog
from tests.integration.cluster import Cluster, app_named, wait_until
from tests.unit.actors.workload import Deposit, Transfer, app

pytestmark = pytest.mark.integration

EVERY_EPOCH = ["--snapshot-every-epochs", "1"]


def _change_files(cluster: Cluster) -> set[Path]:
    return set(cluster.warehouse.glob("*/changes/*/part-*.parquet"))


def test_kill_9_of_a_worker_mid_snapshot_and_between_epochs_recovers_exactly(
    cluster: Cluster,
) -> None:
    cluster.start(workers=2, partitions=4, extra=EVERY_EPOCH)
    cluster.produce(300, deposits=True)
    cluster.wait_for_egress()
    # a snapshot before the first kill: on a loaded machine every kill can otherwise come
    # before any commit, and no generation resumes from one
    wait_until(lambda: "snapshot committed" in cluster.log(), 30, "no snapshot committed",
               log=cluster.log)  # fmt: skip
    for kill in range(3):
        generation, before = cluster.generation(), _change_files(cluster)
        cluster.produce(600)
        if kill < 2:  # the moment a worker's part of a snapshot is written, before its commit
            wait_until(lambda b=before: bool(_change_files(cluster) - b), 30, "no part written")
        else:  # somewhere between epochs
            time.sleep(random.Random(kill).uniform(0.05, 0.4))
        os.kill(int(cluster.status()["workers"][kill % 2]), signal.SIGKILL)
        wait_until(lambda g=generation: cluster.generation() > g, 30, "no rollback",
                   log=cluster.log)  # fmt: skip
    cluster.produce(300)
    # every epoch is snapshotted, but on a loaded machine three kills can leave few commits:
    # more epochs until three snapshots stand (the check below holds every one to the oracle)
    deadline = time.monotonic() + 60
    while len(cluster.snapshots().manifests()) < 3 and time.monotonic() < deadline:
        cluster.produce(20)
        time.sleep(1)
    cluster.check_against_the_oracle()
    manifests = cluster.check_snapshots_against_the_oracle()
    assert "resumed from snapshot" in cluster.log()
    assert len(manifests) >= 3
    cluster.stop()


def test_a_restart_resumes_from_the_latest_snapshot_not_the_log_start(cluster: Cluster) -> None:
    cluster.start(workers=1, partitions=2)
    for _ in range(4):
        cluster.produce(500, deposits=True)
        cluster.wait_for_egress()
    cluster.stop()
    latest = cluster.check_snapshots_against_the_oracle()[-1]
    assert latest.epoch == cluster.epochs()[-1].epoch  # an idle input's last changes got one
    cluster.start(workers=1, partitions=2)
    cluster.produce(100)
    cluster.check_against_the_oracle()
    restart = (cluster.run_dir / "run-1.log").read_text()
    assert f"resumed from snapshot ssid={latest.ssid}" in restart
    assert f"from_epoch={latest.epoch + 1}" in restart  # no epoch before it replayed
    cluster.stop()


def test_retention_trims_the_logs_back_to_the_oldest_snapshot_kept(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.start(workers=1, partitions=2, extra=[*EVERY_EPOCH, "--keep-snapshots", "2"])
    for _ in range(5):
        cluster.produce(200, deposits=True)
        cluster.wait_for_egress()
    wait_until(lambda: len(cluster.snapshots().manifests()) == 2, 20, "old snapshots kept")
    cluster.stop()
    oldest, newest = cluster.snapshots().manifests()
    command_log = cluster.kafka.watermarks(f"{cluster.name}.cmd")
    inputs = cluster.kafka.watermarks(f"{cluster.name}.in.ops")
    assert command_log[0] == oldest.command_log_position > 0
    assert inputs[0] == oldest.input_positions[f"{cluster.name}.in.ops:0"] > 0
    # what is left is enough: the oldest snapshot kept plus the log after it gives the newest
    restored = {n: cluster.snapshots()._actors(n, oldest) for n in ("Account", "AuditLog")}
    engine = LocalEngine(app_named(cluster.name), 2)
    engine.load(restored, oldest.epoch, carried_of(oldest))
    logged = KafkaCommandLog(cluster.kafka, f"{cluster.name}.cmd").epochs(
        oldest.command_log_position, to_end=True
    )
    for epoch in logged:
        if epoch.record.epoch <= newest.epoch:
            asyncio.run(engine.run_epoch(epoch.record))
    assert engine.digest() == newest.digest
    egress = cluster.egress()
    assert len(egress) == len({(r.epoch, r.seq) for r in egress}) == cluster.transfers

    # `epochal replay --from-start` says what replays instead; it failed mid-read
    monkeypatch.setenv("PYTHONHASHSEED", "0")  # else replay re-executes itself under it
    bootstrap = cluster.kafka.config.bootstrap_servers
    replay = ["replay", cluster.app_spec, "--name", cluster.name, "--bootstrap", bootstrap]
    replay += ["--warehouse", str(cluster.warehouse)]
    assert main([*replay, "--from-start"]) == 1
    said = " ".join(capsys.readouterr().err.split())
    assert f"now starts at offset {oldest.command_log_position}: replay from the latest" in said
    assert "leave out --from-start" in said and f"`epochal recover {cluster.app_spec}`" in said
    assert main(replay) == 0  # the default: from the latest snapshot
    assert f"digest {newest.digest}" in " ".join(capsys.readouterr().err.split())


def test_snapshots_on_or_off_leave_the_same_final_state(
    kafka_config: KafkaConfig, tmp_path: Path
) -> None:
    """Transfers below 30 emit no audit, so epoch boundaries cannot change the outcome."""
    rng = random.Random(11)
    values = [msgspec.msgpack.encode(Deposit(a, 100)) for a in range(40)]
    values += [
        msgspec.msgpack.encode(Transfer(rng.randrange(40), rng.randrange(40), rng.randrange(1, 30)))
        for _ in range(1500)
    ]
    digests = []
    for flags in (dict(snapshot_ms=0), dict(snapshot_ms=1000, extra=EVERY_EPOCH)):
        run = Cluster(
            f"c{uuid.uuid4().hex[:8]}", tmp_path / str(len(digests)), KafkaClients(kafka_config)
        )
        run.run_dir.mkdir()
        try:
            run.start(workers=2, partitions=4, **flags)  # type: ignore[arg-type]
            run.produce_values(values)
            run.transfers = 1500
            run.check_against_the_oracle()
            oracle = SerialOracle(app)
            oracle.run(run.epochs())
            digests.append(state_digest(oracle.state.items()))
            run.stop()
        finally:
            run.close()
    assert digests[0] == digests[1]
