"""Metrics through prometheus_client: epochal's series with their labels, the process's own,
served over HTTP, and a port taken named as such."""

from __future__ import annotations

import subprocess
import sys
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from epochal.metrics import Metrics, serve_metrics
from tests.conftest import free_port_pair


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_counters_and_gauges_render_in_prometheus_text_format_with_labels() -> None:
    metrics = Metrics(app="bank", worker="0")
    metrics.describe("epochal_transactions_total", "counter", "transactions by outcome")
    metrics.describe("epochal_input_lag", "gauge", "input records not yet sequenced")
    metrics.inc("epochal_transactions_total", outcome="committed")
    metrics.inc("epochal_transactions_total", 2, outcome="committed")
    metrics.inc("epochal_transactions_total", outcome="aborted")
    metrics.set("epochal_input_lag", 7)
    metrics.inc("epochal_epoch_seconds_sum", 0.25)  # undeclared: untyped, its name kept
    text = metrics.render()
    assert "# TYPE epochal_transactions_total counter" in text
    assert "# TYPE epochal_input_lag gauge" in text
    samples = _samples(text)
    base = (("app", "bank"), ("worker", "0"))
    assert samples["epochal_transactions_total", (("app", "bank"), ("outcome", "committed"),
                                                  ("worker", "0"))] == 3  # fmt: skip
    assert samples["epochal_transactions_total", (("app", "bank"), ("outcome", "aborted"),
                                                  ("worker", "0"))] == 1  # fmt: skip
    assert samples["epochal_input_lag", base] == 7
    assert samples["epochal_epoch_seconds_sum", base] == 0.25
    assert samples["process_resident_memory_bytes", ()] > 0  # the library's process metrics


def test_another_process_is_served_under_its_namespace() -> None:
    script = "import time; print('up', flush=True); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "up\n"  # past its exec:
        # read at once after the fork, a child's RSS could still read 0 (it failed CI once)
        metrics = Metrics(app="bank", worker="0")
        metrics.watch_process(child.pid, "epochal_snapshots")
        samples = _samples(metrics.render())
        ours = samples["process_resident_memory_bytes", ()]
        theirs = samples["epochal_snapshots_process_resident_memory_bytes", ()]
        assert theirs > 0 and theirs != ours  # read from the child's /proc, not from ours
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


def test_a_series_missing_a_label_others_have_gets_it_empty() -> None:
    metrics = Metrics(app="bank")
    metrics.set("epochal_partition_actors", 3, partition="1")
    metrics.set("epochal_partition_actors", 5)
    samples = _samples(metrics.render())
    assert samples["epochal_partition_actors", (("app", "bank"), ("partition", "1"))] == 3
    # Prometheus stores a label with an empty value as no label at all
    assert samples["epochal_partition_actors", (("app", "bank"), ("partition", ""))] == 5


def test_metrics_are_served_over_http() -> None:
    metrics = Metrics(app="bank")
    metrics.inc("epochal_epochs_total")
    port = free_port_pair()
    server = serve_metrics(metrics, port, "a test")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            served = _samples(reply.read().decode())
        assert served["epochal_epochs_total", (("app", "bank"),)] == 1
    finally:
        server.shutdown()
        server.server_close()
