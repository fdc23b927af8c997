"""Metrics in the Prometheus text format, served over HTTP from a daemon thread.

Counters and gauges only, labelled; a summary is a ``_sum`` and ``_count`` pair. Small on
purpose: the hot path does ``counter.inc()``, a dict update, nothing more.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from epochal.config import Listener
from epochal.errors import BindError

__all__ = ["Metrics", "serve_metrics"]


class Metrics:
    """A registry: ``metrics.inc("epochal_transactions_total", outcome="committed")``."""

    def __init__(self, **labels: str) -> None:
        self.labels = labels
        self._values: dict[str, dict[tuple[tuple[str, str], ...], float]] = defaultdict(dict)
        self._help: dict[str, tuple[str, str]] = {}

    def describe(self, name: str, kind: str, text: str) -> None:
        self._help[name] = (kind, text)

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        series = self._values[name]
        series[key] = series.get(key, 0.0) + amount

    def set(self, name: str, value: float, **labels: str) -> None:
        self._values[name][tuple(sorted(labels.items()))] = value

    def get(self, name: str, **labels: str) -> float:
        return self._values.get(name, {}).get(tuple(sorted(labels.items())), 0.0)

    def render(self) -> str:
        lines = []
        for name in sorted(self._values):
            kind, text = self._help.get(name, ("untyped", ""))
            lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
            for key, value in sorted(self._values[name].items()):
                labels = {**self.labels, **dict(key)}
                rendered = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                lines.append(f"{name}{{{rendered}}} {value:g}")
        return "\n".join(lines) + "\n"


def serve_metrics(
    metrics: Metrics, port: int, owner: str, host: str = "127.0.0.1"
) -> ThreadingHTTPServer:
    """Serve ``GET /metrics`` on ``host:port`` until the process ends; ``owner`` (``worker 1``)
    names the process in a BindError."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = metrics.render().encode()
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # no access log on stderr

    try:
        server = ThreadingHTTPServer((host, port), Handler)
    except OSError as exc:
        raise BindError.of(exc, f"{host}:{port}", Listener.METRICS, owner) from exc
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
