"""``epochal.run(app, config)`` as docs/operations.md shows it: its two files, as written (the
test's broker, ports and a name of its own put in), from a fresh directory. The app lives in
the script that runs it (``__main__``), and one ClusterConfig also tells a Client where the
cluster, Kafka and the warehouse are: while it runs, and with it stopped."""

from __future__ import annotations

import importlib
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import msgspec
import pytest

from epochal import SNAPSHOT, Client, SnapshotReader
from epochal.log.client import KafkaClients
from tests.conftest import free_ports
from tests.integration.cluster import wait_until

pytestmark = pytest.mark.integration

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
BLOCK = re.compile(r'```python title="([^"]+)"\n(.*?)```', re.DOTALL)
SHOWS = {"matinee": 3, "premiere": 5, "late": 1}


@pytest.fixture
def directory(tmp_path: Path, kafka: KafkaClients) -> Iterator[Path]:
    """A fresh directory holding the doc's files, addressed to the test's broker and ports."""
    ports = free_ports(4)
    replaced = {
        "127.0.0.1:9092": kafka.config.bootstrap_servers,
        'App("box_office")': f'App("box_office_{uuid.uuid4().hex[:8]}")',
        "query_port=7700,": f"query_port={ports + 2},\n    port_base={ports},",
    }
    files = dict(BLOCK.findall(DOC.read_text()))
    assert {"box_office.py", "box_office_query.py"} <= set(files)
    for name, written in files.items():
        text = written
        for theirs, ours in replaced.items():
            text = text.replace(theirs, ours)
        (tmp_path / name).write_text(text)
    yield tmp_path


@pytest.fixture
def box_office(directory: Path) -> Iterator[ModuleType]:
    """The doc's module imported by the test too (its ``__main__`` block does not run), from
    its directory, where its relative warehouse is."""
    sys.path.insert(0, str(directory))
    cwd = os.getcwd()
    os.chdir(directory)
    try:
        yield importlib.import_module("box_office")
    finally:
        os.chdir(cwd)
        sys.path.remove(str(directory))
        sys.modules.pop("box_office", None)


def test_an_app_run_from_its_own_script_is_queried_through_its_config_then_stopped(
    directory: Path, box_office: ModuleType, kafka: KafkaClients
) -> None:
    name = box_office.app.name
    log = directory / "run.log"
    with log.open("w") as out:
        process = subprocess.Popen([sys.executable, "box_office.py"], cwd=directory, stderr=out)
    try:
        wait_until(lambda: "ready app=" in log.read_text(), 90, "the cluster never got ready",
                   alive=lambda: process.poll() is None, log=log.read_text)  # fmt: skip
        producer = kafka.producer()
        for show, sold in SHOWS.items():
            for _ in range(sold):
                producer.produce(f"{name}.in.sold", msgspec.json.encode({"show": show}))
        producer.flush(10)
        sales = f"{name}.out.sales"
        wait_until(lambda: _count(kafka, sales) == sum(SHOWS.values()), 60, "no sales came out",
                   alive=lambda: process.poll() is None, log=log.read_text)  # fmt: skip
        query = [sys.executable, "box_office_query.py"]
        queried = subprocess.run(query, cwd=directory, capture_output=True, text=True,
                                 timeout=60, check=False)  # fmt: skip
        assert queried.returncode == 0, queried.stdout + queried.stderr
        live = {f"'{show}': Show(sold={sold})" for show, sold in SHOWS.items()}
        (line,) = [line for line in queried.stdout.splitlines() if line.startswith("live ")]
        assert set(line.removeprefix("live {").removesuffix("}").split(", ")) == live, line
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        code = process.wait(60)
    said = log.read_text()
    assert code == 0, said
    assert f"running box_office:app as '{name}'" in said, said  # its module, not __main__
    assert "stopped at a savepoint" in said and "other code" not in said, said

    config = box_office.config
    ssid = SnapshotReader(config.snapshots, name).latest()
    with Client(box_office.app, (), config=config) as client:  # the cluster is stopped
        past = client.scan(box_office.Show, isolation=SNAPSHOT(ssid))
    assert {key: show.sold for key, show in past} == SHOWS


def _count(kafka: KafkaClients, topic: str) -> int:
    """Committed records on ``topic`` so far (0 before its first)."""
    try:
        ranges = {0: (0, kafka.end_offset(topic))}
    except Exception:  # no such topic yet: the first egress record creates it
        return 0
    return sum(1 for _ in kafka.read_range(topic, ranges, f"reading {topic}"))
