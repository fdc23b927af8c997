"""Spark: the session factory (Delta and the Kafka source from cached jars), SQL over history."""

from epochal.analytics.spark import spark_jars, spark_session

__all__ = ["spark_jars", "spark_session"]
