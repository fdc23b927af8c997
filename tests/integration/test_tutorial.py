"""docs/tutorial.md runs as written: its files in a fresh directory, then every command of its
``bash`` blocks in order, against the test's broker.

A fenced block with a ``title="FILE"`` is a file the user saves; every line of a ``bash`` block
is a command, run by bash in that directory. Only addresses are put in: the session's broker
for ``127.0.0.1:9092``, free ports for the query and metrics ports (the tutorial's defaults
may be taken by another run on this machine), and ``--bootstrap``/``--port-base`` added to the
``epochal`` commands that take them. The set-up lines in :data:`PROVIDED` are what the test's
own environment stands for. Each command's time is printed (``pytest -s``): the tutorial
quotes them.
"""

from __future__ import annotations

import ast
import base64
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from epochal.config import CacheConfig, KafkaConfig
from epochal.log.client import KafkaClients
from epochal.log.status import StatusReader
from epochal.status import read_report
from tests.conftest import free_ports
from tests.integration.cluster import wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "docs" / "tutorial.md"
BLOCK = re.compile(r'^```(\w*)(?: title="([^"]+)")?\n(.*?)^```$', re.MULTILINE | re.DOTALL)
BIN = Path(sys.executable).parent  # the test's virtualenv: its python, pytest and epochal
# The set-up the test's environment stands for: this virtualenv with epochal (on PYTHONPATH)
# and pytest, and the session's broker for the one `epochal kafka start` makes.
PROVIDED = {
    "python3 -m venv .venv && . .venv/bin/activate",
    "pip install ~/src/epochal pytest  # your checkout of epochal (or its wheel)",
    "epochal kafka start  # a single-node broker on 127.0.0.1:9092, detached",
}
BIKES = 10 + 4 + 6 + 10  # what stations.jsonl opens with
KCAT = "kcat -C -b 127.0.0.1:9092 -X isolation.level=read_committed -t "  # how it reads a topic


def tutorial_files() -> dict[str, str]:
    return {title: text for _, title, text in BLOCK.findall(TUTORIAL.read_text()) if title}


def tutorial_commands() -> list[str]:
    blocks = [text for language, title, text in BLOCK.findall(TUTORIAL.read_text())]
    languages = [language for language, _, _ in BLOCK.findall(TUTORIAL.read_text())]
    return [
        line.strip()
        for language, text in zip(languages, blocks, strict=True)
        if language == "bash"
        for line in text.splitlines()
        if line.strip()
    ]


def test_the_tutorial_has_its_files_and_its_set_up_lines() -> None:
    assert {"bikes.py", "test_bikes.py", "query.py", "history.py"} <= set(tutorial_files())
    assert set(tutorial_commands()) >= PROVIDED, "a set-up line changed: update PROVIDED"


