"""A workload at a steady rate through the cluster: its latency, and the highest rate it sustains.

The workload's load records and one probe transaction are produced first; once the probe's
egress is out (start-up is not counted), transactions are fed open loop (:mod:`bench.open_loop`)
at the rate asked, and each one's latency runs from its input record's Kafka timestamp to its
egress record's; the first ``warmup`` seconds are left out.

The sustainable-throughput search (TSpoon's method) does it in phases on one cluster: a first
phase at a low rate gives the unloaded latency, then the rate grows by half each phase until the
p99 of a phase passes 20 times the unloaded p99, or the egress falls behind the feed by more
than a second's worth (the backlog grows). The last rate that passed is the sustainable one.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from bench.drain import produce_backlog
from bench.open_loop import EgressWatcher, feed_at_rate, percentiles
from bench.processes import ClusterProcess, Setup
from bench.workloads.base import Backlog, Workload
from epochal.config import KafkaConfig
from epochal.log.client import KafkaClients

__all__ = ["Search", "search_sustainable", "steady_run"]

SLOWER_BOUND = 20  # a phase fails once its p99 passes this many times the unloaded p99
GROWTH = 1.5
UNLOADED_RATE = 200


class _Steady:
    """One cluster fed open loop: its topic, its egress watcher, its measured records."""

    def __init__(
        self, workload: Workload, bootstrap: str, setup: Setup, port_base: int, seed: int
    ) -> None:
        self.workload = workload
        self.bootstrap = bootstrap
        self.name = f"{workload.name.replace('-', '')}steady{uuid.uuid4().hex[:6]}"
        self.seed = seed
        self.partitions = 2 * setup.workers
        self.clients = KafkaClients(KafkaConfig(bootstrap))
        loads = workload.backlog(1, self.partitions, seed)
        produce_backlog(bootstrap, self.name, loads)  # the loads and a probe
        self.topic = f"{self.name}.in.{workload.topic}"
        self.clients.create_topics([f"{self.name}.out.{o}" for o in workload.outputs])
        read = workload.load_app().egress_codec.read_record
        self.watcher = EgressWatcher(self.clients, self.name, workload.outputs, read)
        self.cluster = ClusterProcess(setup, self.name, bootstrap, port_base, app=workload.app)
        self.stamps: dict[int, int] = {}
        self._phase = 0

    def __enter__(self) -> _Steady:
        self.cluster.__enter__()
        self.watcher.start()
        deadline = time.monotonic() + 180
        while not self.watcher.out and time.monotonic() < deadline:
            if self.cluster.exited():
                raise SystemExit(f"{self.name} ended: its log is {self.cluster.run_dir}/run.log")
            time.sleep(0.05)
        if not self.watcher.out:
            raise SystemExit(f"{self.name}: the probe transaction never came out")
        return self

    def __exit__(self, *exc: object) -> None:
        self.watcher.stopping.set()
        self.watcher.join(10)
        self.cluster.__exit__(*exc)

    def transactions(self, count: int) -> Iterator[bytes]:
        """``count`` fresh measured transactions (each phase its own seed)."""
        self._phase += 1
        backlog: Backlog = self.workload.backlog(count, self.partitions, self.seed + self._phase)
        return iter([r.value for r in backlog.records[-count:]])

    def feed(self, rate: int, seconds: float) -> tuple[float, int]:
        """Feed ``rate``/s for ``seconds``; when the feed started (ms) and how many were sent."""
        source = self.transactions(int(rate * seconds) + 1)
        started_ms = time.time() * 1000
        sent = feed_at_rate(self.bootstrap, self.topic, source, rate, seconds, stamps=self.stamps)
        return started_ms, sent

    def settle(self, timeout_s: float) -> int:
        """Wait until every record fed is out (or ``timeout_s``); how many are still missing."""
        deadline = time.monotonic() + timeout_s
        while len(self.watcher.out) < len(self.stamps) + 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        return len(self.stamps) + 1 - len(self.watcher.out)

    def latencies(self, from_ms: float, to_ms: float = float("inf")) -> list[float]:
        """Input-to-egress ms of the records fed from ``from_ms`` to ``to_ms`` that are out."""
        out = self.watcher.out
        return [
            out[o][0] - ts for o, ts in self.stamps.items() if from_ms <= ts < to_ms and o in out
        ]


def steady_run(
    workload: Workload,
    bootstrap: str,
    setup: Setup,
    *,
    rate: int,
    seconds: float,
    warmup: float,
    port_base: int,
    seed: int,
) -> dict[str, Any]:
    """Feed ``rate``/s for ``seconds``; latency per transaction after ``warmup``."""
    with _Steady(workload, bootstrap, setup, port_base, seed) as run:
        started_ms, sent = run.feed(rate, seconds)
        missing = run.settle(60)
        counted = run.latencies(started_ms + 1000 * warmup)
        facts = run.cluster.facts()
    return {
        **facts,
        "rate": rate,
        "seconds": seconds,
        "warmup": warmup,
        "sent": sent,
        "missing": missing,
        "counted": len(counted),
        "latency_ms": percentiles(counted),
    }


def search_sustainable(
    workload: Workload,
    bootstrap: str,
    setup: Setup,
    *,
    phase_s: float,
    port_base: int,
    seed: int,
    max_phases: int = 16,
) -> dict[str, Any]:
    """The highest rate at which p99 stays within 20x the unloaded p99 and the egress keeps
    up; every phase's rate, p50/p99 and lag beside it."""
    search = Search()
    with _Steady(workload, bootstrap, setup, port_base, seed) as run:
        for _ in range(max_phases):
            started_ms, sent = run.feed(search.rate, phase_s)
            ended_ms = time.time() * 1000
            behind = len(run.stamps) + 1 - len(run.watcher.out)
            missing = run.settle(30)
            latency = percentiles(run.latencies(started_ms + 1000, ended_ms))
            if not search.record(sent, behind, missing, latency):
                break
        facts = run.cluster.facts()
    return {
        **facts,
        "sustainable_tps": search.sustainable,
        "unloaded_p99_ms": search.unloaded,
        "phase_seconds": phase_s,
        "phases": search.phases,
    }


@dataclass
class Search:
    """TSpoon's search, phase by phase: the rate to feed next, and what the phases so far say."""

    rate: int = UNLOADED_RATE
    unloaded: float = 0.0  # the first phase's p99, in ms
    sustainable: int = 0  # the last rate that passed
    phases: list[dict[str, Any]] = field(default_factory=list)

    def record(self, sent: int, behind: int, missing: int, latency: dict[str, float]) -> bool:
        """A phase fed at :attr:`rate` ended ``behind`` records behind the feed with ``missing``
        never out: whether it passed (then the next phase feeds half as much again)."""
        self.unloaded = self.unloaded or latency["p99"]
        kept_up = behind <= self.rate and not missing
        passed = kept_up and latency["p99"] <= SLOWER_BOUND * self.unloaded
        self.phases.append(
            {
                "rate": self.rate,
                "sent": sent,
                "behind_at_end": behind,
                "latency_ms": latency,
                "passed": passed,
            }
        )
        if passed:
            self.sustainable, self.rate = self.rate, int(self.rate * GROWTH)
        return passed
