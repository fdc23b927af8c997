"""A workload's backlog drained end to end through Kafka: by the cluster, and by its baselines.

The backlog (``Workload.backlog``) is produced first, so that the producer does not compete for
the cores; then ``epochal run`` starts on it and the egress of its ``outputs`` is counted
(``read_committed``) until every measured transaction's record is out. Throughput = measured
transactions / (time of the last egress record - time of the first); CPU per transaction by
role is read from ``/proc`` over the same window (:mod:`bench.processes`). The baselines drain
the same backlog the same way: the workload's rules in plain Python and the stateless pipe,
each one process over exactly-once Kafka batches (:mod:`bench.baselines`).

``check``: after the drain the cluster stops at a savepoint, and the run is held against the
serial oracle over its own command log (from the ``commands`` archive): the savepoint's state
digest must be the oracle's, and every measured transaction must have come out once, with the
oracle's outcome.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from rich.progress import Progress

from bench.processes import (
    ClusterProcess,
    MeasuredProcess,
    RssSampler,
    Setup,
    count_egress,
    end_offset,
)
from bench.workloads.base import Backlog, Record, Workload
from epochal.actors.api import named
from epochal.actors.oracle import SerialOracle
from epochal.config import KafkaConfig, SnapshotConfig
from epochal.log.client import KafkaClients
from epochal.recovery.snapshots import DeltaSnapshots
from epochal.schemas.egress import EgressRecord

__all__ = ["CheckFailed", "drain_baseline", "drain_cluster", "produce_backlog", "produce_records"]

ROOT = Path(__file__).resolve().parent.parent


class CheckFailed(AssertionError):
    """A run that does not equal the serial oracle: the benchmark measured a wrong system."""


def produce_backlog(bootstrap: str, name: str, backlog: Backlog) -> list[str]:
    """Every record of ``backlog`` onto ``<name>.in.<topic>`` (one partition each, in order);
    the topics written."""
    clients = KafkaClients(KafkaConfig(bootstrap))
    topics = [f"{name}.in.{t}" for t in backlog.topics]
    clients.create_topics(topics)
    produce_records(bootstrap, f"{name}.in.", backlog.records)
    return topics


def produce_records(bootstrap: str, prefix: str, records: Iterable[Record]) -> None:
    """Each record onto topic ``prefix + record.topic``, in order, waiting whenever the local
    queue is full; SystemExit unless every one was delivered."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000})
    for record in records:
        while True:
            try:
                producer.produce(prefix + record.topic, record.value, record.key)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(60):
        raise SystemExit(f"{prefix}*: the records were not all delivered")


def drain_cluster(
    workload: Workload,
    backlog: Backlog,
    bootstrap: str,
    setup: Setup,
    *,
    port_base: int,
    broker_pid: int | None,
    check: bool,
) -> dict[str, Any]:
    """One run of the cluster over ``backlog``: its rate, CPU per transaction by role, memory,
    and (``check``) whether it equals the serial oracle."""
    name = f"{workload.name.replace('-', '')}{setup.workers}w{uuid.uuid4().hex[:6]}"
    produce_backlog(bootstrap, name, backlog)
    clients = KafkaClients(KafkaConfig(bootstrap))
    clients.create_topics([f"{name}.out.{o}" for o in workload.outputs])
    with (
        ClusterProcess(setup, name, bootstrap, port_base, broker_pid, app=workload.app) as cluster,
        Progress(transient=True) as progress,
    ):
        cluster.sampler.log_end = lambda: end_offset(clients, f"{name}.cmd")
        first, last = count_egress(
            clients, name, backlog.measured, progress, outputs=workload.outputs, process=cluster
        )
        time.sleep(2 * cluster.sampler.cpu_interval_s)  # a CPU sample after the last egress
        cpu = cluster.sampler.cpu_between(first, last)
    result: dict[str, Any] = {
        "cpu_us_per_tx": {role: 1e6 * s / backlog.measured for role, s in sorted(cpu.items())},
        **cluster.facts(),
        "transactions": backlog.measured,
        "seconds": _window(first, last, cluster),
        "tps": backlog.measured / _window(first, last, cluster),
        "timed": _window(first, last, cluster) >= MIN_TIMED_S,
        "seconds_from_start": last - cluster.started,
    }
    if check:
        assert cluster.process is not None
        if cluster.process.returncode != 0:  # a stop at a savepoint exits 0
            raise CheckFailed(
                f"{name} exited with {cluster.process.returncode}: its log is "
                f"{cluster.run_dir / 'run.log'}"
            )
        result["checked"] = check_against_the_oracle(
            workload, name, clients, cluster.run_dir / "warehouse", setup.workers * 2
        )
    return result


MIN_TIMED_S = 1.0
"""A drain shorter than this is no rate: a small backlog comes out in a few epochs, and first to
last output then times the epochs' commits, not the throughput (2,000 transactions "at" 85,000/s).
Its result says ``timed`` False, and the reports print no rate for it."""


