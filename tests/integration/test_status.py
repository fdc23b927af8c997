"""``epochal status`` against a real cluster on the real broker, run as a user runs it: from
another process that knows only the app's name, the broker and the warehouse. Before the first
start it says the app is not running; while it runs it shows every process with the pids the
supervisor started; after ``kill -9`` of a worker it shows the next generation, the rollback and
the new worker; once the supervisor is killed it says the app is not running since when."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from epochal.config import KafkaConfig
from epochal.log.client import KafkaClients
from epochal.status import STALE_S
from tests.integration.cluster import EPOCHAL, Cluster, gone

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(kafka_config: KafkaConfig, tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(f"st{uuid.uuid4().hex[:8]}", tmp_path, KafkaClients(kafka_config))
    try:
        yield running
    finally:
        running.close()


def status(cluster: Cluster, *flags: str) -> subprocess.CompletedProcess[str]:
    """``epochal status NAME`` from another working directory, as an operator would."""
    command = [
        EPOCHAL,
        "status",
        cluster.name,
        "--bootstrap",
        cluster.kafka.config.bootstrap_servers,
        "--warehouse",
        str(cluster.warehouse),
        *flags,
    ]
    env = {**os.environ, "COLUMNS": "250"}
    done = subprocess.run(
        command,
        cwd=cluster.run_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done


def report(cluster: Cluster) -> dict[str, Any]:
    done = status(cluster, "--json")
    assert done.returncode in (0, 3), done.stderr
    return dict(json.loads(done.stdout))


def until(
    cluster: Cluster, ready: Callable[[dict[str, Any]], bool], timeout_s: float, what: str
) -> dict[str, Any]:
    """``epochal status --json`` every half second until ``ready`` holds of its report."""
    deadline = time.monotonic() + timeout_s
    while not ready(shown := report(cluster)):
        assert time.monotonic() < deadline, f"{what}: {shown}"
        time.sleep(0.5)
    return shown


def test_status_follows_a_cluster_through_a_worker_kill_and_its_end(cluster: Cluster) -> None:
    never = status(cluster)
    assert never.returncode == 3
    assert f"{cluster.name} is not running: no status record" in never.stdout, never.stdout

    cluster.start(workers=2, partitions=4)
    cluster.produce(200, deposits=True)
    pids = cluster.status()

    def running(shown: dict[str, Any]) -> bool:
        return bool(
            shown["state"] == "running"
            and len(shown["workers"]) == 2
            and not shown["silent"]
            and shown["epoch"] >= 0
            and shown["snapshot"] is not None
        )

    first = until(cluster, running, 60, "status never showed the running cluster")
    assert first["generation"] == 1 and first["rollbacks"] == 0
    assert first["supervisor"]["pid"] == pids["supervisor"]
    assert first["sequencer"]["pid"] == pids["sequencer"]
    assert [w["pid"] for w in first["workers"]] == pids["workers"]
    assert [p["partition"] for w in first["workers"] for p in w["partitions"]] == [0, 1, 2, 3]
    assert all(w["query"] and w["host"] for w in first["workers"])
    assert f"{cluster.name}.in.ops:0" in first["input_lag"]  # and requests, once one is read
    assert first["snapshot"]["bytes"] > 0

    table = status(cluster)
    assert table.returncode == 0, table.stderr
    text = table.stdout
    assert f"{cluster.name} running: generation 1, 0 rollbacks" in text, text
    for shown in ("supervisor", "sequencer", "worker 0", "worker 1", "last snapshot   ssid"):
        assert shown in text, text
    assert str(pids["workers"][1]) in text

    os.kill(pids["workers"][1], signal.SIGKILL)

    def rolled_back(shown: dict[str, Any]) -> bool:
        workers = shown["workers"]
        return bool(
            shown["generation"] == 2
            and len(workers) == 2
            and not shown["silent"]
            and all(w["generation"] == 2 for w in workers)
        )

    second = until(cluster, rolled_back, 60, "status never showed the next generation")
    assert second["rollbacks"] == 1
    assert second["workers"][1]["pid"] != pids["workers"][1]
    assert [w["pid"] for w in second["workers"]] == cluster.status()["workers"]
    cluster.produce(50)
    until(cluster, lambda shown: shown["workers"][0]["epochs"] > 0, 30, "no epoch counted")

    supervisor = cluster.processes[-1]
    supervisor.kill()
    supervisor.wait()
    deadline = time.monotonic() + 30
    while not all(gone(pid) for pid in cluster.status()["workers"]):
        assert time.monotonic() < deadline, "the workers outlived their supervisor"
        time.sleep(0.1)
    time.sleep(STALE_S + 0.5)
    ended = status(cluster)
    assert ended.returncode == 3, ended.stdout
    assert f"{cluster.name} is not running: its supervisor pid {supervisor.pid}" in ended.stdout
    assert "was last seen at" in ended.stdout and "last snapshot: ssid" in ended.stdout


def test_a_clean_stop_is_shown_as_one(cluster: Cluster) -> None:
    cluster.start(workers=1, partitions=2)
    until(cluster, lambda shown: shown["state"] == "running", 60, "never shown running")
    cluster.stop()
    stopped = status(cluster)
    assert stopped.returncode == 3
    assert f"{cluster.name} is not running: it stopped at " in stopped.stdout, stopped.stdout
