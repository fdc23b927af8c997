from __future__ import annotations

from pathlib import Path

import pytest

from epochal.analytics.spark import _artifact, _local_delta_settings, spark_jars
from epochal.errors import ConfigError


@pytest.mark.parametrize(
    ("jar", "artifact"),
    [
        ("jackson-core-2.13.5.jar", "jackson-core"),
        ("delta-spark_4.2_2.13-4.4.0.jar", "delta-spark_4.2_2.13"),
        ("zstd-jni-1.5.7-3.jar", "zstd-jni"),
        ("spark-sql-kafka-0-10_2.13-4.2.0.jar", "spark-sql-kafka-0-10_2.13"),
        ("kafka-clients-3.9.2.jar", "kafka-clients"),
    ],
)
def test_artifact_name_drops_the_version(jar: str, artifact: str) -> None:
    assert _artifact(Path(jar)) == artifact


def test_missing_jars_say_how_to_fetch_them(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="epochal jars fetch"):
        spark_jars(tmp_path)


@pytest.mark.parametrize(
    ("master", "tasks"),
    [("local", "1"), ("local[2]", "2"), ("local[3,4]", "3"), ("spark://host:7077", None)],
)
def test_delta_rebuilds_table_versions_in_one_task_per_local_core(
    master: str, tasks: str | None
) -> None:
    """Delta's default of 50 tasks per version read cost 7-10 s a read on 2 cores; a cluster
    keeps Delta's default."""
    settings = _local_delta_settings(master)
    assert settings.get("spark.databricks.delta.snapshotPartitions") == tasks
