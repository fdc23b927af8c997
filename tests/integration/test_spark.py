"""Real Spark (local[2]) with Delta and the Kafka source; delta-rs and Spark read each other."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession

from epochal.config import CacheConfig
from epochal.jvm import JarSet
from epochal.log.client import KafkaClients
from tests.integration.cluster import wait_until

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


_START = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from epochal.analytics.spark import spark_session
    from epochal.config import SparkConfig
    jars, name, work = sys.argv[1:]
    spark_session(SparkConfig(jar_dir=Path(jars), app_name=name, work_dir=Path(work)))
    print("started", flush=True)
    """
)


def test_ctrl_c_while_a_spark_session_starts_leaves_no_jvm(
    cache: CacheConfig, tmp_path: Path
) -> None:
    """pyspark's JVM ends when its parent's end of its stdin closes, but only once it is up:
    a Ctrl-C while it started left it running for good (a gigabyte of heap a try). The start
    finishes, then the Ctrl-C ends the process, and the JVM with it."""
    name = f"interrupted-{uuid.uuid4().hex[:8]}"
    jars = str(cache.jar_dir(JarSet.SPARK.value))
    output = tmp_path / "output.txt"  # a file, not a pipe: the JVM shares it
    with output.open("w") as out:
        starting = subprocess.Popen([sys.executable, "-c", _START, jars, name, str(tmp_path)],
                                    stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        wait_until(lambda: bool(_jvms_of(name)), timeout_s=60, what="no Spark JVM started",
                   alive=lambda: starting.poll() is None)  # fmt: skip
        starting.send_signal(signal.SIGINT)  # its JVM is there, the session is not yet
        starting.wait(120)
        said = output.read_text()
        assert starting.returncode == -signal.SIGINT, said  # ended by the Ctrl-C, once up:
        assert "started" not in said and "KeyboardInterrupt" in said  # not handed out
        wait_until(lambda: not _jvms_of(name), timeout_s=30,
                   what="the Spark JVM outlived the interrupted start",
                   log=lambda: str(_jvms_of(name)))  # fmt: skip
    finally:
        if starting.poll() is None:
            starting.kill()
        for pid in _jvms_of(name):  # what a failure left
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _jvms_of(app_name: str) -> list[int]:
    """Spark JVMs started for ``app_name``."""
    found = subprocess.run(["pgrep", "-f", f"spark.app.name={app_name} "], capture_output=True,
                           text=True, check=False)  # fmt: skip
    return [int(pid) for pid in found.stdout.split()]
