"""What each process of a cluster runs with, planned from one :class:`ClusterConfig`, and the
checks made before any of them starts: ``epochal run`` and :func:`epochal.run` both start a
cluster through here, so a flag and a config field mean the same thing."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from epochal.actors import layout
from epochal.actors.api import load_app
from epochal.config import (
    ClusterConfig,
    FailureConfig,
    KafkaConfig,
    Listener,
    RebalanceConfig,
    SequencerConfig,
    SnapshotConfig,
    WorkerConfig,
)
from epochal.errors import ConfigError

__all__ = ["BROKER_WAIT_S", "ClusterPlan", "check_before_start", "plan_cluster"]

BROKER_WAIT_S = 10.0
"""How long a start waits for a first answer from the broker before it says it is away."""


@dataclass(frozen=True)
class ClusterPlan:
    """Everything the supervisor needs: the app's ``module:attribute``, the configs its
    sequencer and workers are started with, and the cluster-wide rest; ``app_name`` renames the
    app (its topics and ids); ``snapshots`` None: no snapshots, a restart replays the whole
    command log."""

    app_spec: str
    kafka: KafkaConfig
    sequencer: SequencerConfig
    worker: WorkerConfig
    app_name: str | None = None
    input_partitions: int = 1
    run_dir: Path = Path(".epochal/run")
    pin_cpus: bool = True
    failure: FailureConfig = field(default_factory=FailureConfig)
    snapshots: SnapshotConfig | None = None
    rebalance: RebalanceConfig = field(default_factory=RebalanceConfig)
    metrics_port: int = 0  # the supervisor's own metrics (0: none)


def plan_cluster(app_spec: str, config: ClusterConfig) -> ClusterPlan:
    """The processes' configs for ``app_spec`` run as ``config`` says; a layout that cannot
    work (fewer partitions than workers, an address list of another length) is refused here,
    before anything starts."""
    from epochal.actors.query_server import check_binding

    workers = layout.default_workers() if config.workers is None else config.workers
    partitions = 2 * workers if config.partitions is None else config.partitions
    if partitions < workers:
        given = "" if config.workers is not None else " (the default: usable cores - 1)"
        raise ConfigError(
            f"partitions {partitions} is fewer than the {workers} workers{given}: a worker "
            f"would own no partition and sit idle; give {workers} partitions or more, or fewer "
            "workers"
        )
    peers = config.peers or tuple(f"127.0.0.1:{config.port_base + w}" for w in range(workers))
    query = config.query_endpoints(workers)
    for role, addresses in (("peers", peers), ("query", query)):
        if addresses and len(addresses) != workers:
            raise ConfigError(f"{role} names {len(addresses)} workers, workers says {workers}")
    for address in query:
        check_binding(address, config.query_token)
    weak = config.recovery == "weak"
    feed = (config.feed or f"127.0.0.1:{config.port_base + workers}") if weak else ""
    app_name = config.name or load_app(app_spec).name
    snapshots = config.snapshots is not None
    metrics = config.metrics_port
    return ClusterPlan(
        app_spec=app_spec,
        app_name=config.name,
        kafka=config.kafka,
        sequencer=SequencerConfig(
            app_name,
            epoch_ms=config.epoch_ms,
            max_records=config.epoch_records,
            metrics_port=metrics + workers if metrics else 0,
            input_retention_ms=config.input_retention_ms,
            snapshot_interval_ms=config.snapshot_interval_ms if snapshots else 0,
            snapshot_every_epochs=config.snapshot_every_epochs if snapshots else 0,
            recovery=config.recovery,
            feed=feed,
            workers=workers,
            feed_timeout_ms=config.failure.startup_timeout_ms,
        ),
        worker=WorkerConfig(
            app_name,
            workers=workers,
            partitions=partitions,
            peers=peers,
            metrics_port=metrics,
            allow_code_change=config.allow_code_change,
            feed=feed,
            query=query,
            query_token=config.query_token,
            query_tls=config.query_tls or (),
        ),
        input_partitions=config.input_partitions,
        run_dir=config.run_dir,
        metrics_port=metrics + workers + 1 if metrics else 0,
        failure=config.failure,
        rebalance=config.rebalance,
        snapshots=config.snapshots,
    )


def check_before_start(plan: ClusterPlan, broker_wait_s: float = BROKER_WAIT_S) -> None:
    """Ports, warehouse, broker: whatever is wrong is one error now, before anything runs."""
    from epochal.preflight import Binding, check_broker, check_ports, check_warehouse

    worker = plan.worker
    bindings = [Binding(a, Listener.PEERS, f"worker {w}") for w, a in enumerate(worker.peers)]
    bindings += [Binding(a, Listener.QUERIES, f"worker {w}") for w, a in enumerate(worker.query)]
    if worker.feed:
        bindings.append(Binding(worker.feed, Listener.FEED, "the sequencer"))
    metrics = {f"worker {w}": worker.metrics_port + w for w in range(worker.workers)}
    metrics |= {"the sequencer": plan.sequencer.metrics_port}
    metrics |= {"the supervisor": plan.metrics_port}
    bindings += [
        Binding(f"127.0.0.1:{port}", Listener.METRICS, owner)
        for owner, port in metrics.items()
        if worker.metrics_port and port
    ]
    check_ports(bindings)
    if plan.snapshots is not None:
        check_warehouse(plan.snapshots, worker.app)
    check_broker(plan.kafka, broker_wait_s)
