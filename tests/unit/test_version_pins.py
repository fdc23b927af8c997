"""The JVM artifacts in the POMs match the Python wheels that are installed."""

from __future__ import annotations

import re
from importlib.metadata import version

import pyspark

from epochal.jvm import JarSet


def _property(pom: str, name: str) -> str:
    match = re.search(rf"<{re.escape(name)}>([^<]+)</{re.escape(name)}>", pom)
    assert match, name
    return match.group(1)


def test_spark_pom_names_the_delta_artifact_that_delta_pip_would() -> None:
    """delta-spark's configure_spark_with_delta_pip names delta-spark_<spark x.y>_2.13:<delta>."""
    pom = JarSet.SPARK.pom.read_text()
    assert _property(pom, "delta.version") == version("delta_spark")
    assert _property(pom, "spark.version") == pyspark.__version__
    major_minor = ".".join(pyspark.__version__.split(".")[:2])
    assert _property(pom, "spark.binary.version") == major_minor
    assert "<artifactId>delta-spark_${spark.binary.version}_2.13</artifactId>" in pom


def test_broker_pom_carries_kafka_4_and_its_logging_backend() -> None:
    pom = JarSet.KAFKA_BROKER.pom.read_text()
    assert _property(pom, "kafka.version").startswith("4.")
    for artifact in ("kafka_2.13", "log4j-slf4j-impl", "log4j-core", "log4j-api"):
        assert f"<artifactId>{artifact}</artifactId>" in pom
