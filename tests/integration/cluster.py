"""``epochal run`` of the test workload as real processes on the real broker, and the checks
every cluster test ends with: each input applied once, timestamps unique and increasing, each
egress record once, outcomes as the serial oracle says."""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import msgspec
from confluent_kafka import Producer

from epochal.actors.api import App
from epochal.actors.layout import default_workers
from epochal.actors.oracle import SerialOracle
from epochal.config import SnapshotConfig
from epochal.errors import LogError
from epochal.log.client import KafkaClients
from epochal.log.command_log import KafkaCommandLog
from epochal.recovery.snapshots import DeltaSnapshots
from epochal.schemas.codec import decode
from epochal.schemas.commands import DeadLetter, EpochRecord
from epochal.schemas.egress import EgressRecord
from epochal.schemas.snapshots import Manifest
from tests.conftest import free_ports, gone
from tests.unit.actors.workload import Deposit, Transfer, app

__all__ = [
    "ACCOUNTS",
    "BOUND_MS",
    "SLACK_S",
    "Cluster",
    "executable",
    "first_child",
    "gone",
    "wait_until",
]

EPOCHAL = str(Path(sys.executable).parent / "epochal")
ROOT = Path(__file__).resolve().parents[2]
BOUND_MS = 1500
SLACK_S = 2.5  # the group's rebalance, the supervisor's watch interval, a loaded machine
ACCOUNTS = 40


