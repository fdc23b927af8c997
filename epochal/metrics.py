"""Metrics in the Prometheus format, through ``prometheus_client``: one registry per process
(the supervisor, the sequencer, each worker), each served on its own port.

The hot path does ``metrics.inc(...)``: one dict update, no lock. :class:`Metrics` is a
``prometheus_client`` collector over those dicts, so exposition (the text format, the HTTP
server) and each process's standard ``process_*`` metrics (CPU seconds, resident memory, open
files) are the library's. Counters are named ``..._total``; a time summed so far is a counter
named ``..._seconds_sum``, exposed untyped so that its name stays as it is.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client import start_http_server as _start_http_server
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    UnknownMetricFamily,
)
from prometheus_client.registry import Collector

from epochal.config import Listener
from epochal.errors import BindError

__all__ = ["Metrics", "serve_metrics"]

_Series = dict[tuple[tuple[str, str], ...], float]


class Metrics:
    """A process's metrics: ``metrics.inc("epochal_transactions_total", outcome="committed")``;
    ``registry`` is what ``prometheus_client`` exposes (these and the process's own)."""

    def __init__(self, **labels: str) -> None:
        self.labels = labels
        self._values: dict[str, _Series] = defaultdict(dict)
        self._help: dict[str, tuple[str, str]] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collected(self))
        ProcessCollector(registry=self.registry)

    def watch_process(self, pid: int, namespace: str) -> None:
        """Serve another process's CPU seconds, resident memory and open files as well, as
        ``<namespace>_process_*`` (a worker's snapshot process: it serves no port of its own)."""
        ProcessCollector(namespace=namespace, pid=lambda: pid, registry=self.registry)

    def describe(self, name: str, kind: str, text: str) -> None:
        """Say what ``name`` is (``counter`` or ``gauge``) for its ``# HELP`` and ``# TYPE``."""
        self._help[name] = (kind, text)

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        series = self._values[name]
        series[key] = series.get(key, 0.0) + amount

    def set(self, name: str, value: float, **labels: str) -> None:
        self._values[name][tuple(sorted(labels.items()))] = value

    def get(self, name: str, **labels: str) -> float:
        return self._values.get(name, {}).get(tuple(sorted(labels.items())), 0.0)

    def collect(self) -> Iterator[Metric]:
        """Each metric as a family of ``prometheus_client`` (called on the server's thread:
        each metric's series are copied in one C call, under the GIL, while the loop writes
        on). A described metric is there before its first value, so dashboards find it."""
        for name in sorted({*self._values, *self._help}):  # described: shown before a value
            kind, text = self._help.get(name, ("untyped", ""))
            series = sorted(self._values.get(name, {}).items())
            names = sorted({*self.labels, *(label for key, _ in series for label, _ in key)})
            family = _family(name, kind, text, names)
            for key, value in series:
                labels = {**self.labels, **dict(key)}
                family.add_metric([labels.get(label, "") for label in names], value)
            yield family

    def render(self) -> str:
        """The text ``GET /metrics`` answers."""
        return generate_latest(self.registry).decode()


class _Collected(Collector):
    """:class:`Metrics` as ``prometheus_client`` collects it (its own ``describe`` is not the
    collector protocol's)."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return self.metrics.collect()


def _family(
    name: str, kind: str, text: str, labels: list[str]
) -> CounterMetricFamily | GaugeMetricFamily | UnknownMetricFamily:
    if kind == "counter" and name.endswith("_total"):
        return CounterMetricFamily(name, text, labels=labels)
    if kind == "gauge":
        return GaugeMetricFamily(name, text, labels=labels)
    return UnknownMetricFamily(name, text, labels=labels)


def serve_metrics(metrics: Metrics, port: int, owner: str, host: str = "127.0.0.1") -> WSGIServer:
    """Serve ``GET /metrics`` on ``host:port`` (``prometheus_client``'s server, on a daemon
    thread) until the process ends; ``owner`` (``worker 1``) names the process in a
    BindError."""
    try:
        server, _ = _start_http_server(port, addr=host, registry=metrics.registry)
    except OSError as exc:
        raise BindError.of(exc, f"{host}:{port}", Listener.METRICS, owner) from exc
    return server