def _window(first: float, last: float, process: MeasuredProcess) -> float:
    """The drain's seconds, first output to last; from the process's start when all of it came
    out at once (a small backlog: a figure for nothing but not a division by zero)."""
    return last - first or last - process.started


def check_against_the_oracle(
    workload: Workload, name: str, clients: KafkaClients, warehouse: Path, partitions: int
) -> str:
    """The stopped cluster's savepoint and egress against the serial oracle over its command
    log; what was checked, or :class:`CheckFailed` naming the first difference."""
    app = named(workload.load_app(), name)
    snapshots = DeltaSnapshots(app, SnapshotConfig(str(warehouse)), partitions)
    latest = snapshots.latest()
    if latest is None:
        raise CheckFailed(f"{name}: no savepoint in {warehouse}")
    results = SerialOracle(app).run(snapshots.archived_epochs(latest))
    if results[-1].digest != latest.digest:
        raise CheckFailed(
            f"{name}: the savepoint at epoch {latest.epoch} has digest {latest.digest}, the "
            f"serial oracle {results[-1].digest}"
        )
    oracle = {(o.epoch, o.seq): (o.committed, o.reason) for r in results for o in r.outcomes}
    egress = read_egress(clients, app.egress_codec.read_record, name, workload.outputs)
    stamps = [(r.epoch, r.seq) for r in egress]
    if len(set(stamps)) != len(stamps):
        raise CheckFailed(f"{name}: a transaction's egress came out twice")
    for record in egress:
        if oracle.get((record.epoch, record.seq)) != (record.committed, record.reason):
            raise CheckFailed(
                f"{name}: ({record.epoch}, {record.seq}) came out committed={record.committed} "
                f"{record.reason!r}; the oracle: {oracle.get((record.epoch, record.seq))}"
            )
    return (
        f"savepoint at epoch {latest.epoch} = the serial oracle's digest; "
        f"{len(egress)} egress records, each once, with the oracle's outcome"
    )


def read_egress(
    clients: KafkaClients, read: Any, name: str, outputs: Sequence[str]
) -> list[EgressRecord]:
    """Every committed egress record of ``outputs`` so far."""
    records: list[EgressRecord] = []
    for output in outputs:
        topic = f"{name}.out.{output}"
        ranges = {0: (0, clients.end_offset(topic))}
        found = clients.read_range(topic, ranges, f"reading {topic}")
        records += [read(m.value() or b"") for m in found]
    return records


class _Baseline(MeasuredProcess):
    """``python -m bench.baselines workload|pipe`` over one run's topics (role ``baseline``)."""

    def __init__(
        self, kind: str, workload: Workload, name: str, bootstrap: str, broker_pid: int | None
    ) -> None:
        super().__init__(ROOT)
        topic = f"{name}.in.{workload.topic}"
        output = f"{name}.out." if kind == "workload" else f"{name}.out.{workload.outputs[0]}"
        self.command = [
            sys.executable,
            "-m",
            "bench.baselines",
            kind,
            "--workload",
            workload.name,
            "--bootstrap",
            bootstrap,
            "--input",
            topic,
            "--output",
            output,
            "--transactional-id",
            f"{name}.plain-{kind}",
        ]
        self.sampler = RssSampler(None, broker_pid=broker_pid)

    def _started(self, pid: int) -> None:
        self.sampler.pids = {"baseline": pid}


def drain_baseline(
    kind: str, workload: Workload, backlog: Backlog, bootstrap: str, broker_pid: int | None
) -> dict[str, Any]:
    """The same backlog through a baseline: ``workload`` (its plain rules: one record per
    measured transaction) or ``pipe`` (every record copied: its unit is the record)."""
    name = f"{kind}{uuid.uuid4().hex[:6]}"
    produce_backlog(bootstrap, name, backlog)
    clients = KafkaClients(KafkaConfig(bootstrap))
    outputs = workload.outputs if kind == "workload" else workload.outputs[:1]
    clients.create_topics([f"{name}.out.{o}" for o in outputs])
    expected = backlog.measured if kind == "workload" else len(backlog.records)
    with (
        _Baseline(kind, workload, name, bootstrap, broker_pid) as baseline,
        Progress(transient=True) as progress,
    ):
        first, last = count_egress(
            clients, name, expected, progress, outputs=outputs, process=baseline
        )
        time.sleep(2 * baseline.sampler.cpu_interval_s)
        cpu = baseline.sampler.cpu_between(first, last)
    return {
        "baseline": "plain Python" if kind == "workload" else "exactly-once pipe",
        "unit": "transactions" if kind == "workload" else "records",
        "cpu_us_per_tx": {role: 1e6 * s / expected for role, s in sorted(cpu.items())},
        "peak_rss_mb": baseline.sampler.peak,
        "transactions": expected,
        "seconds": _window(first, last, baseline),
        "tps": expected / _window(first, last, baseline),
        "timed": _window(first, last, baseline) >= MIN_TIMED_S,
    }
