"""An app stopped (or killed) and restarted — with another partition count, without the
sequencer's consumer-group offsets — applies each input once and writes each egress record once.

Egress positions live in ``<app>.egress-positions``, committed with the egress itself; a new
partition count first finishes the old layout's egress (``actors/egress.py``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import signal
import threading
import time
import uuid

import pytest
from confluent_kafka import Producer, TopicPartition

from epochal.actors.egress import prepare_egress
from epochal.actors.engine import LocalEngine
from epochal.actors.partitioning import KeyRanges
from epochal.actors.snapshots import carried_of
from epochal.log.client import KafkaClients
from epochal.log.command_log import chunk_epoch
from epochal.log.egress import (
    EgressWriter,
    ensure_positions_topic,
    read_egress_state,
    write_layout,
)
from epochal.log.topics import TopicNames
from epochal.schemas.codec import decode, encode
from epochal.schemas.egress import EgressLayout, EgressPosition, EgressRecord
from epochal.schemas.snapshots import Manifest
from tests.integration.cluster import ACCOUNTS, Cluster, gone, wait_until
from tests.unit.actors.workload import Deposit, Transfer, app, command_log

pytestmark = pytest.mark.integration


def test_restarts_with_other_partition_counts_and_no_group_offsets_repeat_nothing(
    cluster: Cluster,
) -> None:
    cluster.start(workers=1, partitions=2)
    cluster.produce(4000, deposits=True)
    wait_until(lambda: len(cluster.egress()) > 200, 60, "no egress yet", log=cluster.log)
    status = cluster.status()  # killed mid-way: the two writers stand at different positions
    children = [int(status["sequencer"]), *(int(w) for w in status["workers"])]
    os.kill(int(status["supervisor"]), signal.SIGKILL)
    cluster.processes[-1].wait(10)
    wait_until(lambda: all(gone(pid) for pid in children), 5, "children outlived the supervisor")
    cluster.produce(500)  # input arrives while the app is down

    cluster.start(workers=2, partitions=4)  # another count: the old layout is finished first
    cluster.produce(300)
    cluster.check_against_the_oracle()
    cluster.stop()

    # Kafka expires the offsets of groups that never join; the command log is the truth
    admin = cluster.kafka.admin()
    for future in admin.delete_consumer_groups([f"{cluster.name}.sequencer"]).values():
        future.result(30)
    cluster.produce(300)
    cluster.start(workers=1, partitions=3)
    cluster.produce(200)
    cluster.check_against_the_oracle()
    cluster.stop()
    layout = read_egress_state(cluster.kafka, cluster.name).layout
    assert layout is not None and layout.partitions == 3


@pytest.mark.parametrize("change", ["count", "points"])
def test_a_new_layout_first_releases_exactly_what_each_old_writer_still_owed(
    kafka: KafkaClients, change: str
) -> None:
    """Writers of a 2-partition layout stopped at different positions; moving to 4 partitions,
    or to other split points (a rebalance), releases, through each old writer, its outputs from
    its own position on, and nothing else."""
    test_app = dataclasses.replace(app, name=f"lay{uuid.uuid4().hex[:8]}")
    old = KeyRanges.even(test_app, 2)
    new = KeyRanges.even(test_app, 4)
    if change == "points":  # other owners of accounts 10-19: other reporters of transfers
        new = KeyRanges(2, {**old.points, "Account": [10]})
    topics = test_app.topics
    opening = [[Deposit(a, 100) for a in range(40)]]
    transfers = [[Transfer(a, (a * 7 + e) % 40, 20 + e) for a in range(40)] for e in range(6)]
    records = command_log(opening + transfers)
    kafka.create_topics([topics.command_log, topics.egress("receipts"), topics.egress("errors")])
    producer = Producer({"bootstrap.servers": kafka.config.bootstrap_servers})
    positions: list[int] = []
    for record in records:
        for chunk in chunk_epoch(record, chunk_bytes=400):  # several chunks per epoch
            producer.produce(topics.command_log, chunk)
        producer.flush(30)
        positions.append(kafka.end_offset(topics.command_log) - 1)  # its final chunk
    end = kafka.end_offset(topics.command_log)

    prepare_egress(test_app, kafka, old)  # a new app: layout (2, 0)
    owed = {0: positions[2] + 1, 1: positions[5] + 1}  # where each writer had stopped
    for partition, position in owed.items():
        writer = EgressWriter(kafka, test_app.name, partition, 2)
        writer.commit(position)
        writer.close()

    layout = prepare_egress(test_app, kafka, new)
    assert layout == EgressLayout(new.partitions, end, new.recorded())

    results = asyncio.run(LocalEngine(test_app, 2).run(records))  # who reported what, 2 writers
    expected = set()
    for position, result in zip(positions, results, strict=True):
        for partition, outcomes in result.by_partition.items():
            if position >= owed[partition]:
                expected |= {(o.epoch, o.seq) for o in outcomes if o.handler == "transfer"}
    released = [(r.epoch, r.seq) for r in _egress(kafka, test_app.name)]
    assert len(released) == len(set(released))
    assert set(released) == expected and expected

    state = read_egress_state(kafka, test_app.name)
    assert all(state.start(p) == end for p in range(new.partitions))
    assert prepare_egress(test_app, kafka, new) == layout  # nothing more to do
    write_layout(kafka, test_app.name, layout)  # idempotent: the same record again
    assert len(_egress(kafka, test_app.name)) == len(released)


def _egress(kafka: KafkaClients, name: str) -> list[EgressRecord]:
    out: list[EgressRecord] = []
    for suffix in ("receipts", "errors"):
        consumer = kafka.assigned_consumer(
            f"{name}.out.{suffix}", {0: 0}, **{"isolation.level": "read_committed"}
        )
        deadline = time.monotonic() + 5
        while batch := consumer.consume(10_000, 1.0):
            out += [decode(m.value() or b"", EgressRecord) for m in batch if m.error() is None]
            if time.monotonic() > deadline:
                break
        consumer.close()
    return out


def test_a_command_log_truncated_anyway_stops_the_cluster_naming_what_is_missing(
    cluster: Cluster,
) -> None:
    cluster.start(workers=1, partitions=2, snapshot_ms=0)  # recovery replays from offset 0
    for transfers in (200, 50, 50):  # three epochs at least: the log holds offsets 0..5 or more
        cluster.produce(transfers, deposits=transfers == 200)
        assert len(cluster.wait_for_egress()) == cluster.transfers
    cluster.stop()
    assert cluster.kafka.end_offset(f"{cluster.name}.cmd") >= 6
    admin = cluster.kafka.admin()
    command_log = TopicPartition(f"{cluster.name}.cmd", 0, 3)
    admin.delete_records([command_log])[command_log].result(30)  # Kafka's retention, say

    cluster.start(workers=1, partitions=2, snapshot_ms=0)
    assert cluster.processes[-1].wait(60) == 1  # stops: no restart can bring records back
    log = cluster.log()
    assert "cannot go on" in log
    assert f"topic={cluster.name}.cmd, partition=0" in log and "missing=0..2" in log


@pytest.mark.parametrize("keep", [1, 2])  # to the latest snapshot, to an older one (10 elsewhere)
def test_restarts_after_idle_and_busy_stops_go_on_whatever_retention_trimmed(
    cluster: Cluster, keep: int
) -> None:
    """Retention trims the command log and the input back to the oldest snapshot kept. A young
    app's only snapshot ends the log after an idle stop (so does the latest with ``keep`` 1):
    nothing of the log is left, and the restart goes on from the snapshot. A busy stop leaves
    input after its savepoint. Either way each input is applied once and each egress record
    written once."""

    def start() -> None:
        retention = ["--keep-snapshots", str(keep)]
        epochs = ["--epoch-records", str(ACCOUNTS)]  # the deposits in one, the transfers in many
        cluster.start(workers=1, partitions=2, snapshot_ms=200, extra=[*retention, *epochs])

    command_log = f"{cluster.name}.cmd"
    cluster.kafka.create_topics([f"{cluster.name}.in.ops"])
    cluster.produce(0, deposits=True)  # there before the start: all in epoch 0, a snapshot
    start()
    (young,) = _idle(cluster, keep)
    position = young.command_log_position
    assert cluster.kafka.watermarks(command_log) == (position, position + 1)  # a marker left
    cluster.stop()

    start()
    end, running = cluster.kafka.end_offset(command_log), cluster.processes[-1]
    cluster.produce(20_000)  # 500 epochs of 40: the stop, right after the first, lands mid-way
    logged = lambda: cluster.kafka.end_offset(command_log) > end  # noqa: E731
    wait_until(logged, 60, "no epoch logged", lambda: running.poll() is None, cluster.log)
    cluster.stop()
    saved = re.findall(r"stopped at a savepoint ssid=(\d+)", cluster.log())
    assert len(saved) == 2, cluster.log()  # the idle stop and the busy one
    assert f"from_epoch={int(saved[0]) + 1} " in cluster.log()  # the restart went on from it
    assert len(cluster.egress()) < cluster.transfers, "stopped busy: input left for the restart"

    start()
    cluster.produce(100)
    assert len(_idle(cluster, keep)) <= keep
    cluster.check_against_the_oracle()
    cluster.check_snapshots_against_the_oracle()
    cluster.stop()


def _idle(cluster: Cluster, keep: int) -> list[Manifest]:
    """Waits until every input is out, the latest snapshot covers it and ends the log (nothing
    left to run after it), and retention expired all but the ``keep`` newest snapshots (right
    after a commit there is one more for a moment: expiry follows the commit) and trimmed the
    log back to the oldest one kept."""
    running, command_log = cluster.processes[-1], f"{cluster.name}.cmd"

    def idle() -> bool:
        manifests = cluster.snapshots().manifests()
        if not manifests:
            return False
        latest = manifests[-1]
        low, high = cluster.kafka.watermarks(command_log)
        covered = sum(o for k, o in latest.input_positions.items() if k.endswith(".in.ops:0"))
        ends = high == latest.command_log_position + 1 and not carried_of(latest)
        trimmed = low == manifests[0].command_log_position and len(manifests) <= keep
        return covered == cluster.produced and ends and trimmed

    assert len(cluster.wait_for_egress()) == cluster.transfers, cluster.log()
    wait_until(idle, 60, "not idle", lambda: running.poll() is None, cluster.log)
    return cluster.snapshots().manifests()


def test_the_supervisor_sees_a_layout_written_after_a_zombies_open_transaction(
    kafka: KafkaClients,
) -> None:
    """The layout is not transactional, so the supervisor reads the positions topic without
    waiting for open transactions: to its high watermark, not its last stable offset, which a
    zombie writer's open transaction holds back until it is fenced or times out."""
    name = f"zom{uuid.uuid4().hex[:8]}"
    ensure_positions_topic(kafka, name)
    topic = TopicNames(name).egress_positions
    zombie = kafka.producer(**{"transactional.id": f"{name}.zombie"})
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(topic, b"half-way", b"zombie")
    assert zombie.flush(30) == 0
    try:
        write_layout(kafka, name, EgressLayout(3, 0))
        assert read_egress_state(kafka, name, committed=False).layout == EgressLayout(3, 0)
    finally:
        zombie.abort_transaction(30)


