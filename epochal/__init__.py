"""epochal: transactional stream processing with queryable state, on Kafka, Delta Lake and Spark.

The public surface, re-exported by name; ``tests/unit/test_public_api.py`` pins it.
"""

from epochal.config import CacheConfig, KafkaConfig, LocalBrokerConfig, SparkConfig
from epochal.errors import (
    BrokerUnavailableError,
    ConfigError,
    EpochalError,
    LocalBrokerError,
    LogError,
    LogTruncatedError,
    QueryError,
    RecoveryError,
    SchemaError,
    SnapshotMissingError,
    TransactionAborted,
)

__version__ = "0.1.0"

__all__ = [
    "BrokerUnavailableError",
    "CacheConfig",
    "ConfigError",
    "EpochalError",
    "KafkaConfig",
    "LocalBrokerConfig",
    "LocalBrokerError",
    "LogError",
    "LogTruncatedError",
    "QueryError",
    "RecoveryError",
    "SchemaError",
    "SnapshotMissingError",
    "SparkConfig",
    "TransactionAborted",
    "__version__",
]
