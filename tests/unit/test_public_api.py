"""Pins the public surface: adding or removing a name is a decision, made here."""

from __future__ import annotations

import epochal

EXPORTED = {
    "App", "Context", "CountWindow", "TimeWindow",
    "BrokerUnavailableError", "CacheConfig", "ConfigError", "EpochalError", "KafkaConfig",
    "LocalBrokerConfig", "LocalBrokerError", "LogError", "LogTruncatedError", "QueryError",
    "RecoveryError", "SchemaError", "SnapshotMissingError", "SparkConfig", "TransactionAborted",
    "ClusterConfig", "run", "FailureConfig", "EgressRecord", "DeadLetter",
    "SnapshotNotRetainedError", "register_views", "state_at", "SnapshotConfig", "SnapshotReader",
    "Client", "QueryClient", "Isolation", "Outcome", "LIVE", "COMMITTED", "SERIALIZABLE",
    "SNAPSHOT", "QueryTimeoutError", "QueryUnavailableError", "RebalanceConfig", "ReadDict",
    "ReadList", "EgressFormat",
    "__version__",
}  # fmt: skip


def test_exported_names_are_pinned() -> None:
    assert set(epochal.__all__) == EXPORTED
    assert all(hasattr(epochal, name) for name in epochal.__all__)


def test_importing_epochal_loads_neither_spark_nor_delta_nor_arrow() -> None:
    """A service that only queries live state imports epochal without pyspark, delta-rs or
    pyarrow."""
    import subprocess
    import sys

    heavy = ("pyspark", "deltalake", "pyarrow")
    code = ("import sys, epochal; assert epochal.Client and epochal.COMMITTED; "
            f"print(sorted(m for m in {heavy!r} if m in sys.modules))")  # fmt: skip
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.strip()  # fmt: skip
    assert loaded == "[]"


def test_the_test_harness_is_light_and_not_imported_by_epochal() -> None:
    """``epochal.testing`` runs in a user's test process: no Spark, Delta or Arrow, and pytest
    only for its plugin; ``import epochal`` does not import it."""
    import subprocess
    import sys

    heavy = ("pyspark", "deltalake", "pyarrow", "pytest")
    code = ("import sys, epochal; assert 'epochal.testing' not in sys.modules; "
            "import epochal.testing; "
            f"print(sorted(m for m in {heavy!r} if m in sys.modules))")  # fmt: skip
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.strip()  # fmt: skip
    assert loaded == "[]"