@dataclass
class Shell:
    """A user's shell in a fresh directory, on the test's broker and free ports."""

    cwd: Path
    bootstrap: str
    cache: CacheConfig
    # One block, split in three: ports picked apart could coincide (free, but not bound yet).
    ports: int = field(default_factory=lambda: free_ports(16))
    background: list[subprocess.Popen[str]] = field(default_factory=list)
    timings: list[tuple[str, float]] = field(default_factory=list)

    @property
    def query_port(self) -> int:
        return self.ports  # and +1: a query server per worker

    @property
    def metrics_port(self) -> int:
        return self.ports + 4  # workers, then the sequencer and the supervisor

    @property
    def port_base(self) -> int:
        return self.ports + 8  # peers, the feed, query servers: 2 * workers + 1

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": str(ROOT),  # epochal, as `pip install` would put it
            "EPOCHAL_CACHE": str(self.cache.root),
        }

    def addressed(self, text: str) -> str:
        """``text`` with the test's broker and ports put in for the tutorial's."""
        replaced = {
            "127.0.0.1:9092": self.bootstrap,
            "127.0.0.1:7700": f"127.0.0.1:{self.query_port}",
            "--query-port 7700": f"--query-port {self.query_port}",
            "--metrics-port 9400": f"--metrics-port {self.metrics_port}",
            "127.0.0.1:9402": f"127.0.0.1:{self.metrics_port + 2}",
            'Path.home() / ".cache" / "epochal"': f"Path({str(self.cache.root)!r})",
        }
        for theirs, ours in replaced.items():
            text = text.replace(theirs, ours)
        return text

    def command(self, line: str) -> str:
        words = shlex.split(line, comments=True)
        if words[:1] == ["epochal"] and words[1] in ("run", "status"):
            line += f" --bootstrap {self.bootstrap}"
        if words[:2] == ["epochal", "run"]:
            line += f" --port-base {self.port_base}"
        return self.addressed(line)

    def run(self, line: str) -> str:
        started = time.monotonic()
        done = subprocess.run(
            ["bash", "-c", self.command(line)],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        self.timings.append((line, time.monotonic() - started))
        outputs = (
            self.cwd.parent / "outputs"
        )  # beside the user's directory, to compare with the page
        outputs.mkdir(exist_ok=True)
        (outputs / f"{len(self.timings):02d}.txt").write_text(
            f"$ {line}\n{done.stdout}{done.stderr}"
        )
        assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
        assert "Traceback" not in done.stderr, done.stderr
        return done.stdout

    def start(self, line: str) -> subprocess.Popen[str]:
        log = (self.cwd / "run.log").open("w")
        process = subprocess.Popen(
            ["bash", "-c", f"exec {self.command(line)}"],
            cwd=self.cwd,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        log.close()
        self.background.append(process)
        return process

    def start_cluster(self, line: str) -> subprocess.Popen[str]:
        """``epochal run`` in the background (the user's second terminal), once it answers."""
        started = time.monotonic()
        cluster = self.start(line)
        wait_until(
            lambda: _answers(self.query_port),
            60,
            "the query servers answer",
            alive=lambda: cluster.poll() is None,
            log=self.log,
        )
        self.timings.append((f"{line}  (until queries answer)", time.monotonic() - started))
        return cluster

    def log(self) -> str:
        return (self.cwd / "run.log").read_text()


@pytest.fixture
def shell(tmp_path: Path, kafka_config: KafkaConfig, own_cache: CacheConfig) -> Iterator[Shell]:
    user = Shell(tmp_path / "bikes", kafka_config.bootstrap_servers, own_cache)
    user.cwd.mkdir()
    yield user
    for process in user.background:
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait()
    print("\ntutorial timings:")
    for line, seconds in user.timings:
        print(f"{seconds:7.1f} s  {line[:110]}")


def _settle(kafka: KafkaClients, since_ms: float) -> None:
    """Until every record produced before ``since_ms`` is sequenced, and every epoch run."""
    wait_until(lambda: _settled(kafka, since_ms), 60, "the input is sequenced and run")


def _settled(kafka: KafkaClients, since_ms: float) -> bool:
    report = read_report(StatusReader(kafka, "bikes"), None)
    sequencer = report.sequencer
    return (
        sequencer is not None
        and sequencer.time_ms > since_ms
        and sum(report.input_lag.values()) == 0
        and report.executed_epoch >= report.epoch
    )


def _json_lines(output: str) -> list[Any]:
    """What kcat printed of a JSON app's topic: one JSON object a line."""
    return [json.loads(line) for line in output.splitlines()]


def test_queries_md_reads_the_tables_with_the_session_history_py_runs() -> None:
    """docs/queries.md's plain PySpark session (local jars) is the one the tutorial's history.py
    builds, line for line, so the test below runs it."""
    queries = (ROOT / "docs" / "queries.md").read_text()
    (session,) = [text for _, _, text in BLOCK.findall(queries) if '"spark.jars"' in text]
    built = session[: session.index(".getOrCreate()")].splitlines()
    history = [line.split("  #")[0] for line in tutorial_files()["history.py"].splitlines()]
    assert [line.split("  #")[0] for line in built if line.strip()] == [
        line for line in history if line.strip()
    ][: len([line for line in built if line.strip()])]


@pytest.mark.skipif(
    shutil.which("kcat") is None,
    reason="kcat is not installed (./dev test installs it where apt can): the tutorial uses it",
)
def test_the_tutorial_runs_as_written(shell: Shell, kafka: KafkaClients) -> None:
    for name, text in tutorial_files().items():
        (shell.cwd / name).write_text(shell.addressed(text))
    outputs: dict[str, str] = {}
    cluster = None
    for line in tutorial_commands():
        if line in PROVIDED:
            continue
        if line.startswith("epochal run "):
            cluster = shell.start_cluster(line)
            continue
        outputs[line] = shell.run(line)
        if "kcat -P" in line or "produce.py" in line:  # the cluster takes it in before what next
            _settle(kafka, time.time() * 1000)
    assert cluster is not None and cluster.wait(60) == 0, shell.log()
    log = shell.log()
    assert "Traceback" not in log and "rolling back" not in log, log  # key_sample: no rebalance

    def output(prefix: str) -> str:
        (found,) = [text for line, text in outputs.items() if line.startswith(prefix)]
        return found

    assert "3 passed" in output("pytest -q test_bikes.py")
    trips = _json_lines(output(KCAT + "bikes.out.trips"))
    assert len(trips) > 10 and all(
        t["handler"] == "return_bike" and t["committed"] and t["value"]["rider"].startswith("r-")
        for t in trips
    ), trips
    alerts = _json_lines(output(KCAT + "bikes.out.alerts"))
    assert alerts and all(a["handler"] == "alert_empty" and "station" in a["value"] for a in alerts)
    refused = _json_lines(output(KCAT + "bikes.out.refused"))
    assert all(not r["committed"] and r["value"] is None for r in refused), refused
    reasons = "\n".join(r["reason"] for r in refused)
    for reason in ("'bikes >= 0' violated", "'bikes <= docks' violated", "riding a bike from"):
        assert reason in reasons, reasons
    (letter,) = _json_lines(output(KCAT + "bikes.dlq"))
    assert "missing required field `station`" in letter["reason"], letter
    assert json.loads(base64.b64decode(letter["value"])) == {"type": "Rent", "rider": "r-0001"}

    queried = output("python query.py")
    parked = int(re.search(r"'sum:bikes': (\d+)", queried).group(1))  # type: ignore[union-attr]
    riding = int(re.search(r"riding: (\d+)", queried).group(1))  # type: ignore[union-attr]
    assert parked + riding == BIKES, queried  # one consistent cut: no bike lost or doubled
    stations = ast.literal_eval(re.search(r"COMMITTED +(\{'harbour.*)", queried).group(1))  # type: ignore[union-attr]
    most = max(stations, key=stations.get)
    assert "committed=True" in queried and f"r-1000 rides from {most}\n" in queried, queried
    assert re.search(r"SNAPSHOT\(\d+\) harbour had \d+ bikes", queried), queried

    assert "bikes running: generation 1, 0 rollbacks" in output("epochal status bikes")
    sequenced = output("curl -s 127.0.0.1:9402/metrics")
    assert float(sequenced.split()[-1]) >= 4 + 600 + 1, sequenced
    assert "at a savepoint" in output("epochal stop bikes")

    history = output('epochal sql "SELECT _ssid, sum(bikes) AS parked')
    parked_by_ssid = [int(cells[1]) for cells in _rows(history)]
    assert parked_by_ssid and all(0 <= n <= BIKES for n in parked_by_ssid), history
    refusals = output('epochal sql "SELECT get_json_object').splitlines()
    assert refusals[0] == "station,refused" and len(refusals) > 1, refusals
    assert f"ridden = {BIKES}" in output("python history.py")


def _rows(table: str) -> list[list[str]]:
    """The cells of each row of a table ``epochal sql`` printed."""
    cells = [line.strip("│ ").split("│") for line in table.splitlines() if line.startswith("│")]
    return [[cell.strip() for cell in row] for row in cells]


def _answers(port: int) -> bool:
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), 0.5).close()
    except OSError:
        return False
    return True
