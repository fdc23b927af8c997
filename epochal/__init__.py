"""epochal: transactional stream processing with queryable state, on Kafka, Delta Lake and Spark.

The public surface, re-exported by name; ``tests/unit/test_public_api.py`` pins it. The Spark
SQL functions (``register_views``, ``state_at``) and ``SnapshotReader`` (delta-rs) load their
libraries on first use, so that ``import epochal`` stays light for a service that only queries.
"""

from typing import TYPE_CHECKING, Any

from epochal.actors.api import App
from epochal.actors.context import Context
from epochal.actors.windows import CountWindow, TimeWindow
from epochal.client import (
    COMMITTED,
    LIVE,
    SERIALIZABLE,
    SNAPSHOT,
    Client,
    Isolation,
    Outcome,
    QueryClient,
    ReadDict,
    ReadList,
)
from epochal.config import (
    CacheConfig,
    ClusterConfig,
    FailureConfig,
    KafkaConfig,
    LocalBrokerConfig,
    RebalanceConfig,
    SnapshotConfig,
    SparkConfig,
)
from epochal.errors import (
    BrokerUnavailableError,
    ConfigError,
    EpochalError,
    LocalBrokerError,
    LogError,
    LogTruncatedError,
    QueryError,
    QueryTimeoutError,
    QueryUnavailableError,
    RecoveryError,
    SchemaError,
    SnapshotMissingError,
    SnapshotNotRetainedError,
    TransactionAborted,
)
from epochal.launch import run
from epochal.schemas.commands import DeadLetter
from epochal.schemas.egress import EgressFormat, EgressRecord

if TYPE_CHECKING:
    from epochal.analytics.history import register_views, state_at
    from epochal.recovery.snapshot_reads import SnapshotReader

__version__ = "0.1.0"

__all__ = [
    "COMMITTED",
    "LIVE",
    "SERIALIZABLE",
    "SNAPSHOT",
    "App",
    "BrokerUnavailableError",
    "CacheConfig",
    "Client",
    "ClusterConfig",
    "ConfigError",
    "Context",
    "CountWindow",
    "DeadLetter",
    "EgressFormat",
    "EgressRecord",
    "EpochalError",
    "FailureConfig",
    "Isolation",
    "KafkaConfig",
    "LocalBrokerConfig",
    "LocalBrokerError",
    "LogError",
    "LogTruncatedError",
    "Outcome",
    "QueryClient",
    "QueryError",
    "QueryTimeoutError",
    "QueryUnavailableError",
    "ReadDict",
    "ReadList",
    "RebalanceConfig",
    "RecoveryError",
    "SchemaError",
    "SnapshotConfig",
    "SnapshotMissingError",
    "SnapshotNotRetainedError",
    "SnapshotReader",
    "SparkConfig",
    "TimeWindow",
    "TransactionAborted",
    "__version__",
    "register_views",
    "run",
    "state_at",
]

_ON_FIRST_USE = {
    "register_views": "epochal.analytics.history",
    "state_at": "epochal.analytics.history",
    "SnapshotReader": "epochal.recovery.snapshot_reads",
}


def __getattr__(name: str) -> Any:
    """The names whose modules load heavy libraries (pyspark, delta-rs), imported when first
    asked for."""
    if name in _ON_FIRST_USE:
        import importlib

        return getattr(importlib.import_module(_ON_FIRST_USE[name]), name)
    raise AttributeError(f"module 'epochal' has no attribute {name!r}")
