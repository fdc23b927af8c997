"""Real Spark (local[2]) with Delta and the Kafka source; delta-rs and Spark read each other."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession

from epochal.log.client import KafkaClients

pytestmark = pytest.mark.integration


def _rows(frame: object) -> set[tuple[object, ...]]:
    return {tuple(row) for row in frame.collect()}  # type: ignore[attr-defined]


def test_spark_writes_overwrites_and_time_travels_a_delta_table(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = str(tmp_path / "accounts")
    spark.createDataFrame([("a", 1), ("b", 2)], "key string, balance long").write.format(
        "delta"
    ).save(path)
    spark.createDataFrame([("a", 10)], "key string, balance long").write.format("delta").mode(
        "overwrite"
    ).save(path)

    assert _rows(spark.read.format("delta").load(path)) == {("a", 10)}
    assert _rows(spark.read.format("delta").option("versionAsOf", 0).load(path)) == {
        ("a", 1),
        ("b", 2),
    }
    assert DeltaTable(path).version() == 1


def test_delta_rs_table_is_read_by_spark_with_time_travel(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = str(tmp_path / "from_rust")
    first = pa.table({"key": ["x", "y"], "n": pa.array([1, 2], pa.int64())})
    second = pa.table({"key": ["z"], "n": pa.array([3], pa.int64())})
    write_deltalake(path, first)
    write_deltalake(path, second, mode="append")

    assert _rows(spark.read.format("delta").load(path)) == {("x", 1), ("y", 2), ("z", 3)}
    assert _rows(spark.read.format("delta").option("versionAsOf", 0).load(path)) == {
        ("x", 1),
        ("y", 2),
    }


def test_spark_table_is_read_by_delta_rs(spark: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "from_spark")
    rows = [(f"k{i}", i, i / 4) for i in range(100)]
    spark.createDataFrame(rows, "key string, n long, f double").write.format("delta").save(path)

    table = DeltaTable(path).to_pyarrow_table()
    by_rust = set(zip(*(table.column(c).to_pylist() for c in ("key", "n", "f")), strict=True))
    assert by_rust == set(rows) == _rows(spark.read.format("delta").load(path))


def test_spark_reads_a_kafka_topic_in_batch(
    spark: SparkSession, kafka: KafkaClients, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory(partitions=2)
    producer = kafka.producer()
    for i in range(200):
        producer.produce(topic, key=f"k{i % 5}".encode(), value=f"v{i}".encode())
    assert producer.flush(30) == 0

    frame = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", kafka.config.bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    values = {bytes(row["value"]).decode() for row in frame.select("value").collect()}
    assert values == {f"v{i}" for i in range(200)}
    assert {row["partition"] for row in frame.select("partition").collect()} == {0, 1}
