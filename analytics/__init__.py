"""Spark: the session factory (Delta and the Kafka source from cached jars), SQL over history."""

from epochal.analytics.history import query_rows, register_views, state_at
from epochal.analytics.spark import spark_jars, spark_session

__all__ = ["query_rows", "register_views", "spark_jars", "spark_session", "state_at"]
