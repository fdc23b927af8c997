"""epochal: transactional stream processing with queryable state, on Kafka, Delta Lake and Spark.

The public surface, re-exported by name; ``tests/unit/test_public_api.py`` pins it.
"""

from epochal.actors.api import App
from epochal.actors.context import Context
from epochal.actors.windows import CountWindow, TimeWindow
from epochal.config import (
    CacheConfig,
    KafkaConfig,
    LocalBrokerConfig,
    SequencerConfig,
    SparkConfig,
    WorkerConfig,
)
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
    "App",
    "BrokerUnavailableError",
    "CacheConfig",
    "ConfigError",
    "Context",
    "CountWindow",
    "EpochalError",
    "KafkaConfig",
    "LocalBrokerConfig",
    "LocalBrokerError",
    "LogError",
    "LogTruncatedError",
    "QueryError",
    "RecoveryError",
    "SchemaError",
    "SequencerConfig",
    "SnapshotMissingError",
    "SparkConfig",
    "TimeWindow",
    "TransactionAborted",
    "WorkerConfig",
    "__version__",
]