def test_a_worker_sees_positions_committed_after_another_workers_zombie_transaction(
    kafka: KafkaClients,
) -> None:
    """Worker 1's writer commits its position after worker 0's killed writer left a
    transaction open on the positions topic. Worker 1, restarted, must read that position (or
    it releases again what it released): its committed read waits until worker 0's new writer
    fences the zombie, instead of stopping at the last stable offset, before the position."""
    name = f"zop{uuid.uuid4().hex[:8]}"
    ensure_positions_topic(kafka, name)
    write_layout(kafka, name, EgressLayout(2, 0))
    zombie = EgressWriter(kafka, name, 0, 2)
    zombie._producer.begin_transaction()  # killed in the middle of a commit
    half_way = encode(EgressPosition(0, 2, 7))
    zombie._producer.produce(TopicNames(name).egress_positions, half_way, b"writer:0")
    assert zombie._producer.flush(30) == 0
    released = EgressWriter(kafka, name, 1, 2)
    released.commit(5)
    restarted = EgressWriter(kafka, name, 1, 2)  # fences its own zombie only
    fencing = threading.Timer(1.0, lambda: EgressWriter(kafka, name, 0, 2).close())
    fencing.start()  # worker 0's new incarnation, starting meanwhile
    try:
        state = read_egress_state(kafka, name)
    finally:
        fencing.join(30)
        for writer in (zombie, released, restarted):
            writer.close()
    assert state.start(1) == 5, "the position committed behind the open transaction"
    assert state.start(0) == 0, "the zombie's transaction was aborted"


def test_a_commit_larger_than_the_producers_queue_writes_every_record_once_in_order(
    kafka: KafkaClients,
) -> None:
    """A backlog's egress commit may hold more records than librdkafka's local queue: the
    writer waits for room at the record that found it full and goes on from there, losing,
    repeating and reordering nothing."""
    name = f"egq{uuid.uuid4().hex[:8]}"
    topic = TopicNames(name).egress("receipts")
    ensure_positions_topic(kafka, name)
    kafka.create_topics([topic])
    writer = EgressWriter(kafka, name, 0, 1, queue_records=40)
    try:
        values = [f"receipt {i}".encode() for i in range(1_000)]
        for value in values:
            writer.add(topic, value)
        writer.commit(9)
    finally:
        writer.close()
    read = kafka.read_range(topic, {0: (0, kafka.end_offset(topic))}, "reading receipts")
    assert [message.value() for message in read] == values
    assert read_egress_state(kafka, name).start(0) == 9
