"""A worker's status record: its partitions' key ranges, counters and rates."""

from __future__ import annotations

from epochal.actors.partitioning import KeyRanges
from epochal.actors.status_report import WorkerReport, partition_ranges
from epochal.config import WorkerConfig
from epochal.metrics import Metrics
from epochal.schemas.codec import decode, encode
from epochal.schemas.commands import PartitionId
from epochal.schemas.status import AnyStatus, KeyRange, ProcessState, WorkerStatus


def test_each_partition_owns_the_range_between_its_split_points() -> None:
    ranges = KeyRanges(3, {"Account": [10, 20], "User": ["m", "t"]})
    assert partition_ranges(ranges, 0) == (
        KeyRange("Account", None, 10),
        KeyRange("User", None, "m"),
    )
    assert partition_ranges(ranges, 1) == (KeyRange("Account", 10, 20), KeyRange("User", "m", "t"))
    assert partition_ranges(ranges, 2) == (
        KeyRange("Account", 20, None),
        KeyRange("User", "t", None),
    )


def test_a_worker_reports_its_partitions_counters_and_endpoints() -> None:
    config = WorkerConfig(
        "bank",
        worker=1,
        workers=2,
        partitions=4,
        generation=3,
        run_id="r1",
        metrics_port=9100,
        query=("127.0.0.1:7700", "127.0.0.1:7701"),
    )
    metrics = Metrics()
    metrics.inc("epochal_epochs_total", 7)
    metrics.inc("epochal_transactions_total", 40, outcome="committed")
    metrics.inc("epochal_transactions_total", 2, outcome="aborted")
    metrics.set("epochal_partition_actors", 12, partition="3")
    ranges = KeyRanges(4, {"Account": [10, 20, 30]})
    report = WorkerReport(config, metrics, ranges, (PartitionId(2), PartitionId(3)), lambda: 8)
    record = report()
    assert (record.worker, record.generation, record.run_id) == (1, 3, "r1")
    assert [(p.partition, p.actors) for p in record.partitions] == [(2, 0), (3, 12)]
    assert record.partitions[1].ranges == (KeyRange("Account", 30, None),)
    assert (record.epoch, record.epochs, record.committed, record.aborted) == (7, 7, 40, 2)
    assert (record.query, record.metrics) == ("127.0.0.1:7701", "127.0.0.1:9101")
    assert record.key == b"worker:1"
    assert report(ProcessState.STOPPED).state is ProcessState.STOPPED


def test_status_records_decode_by_their_role_tag() -> None:
    config = WorkerConfig("bank", run_id="r1")
    record = WorkerReport(config, Metrics(), KeyRanges(1, {}), (PartitionId(0),), lambda: 0)()
    decoded = decode(encode(record), AnyStatus)  # type: ignore[arg-type]
    assert isinstance(decoded, WorkerStatus)
    assert decoded == record
