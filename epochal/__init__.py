"""epochal: transactional stream processing with queryable state, on Kafka, Delta Lake and Spark.

The public surface, re-exported by name; ``tests/unit/test_public_api.py`` pins it.
"""

from epochal.actors.api import App
from epochal.actors.context import Context
from epochal.actors.windows import CountWindow, TimeWindow
from epochal.config import (
    CacheConfig,
    FailureConfig,
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
from epochal.schemas.commands import DeadLetter
from epochal.schemas.egress import EgressRecord

__version__ = "0.1.0"

__all__ = [
    "App",
    "BrokerUnavailableError",
    "CacheConfig",
    "ConfigError",
    "Context",
    "CountWindow",
    "DeadLetter",
    "EgressRecord",
    "EpochalError",
    "FailureConfig",
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