@dataclass
class Cluster:
    """``epochal run`` of the test workload as a subprocess, and what the test fed it."""

    name: str
    run_dir: Path
    kafka: KafkaClients
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[IO[bytes]] = field(default_factory=list)
    produced: int = 0
    transfers: int = 0
    metrics_port: int = 0
    rng: random.Random = field(default_factory=lambda: random.Random(7))
    app_spec: str = "tests.unit.actors.workload:app"  # what ``start`` runs

    @property
    def warehouse(self) -> Path:
        return self.run_dir / "warehouse"

    @property
    def status_file(self) -> Path:
        return self.run_dir / self.name / "processes.json"

    def status(self) -> dict[str, Any]:
        return dict(json.loads(self.status_file.read_text()))

    def log(self) -> str:
        return "".join(p.read_text() for p in sorted(self.run_dir.glob("run-*.log")))

    def start(
        self,
        workers: int | None = 2,
        partitions: int = 4,
        metrics_port: int = 0,
        snapshot_ms: int = 1000,
        extra: Sequence[str] = (),
        *,
        failure_timeout_ms: int = BOUND_MS,
    ) -> int:
        """Starts a run and waits for its processes; returns the workers' port base.

        With ``metrics_port`` P, worker w serves metrics on P+w and the sequencer on P+workers.
        Snapshots go to ``<run_dir>/warehouse`` every ``snapshot_ms`` (0: none). ``workers``
        None: epochal's default layout (no ``--workers``, no ``--partitions``).
        """
        layout = ["--workers", str(workers), "--partitions", str(partitions)] if workers else []
        workers = workers or default_workers()
        ports = 2 * workers + 1  # peers, the feed (weak mode), query servers
        metrics = range(metrics_port, metrics_port + workers + 2) if metrics_port else range(0)
        port_base = free_ports(ports)
        while set(metrics) & set(range(port_base, port_base + ports)):  # free, but not bound
            port_base = free_ports(ports)  # yet: apart, or the run refuses to start
        self.query_base = port_base + workers + 1
        self.metrics_port = metrics_port
        command = [
            EPOCHAL, "run", self.app_spec, "--name", self.name,
            "--bootstrap", self.kafka.config.bootstrap_servers, *layout,
            "--port-base", str(port_base),
            "--run-dir", str(self.run_dir), "--metrics-port", str(metrics_port),
            "--epoch-ms", "20", "--failure-timeout-ms", str(failure_timeout_ms),
            "--startup-timeout-ms", "20000", "--warehouse", str(self.warehouse),
            *(["--snapshot-interval-ms", str(snapshot_ms)] if snapshot_ms else ["--no-snapshots"]),
            "--keep-snapshots", "0",  # keep the whole logs: the oracle checks read from offset 0
            "--query-port", str(self.query_base),
            *extra,
        ]  # fmt: skip
        log = open(self.run_dir / f"run-{len(self.processes)}.log", "wb")  # noqa: SIM115
        wide = {**os.environ, "COLUMNS": "300"}  # the supervisor's log lines whole, not wrapped
        process = subprocess.Popen(
            command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=wide
        )
        self.processes.append(process)
        self.logs.append(log)
        wait_until(
            lambda: self.status_file.exists()
            and self.status()["supervisor"] == process.pid
            and len(self.status()["workers"]) == workers,
            60, "the cluster did not start", lambda: process.poll() is None, self.log,
        )  # fmt: skip
        return port_base

    def stop(self) -> None:
        """SIGTERM; the stop is clean: exit code 0 and no traceback."""
        process = self.processes[-1]
        before = len(self.log())
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
        assert "Traceback" not in self.log()[before:], self.log()[before:]

    def close(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait()
        for log in self.logs:
            log.close()

    def produce(self, transfers: int, deposits: bool = False, json_every: int = 0) -> None:
        """Random transfers between the test accounts (after a deposit into each, if asked);
        with ``json_every`` n, every n-th record is JSON, the others msgpack."""
        values = (
            [msgspec.msgpack.encode(Deposit(a, 100)) for a in range(ACCOUNTS)] if deposits else []
        )
        for i in range(transfers):
            transfer = Transfer(self.rng.randrange(ACCOUNTS), self.rng.randrange(ACCOUNTS),
                                self.rng.randrange(1, 80))  # fmt: skip
            json = json_every and i % json_every == 0
            values.append((msgspec.json.encode if json else msgspec.msgpack.encode)(transfer))
        self.produce_values(values)
        self.transfers += transfers

    def produce_values(self, values: list[bytes], topic: str = "in.ops") -> None:
        """Records as they are, to ``<app>.<topic>`` (counted as input if it is ``in.ops``)."""
        producer = Producer({
            "bootstrap.servers": self.kafka.config.bootstrap_servers,
            "sticky.partitioning.linger.ms": 0,  # records without a key: any partition, each
        })  # fmt: skip
        for value in values:
            producer.produce(f"{self.name}.{topic}", value)
        assert producer.flush(30) == 0
        if topic == "in.ops":
            self.produced += len(values)

    def read(self, suffix: str) -> list[bytes]:
        """Every committed record of ``<app>.<suffix>`` so far: up to its last stable offset,
        so not a transaction still open (a killed writer's, until it is fenced) nor what
        follows it."""
        topic = f"{self.name}.{suffix}"
        try:
            ranges = {0: (0, self.kafka.end_offset(topic))}
        except LogError:
            return []  # no such topic yet: a writer creates it with its first record
        return [m.value() or b"" for m in self.kafka.read_range(topic, ranges, f"reading {topic}")]

    def egress(self) -> list[EgressRecord]:
        return [
            decode(v, EgressRecord) for s in ("out.receipts", "out.errors") for v in self.read(s)
        ]

    def dead_letters(self) -> list[DeadLetter]:
        return [decode(v, DeadLetter) for v in self.read("dlq")]

    def metrics(self, port: int) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            return str(reply.read().decode())

    def wait_for_egress(self, timeout_s: float = 60) -> list[EgressRecord]:
        deadline = time.monotonic() + timeout_s
        while len(egress := self.egress()) < self.transfers and time.monotonic() < deadline:
            time.sleep(0.5)
        return egress

    def generation(self) -> int:
        return int(self.status()["generation"])

    def snapshots(self) -> DeltaSnapshots:
        return self.snapshots_of(app)

    def snapshots_of(self, runs: App) -> DeltaSnapshots:
        """The snapshots of the cluster running ``runs`` (under the cluster's name)."""
        named = dataclasses.replace(runs, name=self.name)
        return DeltaSnapshots(named, SnapshotConfig(str(self.warehouse)), 4)

    def check_snapshots_against_the_oracle(self) -> list[Manifest]:
        """Every snapshot kept equals the serial oracle at its epoch (the whole log needed), and
        the ``commands`` archive holds every transaction up to the latest once, interior ones
        included, with the oracle's outcome."""
        snapshots = self.snapshots()
        manifests = snapshots.manifests()
        results = SerialOracle(app).run(self.epochs())
        expected = {r.epoch: r.digest for r in results}
        assert manifests, "no snapshot was taken"
        assert all(m.digest == expected[m.epoch] for m in manifests)
        latest = manifests[-1]
        rows = snapshots._table(
            snapshots.warehouse.log("commands"), latest.log_versions["commands"]
        ).to_pyarrow_table(columns=["epoch", "seq", "origin", "committed", "reason"])
        archived = [
            ((r["epoch"], r["seq"]), (r["committed"], r["reason"]))
            for r in rows.to_pylist()
            if r["origin"]  # not an empty epoch's row
        ]
        assert len(archived) == len(dict(archived)), "a transaction archived twice"
        assert dict(archived) == {
            (o.epoch, o.seq): (o.committed, o.reason)
            for r in results
            if r.epoch <= latest.epoch
            for o in r.outcomes
        }
        return manifests

    def epochs(self) -> list[EpochRecord]:
        """Every epoch logged, in order: the command log, or, once retention trimmed it, the
        ``commands`` archive up to the latest snapshot and the log after it (read while the app
        is idle: a snapshot committed meanwhile may trim the log further)."""
        log = KafkaCommandLog(self.kafka, f"{self.name}.cmd")
        if self.kafka.watermarks(log.topic)[0] == 0:
            return [e.record for e in log.epochs(to_end=True)]
        snapshots = self.snapshots()
        latest = snapshots.manifests()[-1]
        after = log.epochs(latest.command_log_position, to_end=True)
        return [*snapshots.archived_epochs(latest), *(e.record for e in after)]

    def _offsets_wrong(self, seen: list[int], egressed: int) -> str:
        """Which input offsets were sequenced other than once, with the log's last lines."""
        counts = collections.Counter(seen)
        missing = [o for o in range(self.produced) if o not in counts]
        doubled = sorted(o for o, n in counts.items() if n > 1)
        foreign = sorted(o for o in counts if not 0 <= o < self.produced)
        tail = "\n".join(self.log().splitlines()[-150:])
        return (
            f"of {self.produced} inputs, {len(missing)} never sequenced {missing[:20]}, "
            f"{len(doubled)} more than once {doubled[:20]}, {len(foreign)} never produced "
            f"{foreign[:20]}; {egressed} of {self.transfers} egress records\n{tail}"
        )

    def check_against_the_oracle(self) -> list[EgressRecord]:
        """Each input sequenced once (or a dead letter), timestamps unique and increasing, each
        egress record once, saying which input it is about, with the serial oracle's outcome."""
        egress = self.wait_for_egress()
        epochs = self.epochs()
        border = [t for e in epochs for t in e.txns if t.source and t.source.topic.endswith(".ops")]
        dead = [d.offset for d in self.dead_letters() if d.topic.endswith(".ops")]
        seen = sorted([t.source.offset for t in border if t.source] + dead)
        assert seen == list(range(self.produced)), self._offsets_wrong(seen, len(egress))
        stamps = [(e.epoch, t.seq) for e in epochs for t in e.txns]
        assert stamps == sorted(set(stamps))
        egressed = [(r.epoch, r.seq) for r in egress]
        assert len(egressed) == len(set(egressed)) == self.transfers
        sources = {(e.epoch, t.seq): (t.source, t.request_id) for e in epochs for t in e.txns}
        assert all(sources[r.epoch, r.seq] == (r.source, r.request_id) for r in egress)
        expected = [
            (o.epoch, o.seq, o.committed, o.reason)
            for result in SerialOracle(app).run(epochs)
            for o in result.outcomes
            if o.handler == "transfer"
        ]
        assert sorted((r.epoch, r.seq, r.committed, r.reason) for r in egress) == sorted(expected)
        return egress


def first_child(
    process: subprocess.Popen[Any],
    accept: Callable[[int], bool] = lambda pid: True,
    timeout_s: float = 120,
    log: Callable[[], str] = lambda: "",
) -> int:
    """The first child that ``process``'s main thread forks and ``accept`` takes, as soon as
    it exists: a tight loop (a fork and its ``exec`` are over in well under a millisecond), so
    that a signal can reach ``process`` while it is still inside ``Popen``."""
    children = Path(f"/proc/{process.pid}/task/{process.pid}/children")
    passed: set[str] = set()
    deadline = time.monotonic() + timeout_s
    while True:
        for pid in set(children.read_text().split()) - passed:
            if accept(int(pid)):
                return int(pid)
            passed.add(pid)
        assert process.poll() is None and time.monotonic() < deadline, log()


def executable(pid: int) -> str | None:
    """The file ``pid`` runs (a forked child runs its parent's until its ``exec``); None once
    it is gone."""
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


def wait_until(
    done: Callable[[], bool],
    timeout_s: float,
    what: str,
    alive: Callable[[], bool] = lambda: True,
    log: Callable[[], str] = lambda: "",
) -> float:
    """Polls until ``done()``; returns when (monotonic)."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert alive(), log()
        assert time.monotonic() < deadline, f"{what}\n{log()}"
        time.sleep(0.02)
    return time.monotonic()


def app_named(name: str) -> App:
    """The test workload's app under the name a cluster runs it as (its topics, its tables)."""
    return dataclasses.replace(app, name=name)
