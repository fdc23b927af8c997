"""Configuration objects, each frozen and built once in an entry point (the CLI, a test fixture).

Nothing here reads the environment at import time: :func:`cache_dir_from_env` is called by entry
points only. Units are in the field names (``_ms``, ``_s``); secrets are redacted in ``repr``.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum, StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import Any

from epochal.errors import ConfigError

__all__ = [
    "CacheConfig",
    "ClusterConfig",
    "FailureConfig",
    "KafkaConfig",
    "Listener",
    "LocalBrokerConfig",
    "LogFormat",
    "RebalanceConfig",
    "SequencerConfig",
    "SnapshotConfig",
    "SparkConfig",
    "SqlServerConfig",
    "WorkerConfig",
    "cache_dir_from_env",
    "resolve_warehouse",
]

_SECRET_MARKERS = ("password", "secret", "jaas", "token", "key.pem", "credentials")


def _redacted(settings: Mapping[str, str]) -> dict[str, str]:
    return {
        k: ("***" if any(m in k.lower() for m in _SECRET_MARKERS) else v)
        for k, v in settings.items()
    }


def cache_dir_from_env() -> Path:
    """Where jars and local brokers live: ``$EPOCHAL_CACHE``, else ``~/.cache/epochal``."""
    configured = os.environ.get("EPOCHAL_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "epochal"


# Schemes whose stores delta-rs and pyarrow both reach (credentials as storage options).
_OBJECT_STORE_SCHEMES = frozenset({"s3", "s3a", "gs", "gcs", "az", "azure", "abfs", "abfss"})


def resolve_warehouse(location: str) -> str:
    """The one form of a warehouse every process and library reads alike.

    A path (relative, ``~``, absolute) or a ``file://`` URI becomes an absolute path: the
    workers, Spark and delta-rs each resolve a relative one against their own working directory
    or take it for a URI, so only an absolute one means the same to all. Object-store URIs
    (``s3://``, ``gs://``, ``az://``, ``abfss://``, ...) stay as they are; any other scheme is
    refused here, at start, rather than by the first snapshot.

    >>> resolve_warehouse("file:///tmp/w/")
    '/tmp/w'
    >>> resolve_warehouse("s3://bucket/w/")
    's3://bucket/w'
    """
    text = location.strip()
    if not text:
        raise ConfigError("the warehouse is empty: give a path or a URI", warehouse=location)
    scheme, sep, _ = text.partition("://")
    if not sep:
        return os.path.abspath(os.path.expanduser(text))
    scheme = scheme.lower()
    if scheme == "file":
        parsed = urllib.parse.urlparse(text)
        if parsed.netloc not in ("", "localhost"):
            raise ConfigError(
                "a file:// warehouse names a path on this host (file:///path)", warehouse=location
            )
        return os.path.abspath(urllib.parse.unquote(parsed.path))
    if scheme in _OBJECT_STORE_SCHEMES:
        return text.rstrip("/")
    known = ", ".join(f"{s}://" for s in sorted(_OBJECT_STORE_SCHEMES))
    raise ConfigError(
        f"the warehouse's scheme {scheme}:// is not supported: give a path, file://, or {known}",
        warehouse=location,
    )


class LogFormat(StrEnum):
    """How the processes of a cluster write their log lines: text, or one JSON object a line
    (for a log shipper: Fluent Bit, Vector, Loki, CloudWatch)."""

    TEXT = "text"
    JSON = "json"


class Listener(Enum):
    """What a port is for, and the flag that chooses it: one wording for the check at start and
    for a bind that fails later."""

    PEERS = ("connections from peer workers", "--port-base or --peers")
    QUERIES = ("live queries", "--query-port")
    METRICS = ("Prometheus metrics", "--metrics-port")
    FEED = ("the weak-mode epoch feed", "--feed")
    STATUS = ("the status page", "epochal status --serve")
    SQL = ("Spark Connect queries", "epochal sql --connect-port")

    @property
    def purpose(self) -> str:
        return self.value[0]

    @property
    def flag(self) -> str:
        return self.value[1]


@dataclass(frozen=True)
class CacheConfig:
    """A directory outside git that holds fetched jars and local broker data.

    >>> CacheConfig(Path("/tmp/c")).jar_dir("spark")
    PosixPath('/tmp/c/jars/spark')
    """

    root: Path

    def jar_dir(self, jar_set: str) -> Path:
        return self.root / "jars" / jar_set

    def broker_dir(self, port: int) -> Path:
        return self.root / "brokers" / str(port)

    def sql_server_dir(self) -> Path:
        return self.root / "sql-server"


@dataclass(frozen=True)
class KafkaConfig:
    """How to reach Kafka. ``settings`` pass straight to librdkafka (SASL, SSL, timeouts, ...).

    >>> KafkaConfig("127.0.0.1:9092", {"sasl.password": "hunter2"})
    KafkaConfig(bootstrap_servers='127.0.0.1:9092', settings={'sasl.password': '***'})
    """

    bootstrap_servers: str = "127.0.0.1:9092"
    settings: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        object.__setattr__(self, "settings", MappingProxyType(dict(self.settings)))

    def client_settings(self, **overrides: Any) -> dict[str, Any]:
        """librdkafka settings: bootstrap, then the pass-through settings, then overrides."""
        return {"bootstrap.servers": self.bootstrap_servers, **self.settings, **overrides}

    def __reduce__(self) -> tuple[type[KafkaConfig], tuple[str, dict[str, str]]]:
        return (KafkaConfig, (self.bootstrap_servers, dict(self.settings)))  # to child processes

    def __repr__(self) -> str:
        return (
            f"KafkaConfig(bootstrap_servers={self.bootstrap_servers!r}, "
            f"settings={_redacted(self.settings)!r})"
        )


@dataclass(frozen=True)
class LocalBrokerConfig:
    """A single-node KRaft broker (broker and controller in one JVM) on 127.0.0.1.

    ``controller_port`` 0 means ``port + 1``. ``startup_timeout_s`` bounds the wait until the
    broker answers metadata requests. ``heap_mb`` is the JVM's heap, all of it from the start.

    >>> LocalBrokerConfig(port=19092, data_dir=Path("/tmp/b")).bootstrap
    '127.0.0.1:19092'
    """

    port: int = 9092
    data_dir: Path = Path(".epochal/kafka")
    jar_dir: Path = Path(".epochal/jars/kafka-broker")
    controller_port: int = 0
    heap_mb: int = 1024
    startup_timeout_s: float = 30.0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def effective_controller_port(self) -> int:
        return self.controller_port or self.port + 1


@dataclass(frozen=True)
class SparkConfig:
    """A Spark session with Delta Lake and the Kafka source from locally cached jars.

    ``master`` is ``local[2]`` by default; any ``spark://`` (or other) master works by config.
    ``conf`` adds or overrides Spark settings.

    >>> SparkConfig(jar_dir=Path("/tmp/jars")).master
    'local[2]'
    """

    jar_dir: Path
    master: str = "local[2]"
    app_name: str = "epochal"
    work_dir: Path = Path(".epochal/spark")
    driver_memory: str = "1g"
    conf: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def __repr__(self) -> str:
        return (
            f"SparkConfig(master={self.master!r}, app_name={self.app_name!r}, "
            f"jar_dir={str(self.jar_dir)!r}, conf={_redacted(self.conf)!r})"
        )


@dataclass(frozen=True)
class SqlServerConfig:
    """The Spark Connect server ``epochal sql`` starts once and reuses, so that a query does not
    pay for a JVM and a Spark session each time.

    Its state file, log and Spark work dir live in ``directory``; it listens on 127.0.0.1 at
    ``port`` (0: a free port) and stops itself after ``idle_timeout_s`` without a query.
    ``startup_timeout_s`` bounds the wait for it to answer.

    >>> SqlServerConfig(Path("/tmp/c/sql-server"), SparkConfig(Path("/tmp/c/jars/spark"))).port
    0
    """

    directory: Path
    spark: SparkConfig
    port: int = 0
    idle_timeout_s: float = 1800.0
    startup_timeout_s: float = 180.0


@dataclass(frozen=True)
class SequencerConfig:
    """When the sequencer closes an epoch, and how it talks to Kafka.

    An epoch closes after ``epoch_ms`` milliseconds or ``max_records`` records, whichever comes
    first, and is logged only if it consumed something: an idle app logs nothing. Interior
    transactions emitted by the last epoch still get an epoch to run in: a worker sends a tick
    (``ClientRequest.tick``) to the requests topic. ``transaction_timeout_ms`` is the Kafka
    producer's: a crashed sequencer's open transaction is aborted by the broker after it.
    ``chunk_bytes`` bounds one command-log record. ``dead_letter_max_bytes`` bounds one encoded
    dead letter (value, key and reason are cut to fit, and the letter says so).
    ``request_id_window_ms`` is how long a client request id is remembered after its last request
    record: a retry within it is sequenced once. ``input_retention_ms`` is the retention the
    input and requests topics get (-1: forever; an existing topic that keeps less is raised to
    it). ``metrics_port`` serves Prometheus metrics (0: off). The workers snapshot at the end of
    an epoch every ``snapshot_interval_ms`` or every ``snapshot_every_epochs`` epochs, whichever
    comes first (0 turns either off; both 0: no snapshots). ``recovery`` ``weak`` logs nothing:
    the sequencer listens on ``feed`` (``host:port``) for the ``workers`` of ``generation`` and
    sends them each epoch (:mod:`epochal.log.epoch_feed`), waiting ``feed_timeout_ms`` for all
    to connect.
    """

    app: str
    epoch_ms: int = 20
    max_records: int = 5000
    transaction_timeout_ms: int = 10_000
    chunk_bytes: int = 512 * 1024
    metrics_port: int = 0
    dead_letter_max_bytes: int = 64 * 1024
    request_id_window_ms: int = 10 * 60 * 1000
    input_retention_ms: int = -1
    snapshot_interval_ms: int = 1000
    snapshot_every_epochs: int = 0
    recovery: str = "strong"
    feed: str = ""
    workers: int = 1
    generation: int = 1
    feed_timeout_ms: int = 60_000


@dataclass(frozen=True)
class SnapshotConfig:
    """Where snapshots go, and how many are kept.

    ``warehouse`` is a path or URI (``s3://bucket/warehouse``), kept in the form
    :func:`resolve_warehouse` gives it (a path made absolute); each app's tables live under
    ``<warehouse>/<app>/``. ``storage_options`` pass to delta-rs (object-store
    credentials; redacted in ``repr``). The newest ``keep`` snapshots are kept, and any younger
    than ``keep_ms`` (0: no age rule); older ones are expired in batches of ``keep // 2`` (at
    least one), so up to ``keep + keep // 2`` are there at a time. The command log and input
    topics are kept back to the oldest one kept and trimmed before it (``keep_inputs``: leave
    the input topics to their own retention, for other consumers). ``keep`` 0 keeps every
    snapshot and the whole logs. When snapshots are taken is the sequencer's
    (:class:`SequencerConfig`).

    >>> SnapshotConfig("/tmp/w").keep
    10
    """

    warehouse: str = "warehouse"
    storage_options: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    keep: int = 10
    keep_ms: int = 0
    keep_inputs: bool = False
    recovery: str = "strong"

    def __post_init__(self) -> None:
        object.__setattr__(self, "warehouse", resolve_warehouse(self.warehouse))
        if self.recovery not in ("strong", "weak"):
            raise ConfigError("the recovery mode is strong or weak", recovery=self.recovery)

    def __repr__(self) -> str:
        return (
            f"SnapshotConfig(warehouse={self.warehouse!r}, keep={self.keep}, "
            f"keep_ms={self.keep_ms}, recovery={self.recovery!r}, "
            f"storage_options={_redacted(self.storage_options)!r})"
        )

    def __reduce__(
        self,
    ) -> tuple[type[SnapshotConfig], tuple[str, dict[str, str], int, int, bool, str]]:
        return (SnapshotConfig, (self.warehouse, dict(self.storage_options), self.keep,
                                 self.keep_ms, self.keep_inputs, self.recovery))  # fmt: skip


@dataclass(frozen=True)
class WorkerConfig:
    """One worker process of a cluster of ``workers``, running its share of ``partitions``.

    ``peers[w]`` is worker w's ``host:port`` for the exchange between workers (from config, so
    the workers may live on several hosts). ``generation`` is the cluster generation this worker
    belongs to; frames of another generation are dropped. Egress commits every
    ``egress_interval_ms``, sooner under a backlog, and at once when the worker has read the
    command log to its end. When interior transactions wait and no
    epoch has come for ``interior_tick_ms``, worker 0 asks the sequencer for one. ``cpu`` pins
    the process when set. ``metrics_port`` 0 disables the Prometheus endpoint. ``run_id`` names
    the run this worker belongs to in the cluster's group (empty: the worker joins no group); a
    peer or the worker's own loop silent for ``failure_timeout_ms`` is a failure (see
    :class:`FailureConfig`). ``feed`` (weak recovery) is the sequencer's ``host:port`` that sends
    the epochs; empty: the worker reads the command log. ``query[w]`` is worker w's query server
    address (empty: no live queries); ``query_token`` the token clients must present (required
    beyond 127.0.0.1); ``query_tls`` a certificate and key file to serve queries over TLS.
    """

    app: str
    worker: int = 0
    workers: int = 1
    partitions: int = 4
    peers: tuple[str, ...] = ()
    generation: int = 1
    egress_interval_ms: int = 50
    interior_tick_ms: int = 100
    transaction_timeout_ms: int = 10_000
    track_digest: bool = False
    cpu: int | None = None
    metrics_port: int = 0
    allow_code_change: bool = False
    run_id: str = ""
    failure_timeout_ms: int = 6000
    snapshot_before: int = -1  # an epoch the last generation failed at: snapshot the one before
    feed: str = ""
    query: tuple[str, ...] = ()
    query_token: str = field(default="", repr=False)
    query_tls: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ConfigError("a cluster needs at least one worker", workers=self.workers)
        if self.partitions < self.workers:
            raise ConfigError(
                f"{self.workers} workers need at least {self.workers} partitions, not "
                f"{self.partitions}: a worker without a partition would sit idle",
                workers=self.workers,
                partitions=self.partitions,
            )


@dataclass(frozen=True)
class FailureConfig:
    """How ``epochal run`` detects failures (docs/concepts.md) and paces the rollbacks they cause.

    A process that stops heart-beating or polling for ``failure_timeout_ms`` leaves the cluster's
    Kafka group and is failed; the default, 6000, is the least a stock broker allows
    (``group.min.session.timeout.ms``). A process must join within ``startup_timeout_ms`` of its
    start. The supervisor describes the group every ``watch_interval_ms``. A failure less than
    ``backoff_reset_ms`` after the previous one waits before the rollback: ``backoff_initial_ms``,
    doubling up to ``backoff_max_ms``. A clean stop (SIGTERM) waits up to ``stop_timeout_ms``
    for the cluster to end on a savepoint, then kills what is left.

    One handler invocation running for longer than ``hang_timeout_ms`` is hung: its worker names
    it and exits, and the next generation keeps the state before its epoch, as for a crash.
    0 (the default) means half of ``failure_timeout_ms``, and more is refused: a handler blocks
    its worker's loop, and its peers, which hear from it four times per failure bound, fail it
    as soon as three quarters of the bound after it blocks; the watchdog sees an invocation
    start at most a tenth of its bound late, so half leaves it time to write its record first.
    A handler that needs longer needs a longer failure bound.

    >>> FailureConfig().hang_bound_ms
    3000
    """

    failure_timeout_ms: int = 6000
    startup_timeout_ms: int = 30_000
    watch_interval_ms: int = 500
    backoff_initial_ms: int = 500
    backoff_max_ms: int = 30_000
    backoff_reset_ms: int = 60_000
    stop_timeout_ms: int = 30_000
    hang_timeout_ms: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.hang_timeout_ms <= self.failure_timeout_ms // 2:
            raise ConfigError(
                "the hang timeout is at most half the failure timeout (0: half): a handler "
                "blocking its worker for longer is failed by its peers before it can be named",
                hang_timeout_ms=self.hang_timeout_ms,
                failure_timeout_ms=self.failure_timeout_ms,
            )

    @property
    def hang_bound_ms(self) -> int:
        """How long one handler invocation may run before its worker calls it hung."""
        return self.hang_timeout_ms or self.failure_timeout_ms // 2


@dataclass(frozen=True)
class RebalanceConfig:
    """When ``epochal run`` moves a running cluster to split points learned from its keys.

    Every ``check_interval_ms`` (0: never) the supervisor reads the latest snapshot's manifest;
    if its fullest partition holds more than ``skew`` times the mean count of actors, and split
    points learned from the snapshot's keys would make the fullest one hold at most 3/4 of what
    it holds now, the cluster rolls back to a new generation under them (egress finished under
    the old layout first: exactly once). After each check that had to read the keys (a rebalance,
    or none because no layout would be materially better) the next waits twice as long, up to
    32 times ``check_interval_ms``.

    >>> RebalanceConfig().skew
    2.0
    """

    check_interval_ms: int = 30_000
    skew: float = 2.0

    def __post_init__(self) -> None:
        if self.check_interval_ms < 0 or self.skew <= 1.0:
            raise ConfigError(
                "the rebalance check interval is >= 0 and the skew factor > 1",
                check_interval_ms=self.check_interval_ms,
                skew=self.skew,
            )


@dataclass(frozen=True)
class ClusterConfig:
    """How to run one app's cluster, each fact stated once: what ``epochal run``'s flags say
    (the same defaults), what :func:`epochal.run` takes, and what a :class:`epochal.Client`
    learns its endpoints, Kafka and warehouse from.

    ``name`` runs the app under another name (its topics and tables). ``workers`` None: one per
    usable core but one, at least 1; ``partitions`` None: two per worker. An epoch closes after
    ``epoch_ms`` or ``epoch_records``. ``snapshots`` None: no snapshots (a restart replays the
    whole command log); they are taken every ``snapshot_interval_ms`` and/or every
    ``snapshot_every_epochs`` epochs. ``recovery`` is ``"strong"`` or ``"weak"``
    (docs/recovery.md). Worker w exchanges epochs on ``peers[w]`` (default
    ``127.0.0.1:port_base+w``), a weak cluster's sequencer feeds them on ``feed`` (default
    ``127.0.0.1:port_base+workers``) and worker w answers queries on ``query[w]`` (default
    ``query_host:query_port+w``; ``query_port`` 0: no queries). ``metrics_port`` P (0: off):
    worker w on P+w, then the sequencer, then the supervisor. ``query_tls`` is a certificate
    and key file.

    >>> ClusterConfig(workers=2).query_endpoints(2)
    ('127.0.0.1:7700', '127.0.0.1:7701')
    """

    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    name: str | None = None
    workers: int | None = None
    partitions: int | None = None
    input_partitions: int = 1
    input_retention_ms: int = -1
    epoch_ms: int = 20
    epoch_records: int = 5000
    snapshots: SnapshotConfig | None = field(default_factory=SnapshotConfig)
    snapshot_interval_ms: int = 1000
    snapshot_every_epochs: int = 0
    recovery: str = "strong"
    peers: tuple[str, ...] = ()
    port_base: int = 7600
    feed: str = ""
    query_port: int = 7700
    query_host: str = "127.0.0.1"
    query: tuple[str, ...] = ()
    query_token: str = field(default="", repr=False)
    query_tls: tuple[str, str] | None = None
    metrics_port: int = 0
    run_dir: Path = Path(".epochal/run")
    failure: FailureConfig = field(default_factory=FailureConfig)
    rebalance: RebalanceConfig = field(default_factory=RebalanceConfig)
    allow_code_change: bool = False

    def __post_init__(self) -> None:
        if self.recovery not in ("strong", "weak"):
            raise ConfigError("the recovery mode is strong or weak", recovery=self.recovery)
        if self.recovery == "weak" and self.snapshots is None:
            raise ConfigError("weak recovery needs snapshots: they release its egress")
        if self.snapshots is not None and self.snapshots.recovery != self.recovery:
            if self.snapshots.recovery != "strong":  # not SnapshotConfig's default: said twice
                raise ConfigError(
                    "say the recovery mode once, as ClusterConfig(recovery=...)",
                    cluster=self.recovery,
                    snapshots=self.snapshots.recovery,
                )
            object.__setattr__(self, "snapshots", replace(self.snapshots, recovery=self.recovery))

    def query_endpoints(self, workers: int) -> tuple[str, ...]:
        """Each of ``workers`` workers' query address (none with ``query_port`` 0)."""
        if self.query:
            return self.query
        if not self.query_port:
            return ()
        return tuple(f"{self.query_host}:{self.query_port + w}" for w in range(workers))
