"""Pins the public surface: adding or removing a name is a decision, made here."""

from __future__ import annotations

import epochal

EXPORTED = {
    "App", "Context", "CountWindow", "TimeWindow",
    "BrokerUnavailableError", "CacheConfig", "ConfigError", "EpochalError", "KafkaConfig",
    "LocalBrokerConfig", "LocalBrokerError", "LogError", "LogTruncatedError", "QueryError",
    "RecoveryError", "SchemaError", "SnapshotMissingError", "SparkConfig", "TransactionAborted",
    "SequencerConfig", "WorkerConfig", "FailureConfig", "EgressRecord", "DeadLetter",
    "__version__",
}  # fmt: skip


def test_exported_names_are_pinned() -> None:
    assert set(epochal.__all__) == EXPORTED
    assert all(hasattr(epochal, name) for name in epochal.__all__)
