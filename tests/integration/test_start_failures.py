"""Failures at start and of a resource later, as ``epochal run`` meets them: one line naming the
resource and what to do, once, and no rollback loop."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

import pytest

from tests.integration.cluster import EPOCHAL, ROOT, Cluster

pytestmark = pytest.mark.integration


def _bind_when_free(port: int, timeout_s: float) -> socket.socket:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return socket.create_server(("127.0.0.1", port))
        except OSError:
            assert time.monotonic() < deadline, f"port {port} never came free"
            time.sleep(0.005)


def test_a_port_taken_between_generations_stops_the_cluster_naming_it(cluster: Cluster) -> None:
    cluster.start(workers=2)
    cluster.produce(50, deposits=True)
    assert len(cluster.wait_for_egress()) == cluster.transfers
    query_port = cluster.query_base + 1
    os.kill(cluster.status()["workers"][1], signal.SIGKILL)
    with _bind_when_free(query_port, 5):  # another process takes worker 1's port meanwhile
        assert cluster.processes[-1].wait(60) == 1, cluster.log()
    log = cluster.log()
    taken = (
        f"port {query_port} on 127.0.0.1 (live queries of worker 1) is taken by another "
        "process: stop it, or choose another port with --query-port"
    )
    assert log.count(taken) == 2, log  # the worker's line, the supervisor's last: no loop
    assert log.strip().endswith(
        f"error: worker 1 cannot go on: {taken} (restarting would not help; the cluster stops)"
    )
    assert "Traceback" not in log, log


def test_no_broker_is_one_line_at_start(tmp_path: os.PathLike[str]) -> None:
    started = time.monotonic()
    done = subprocess.run(
        [EPOCHAL, "run", "tests.unit.actors.workload:app", "--bootstrap", "127.0.0.1:1"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "error: no Kafka broker at 127.0.0.1:1 (--bootstrap) does not answer within 10 s: "
        "start one (`epochal kafka start`) or pass its address"
    ]
    assert time.monotonic() - started < 30
    assert not list(os.scandir(tmp_path)) or all(
        entry.name == "warehouse" for entry in os.scandir(tmp_path)
    )
