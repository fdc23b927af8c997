"""``epochal status --serve``: the page in a real headless browser (Debian's ``chromium``) shows
the running workers, then the next generation once a worker is killed and comes back; it asks
the browser to reload it by itself; with a token it wants the token."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from epochal.config import KafkaConfig
from epochal.log.client import KafkaClients
from tests.conftest import free_ports
from tests.integration.cluster import EPOCHAL, Cluster

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture
def cluster(kafka_config: KafkaConfig, tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(f"sp{uuid.uuid4().hex[:8]}", tmp_path, KafkaClients(kafka_config))
    try:
        yield running
    finally:
        running.close()


def serve(cluster: Cluster, port: int, *flags: str) -> subprocess.Popen[bytes]:
    command = [EPOCHAL, "status", cluster.name, "--bootstrap",
               cluster.kafka.config.bootstrap_servers, "--warehouse", str(cluster.warehouse),
               "--serve", str(port), *flags]  # fmt: skip
    log = (cluster.run_dir / f"page-{port}.log").open("wb")
    page = subprocess.Popen(command, cwd=cluster.run_dir, stdout=log, stderr=subprocess.STDOUT)
    cluster.processes.append(page)  # killed with the cluster, its log closed
    cluster.logs.append(log)
    return page


def browse(url: str) -> str:
    """The page's DOM once a headless chromium loaded it."""
    assert CHROMIUM is not None
    done = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", url],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def until(url: str, ready: Callable[[str], bool], timeout_s: float, what: str) -> str:
    deadline = time.monotonic() + timeout_s
    while not ready(dom := browse(url)):
        assert time.monotonic() < deadline, f"{what}\n{dom}"
        time.sleep(0.5)
    return dom


def worker_row(dom: str, index: int) -> list[str]:
    """The cells of worker ``index``'s row of the processes table."""
    row = re.search(rf'<tr data-process="worker {index}">(.*?)</tr>', dom, re.S)
    assert row is not None, dom
    return re.findall(r"<td>(.*?)</td>", row.group(1), re.S)


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (apt-get install chromium)")
def test_the_page_follows_a_worker_kill_in_a_browser(cluster: Cluster) -> None:
    cluster.start(workers=2, partitions=4)
    cluster.produce(100, deposits=True)
    port = free_ports(1)
    serve(cluster, port)
    url = f"http://127.0.0.1:{port}/"
    pids = cluster.status()

    def running(dom: str) -> bool:  # both rows: one worker may report a moment after the other
        workers = ('data-process="worker 0"', 'data-process="worker 1"')
        return f"{cluster.name} running: generation 1" in dom and all(w in dom for w in workers)

    dom = until(url, running, 60, "the page never showed the running cluster")
    assert '<meta http-equiv="refresh" content="2">' in dom  # the browser reloads it by itself
    for index in (0, 1):
        assert worker_row(dom, index)[1] == str(pids["workers"][index])
    assert 'id="chart-txns"' in dom and 'id="chart-lag"' in dom and "<svg" in dom
    assert "latest snapshots" in dom

    os.kill(pids["workers"][1], signal.SIGKILL)

    def back(dom: str) -> bool:
        if f"{cluster.name} running: generation 2, 1 rollback" not in dom:
            return False
        cells = worker_row(dom, 1)
        return cells[3] == "2" and cells[1] != str(pids["workers"][1])

    dom = until(url, back, 60, "the page never showed the worker back in generation 2")
    assert worker_row(dom, 1)[1] == str(cluster.status()["workers"][1])


def test_with_a_token_the_page_wants_it(cluster: Cluster) -> None:
    port = free_ports(1)
    serve(cluster, port, "--token", "s3cret")
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(url, timeout=5)
        except urllib.error.HTTPError as exc:
            assert exc.code == 403
            break
        except OSError:  # not listening yet
            assert time.monotonic() < deadline, "the page never listened"
            time.sleep(0.2)
            continue
        raise AssertionError("answered without the token")
    with urllib.request.urlopen(f"{url}?token=s3cret", timeout=5) as answer:
        page = answer.read().decode()
    assert "url=/?token=s3cret" in page  # its reload keeps the token
    assert f"{cluster.name} is not running: no status record" in page
