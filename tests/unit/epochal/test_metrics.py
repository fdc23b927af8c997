from __future__ import annotations

import urllib.request

from epochal.metrics import Metrics, serve_metrics
from tests.conftest import free_port_pair


def test_counters_render_in_prometheus_text_format_with_labels() -> None:
    metrics = Metrics(app="bank", worker="0")
    metrics.describe("epochal_transactions_total", "counter", "transactions by outcome")
    metrics.inc("epochal_transactions_total", outcome="committed")
    metrics.inc("epochal_transactions_total", 2, outcome="committed")
    metrics.inc("epochal_transactions_total", outcome="aborted")
    metrics.set("epochal_input_lag", 7)
    text = metrics.render()
    assert "# TYPE epochal_transactions_total counter" in text
    assert 'epochal_transactions_total{app="bank",outcome="committed",worker="0"} 3' in text
    assert 'epochal_transactions_total{app="bank",outcome="aborted",worker="0"} 1' in text
    assert 'epochal_input_lag{app="bank",worker="0"} 7' in text


def test_metrics_are_served_over_http() -> None:
    metrics = Metrics(app="bank")
    metrics.inc("epochal_epochs_total")
    port = free_port_pair()
    server = serve_metrics(metrics, port, "a test")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            assert 'epochal_epochs_total{app="bank"} 1' in reply.read().decode()
    finally:
        server.shutdown()
        server.server_close()
