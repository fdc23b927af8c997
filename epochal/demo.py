"""The demo behind the README's first command: the bank example, end to end, on this machine.

On a local Kafka broker it runs ``examples.bank.app`` as a cluster of two worker processes and
a sequencer (``epochal run``, snapshots to ``./warehouse`` every second), feeds it two rounds of
transfers from a plain Kafka client (some in JSON, as another language would send them) and
waits for every transfer's egress record. While round 2 runs it reads live balances through the
query client at each isolation level and submits a client transaction; then it ``kill -9``s a
worker mid-stream: the cluster rolls back, resumes from the latest snapshot, still gives each
transfer exactly one egress record, and the same client keeps answering. At the end it checks
that money was conserved in every snapshot (a Spark SQL query over the history of all of them),
that the snapshot after round 1 reads back by time travel (Spark, with only Delta configured,
and delta-rs), that replaying the command log from the latest snapshot gives its digest, and
that Spark's Kafka source sees every input record.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
from pyspark.sql import SparkSession
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from epochal.actors.api import load_app
from epochal.analytics.history import query_rows, register_views
from epochal.analytics.spark import jvm_output_to, spark_session
from epochal.client import COMMITTED, LIVE, SERIALIZABLE, SNAPSHOT, Client
from epochal.config import CacheConfig, KafkaConfig, SnapshotConfig, SparkConfig
from epochal.errors import EpochalError
from epochal.interrupts import interrupts_held
from epochal.jvm import JarSet, fetch_jars
from epochal.log.client import KafkaClients
from epochal.log.command_log import KafkaCommandLog
from epochal.log.local_broker import LocalBroker
from epochal.recovery.replay import replay_command_log
from epochal.recovery.snapshot_reads import SnapshotReader
from epochal.recovery.snapshots import DeltaSnapshots
from epochal.schemas.egress import EgressRecord
from epochal.schemas.snapshots import Manifest

__all__ = ["run_demo"]

ACCOUNTS = 500
OPENING = 1_000
TRANSFERS_PER_ROUND = 10_000


def run_demo(
    cache: CacheConfig, broker: LocalBroker, warehouse: Path, console: Console, checkout: Path
) -> int:
    """Run the demo of the ``examples/`` in ``checkout``; stops the broker at the end only if
    this run started it."""
    with console.status("fetching jars (first run only)"):
        for jar_set in JarSet:
            fetch_jars(cache, jar_set)
    try:
        with console.status(f"starting Kafka on {broker.config.bootstrap}"):
            started = broker.start()
        console.print(
            f"[green]✓[/] Kafka at {broker.config.bootstrap}"
            + ("" if started else " (already running)")
        )
        demo = _Demo(cache, broker.config.bootstrap, warehouse.resolve(), console, checkout)
        return demo.run()
    finally:
        broker.stop_if_launched()


class _Demo:
    def __init__(
        self, cache: CacheConfig, bootstrap: str, warehouse: Path, console: Console, checkout: Path
    ) -> None:
        self.cache = cache
        self.checkout = checkout
        self.bootstrap = bootstrap
        self.clients = KafkaClients(KafkaConfig(bootstrap))
        self.console = console
        self.name = f"bank-demo-{time.strftime('%Y%m%d-%H%M%S')}"
        self.warehouse = warehouse
        self.app = load_app("examples.bank.app:app", self.name)
        self.snapshots = DeltaSnapshots(self.app, SnapshotConfig(str(warehouse)), partitions=4)
        self.accounts = [f"acct-{i * 10_000 // ACCOUNTS:04d}" for i in range(ACCOUNTS)]
        self.rng = random.Random(7)
        self.egress: list[EgressRecord] = []
        self.run_dir = Path(tempfile.mkdtemp(prefix="epochal-demo-"))
        self.produced = 0
        self.query_port = _free_port_pair()
        self.submitted = ""
        self.checks: dict[str, bool] = {}
        self.produced_at: dict[tuple[int, int], float] = {}  # input (partition, offset) -> s
        self.egressed_at: list[tuple[float, EgressRecord]] = []  # (time s, record)

    def run(self) -> int:
        egress = [self.app.topics.egress(name) for name in ("receipts", "errors")]
        self.clients.create_topics(egress)
        consumers = [
            self.clients.assigned_consumer(topic, {0: 0}, **{"isolation.level": "read_committed"})
            for topic in egress
        ]
        cluster: subprocess.Popen[bytes] | None = None
        try:  # whatever ends the rounds (SIGTERM included) stops the cluster
            with interrupts_held():  # until ``cluster`` has its handle
                cluster = self._start_cluster()
            reader = SnapshotReader(SnapshotConfig(str(self.warehouse)), self.name)
            client = Client(self.app, f"127.0.0.1:{self.query_port}", kafka=self.clients.config,
                            snapshots=reader, timeout_s=60)  # fmt: skip
            try:
                rounds = [self._round(consumers, number, client) for number in (1, 2)]
            finally:
                client.close()
        finally:
            for consumer in consumers:
                consumer.close()
            if cluster is not None:
                cluster.send_signal(signal.SIGTERM)
                cluster.wait(60)
        self.console.print(f"  starting Spark (its log: {self.spark_log})")
        with jvm_output_to(self.spark_log):
            jars = self.cache.jar_dir(JarSet.SPARK.value)
            spark = spark_session(SparkConfig(jar_dir=jars, app_name="epochal-demo"))
        return self._report(spark, rounds)

    def _start_cluster(self) -> subprocess.Popen[bytes]:
        command = [sys.executable, "-m", "epochal.cli", "run", "examples.bank.app:app",
                   "--name", self.name, "--bootstrap", self.bootstrap, "--workers", "2",
                   "--run-dir", str(self.run_dir), "--warehouse", str(self.warehouse),
                   "--failure-timeout-ms", "6000",
                   "--query-port", str(self.query_port)]  # fmt: skip
        log = open(self.log_path, "wb")  # noqa: SIM115 - the child keeps it open
        paths = [str(self.checkout), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
        self.console.print(
            f"[green]✓[/] epochal run examples.bank.app:app as {self.name!r}: 2 workers, "
            f"4 partitions, a snapshot every second to {self.warehouse / self.name}, live "
            f"queries on 127.0.0.1:{self.query_port} and :{self.query_port + 1} "
            f"(log: {self.log_path})"
        )
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)

    @property
    def log_path(self) -> Path:
        return self.run_dir / "cluster.log"

    @property
    def spark_log(self) -> Path:
        return self.run_dir / "spark.log"

    def _status(self) -> dict[str, Any]:
        path = self.run_dir / self.name / "processes.json"
        return dict(json.loads(path.read_text())) if path.exists() else {}

    def _produce(self, with_deposits: bool, count: int) -> None:
        """Like any client: msgpack, and every tenth record as JSON."""
        from examples.bank.producer import Deposit, Transfer

        producer = self.clients.producer(**{"linger.ms": 5})
        topic = self.app.topics.input("transfers")
        events: list[Any] = [Deposit(a, OPENING) for a in self.accounts] if with_deposits else []
        for _ in range(count):
            source, target = self.rng.sample(self.accounts, 2)
            events.append(Transfer(source, target, self.rng.randrange(1, OPENING // 2)))

        def produced(error: Any, message: Any) -> None:
            if error is None:
                at = message.timestamp()[1] / 1000
                self.produced_at[message.partition(), message.offset()] = at

        for i, event in enumerate(events):
            encode = msgspec.json.encode if i % 10 == 0 else msgspec.msgpack.encode
            producer.produce(topic, encode(event), on_delivery=produced)
        producer.flush(30)
        self.produced += len(events)

    def _wait_for_egress(
        self, consumers: list[Any], expected: int, kill_at: int | None = None
    ) -> float:
        """Collect receipts and abort reports (read_committed) until every transfer has one;
        ``kill -9`` a worker once ``kill_at`` are in."""
        started = time.monotonic()
        with Progress(console=self.console, transient=True) as progress:
            task = progress.add_task("transfers through the cluster", total=expected)
            while self._transfers_out() < expected:
                if time.monotonic() - started > 180:
                    raise EpochalError("the cluster did not process the transfers in 180 s")
                for consumer in consumers:
                    for message in consumer.consume(10_000, 0.1):
                        self._egressed(message)
                progress.update(task, completed=self._transfers_out())
                if kill_at is not None and self._transfers_out() >= kill_at:
                    self._kill_a_worker()
                    kill_at = None
        for consumer in consumers:  # anything beyond: a duplicate, which the checks catch
            for message in consumer.consume(10_000, 1.0):
                self._egressed(message)
        return time.monotonic() - started

    def _egressed(self, message: Any) -> None:
        record = self.app.egress_codec.read_record(message.value())
        self.egress.append(record)
        self.egressed_at.append((message.timestamp()[1] / 1000, record))

    def _inputs_produced(self) -> int:
        """Transfers produced so far (the deposits of round 1 aside)."""
        return self.produced - (ACCOUNTS if self.produced else 0)

    def _transfers(self) -> list[EgressRecord]:
        """Egress records of the transfers produced to the input topic (not of the client's
        transaction, which came through ``<app>.requests``)."""
        topic = self.app.topics.input("transfers")
        return [r for r in self.egress if r.source is not None and r.source.topic == topic]

    def _transfers_out(self) -> int:
        return len(self._transfers())

    def _kill_a_worker(self) -> None:
        pid = int(self._status()["workers"][1])
        os.kill(pid, signal.SIGKILL)
        self.killed_at = time.monotonic()
        self.console.print(f"[yellow]![/] kill -9 of worker 1 (pid {pid}) mid-stream")

    def _snapshot_covering(self, inputs: int) -> Manifest:
        """The first snapshot whose input positions cover ``inputs`` records (the one taken
        when the input went idle, at the latest)."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for manifest in self.snapshots.manifests():
                if sum(manifest.input_positions.values()) >= inputs:
                    return manifest
            time.sleep(0.2)
        raise EpochalError("no snapshot covers the input after 60 s")

    def _round(self, consumers: list[Any], number: int, client: Client) -> dict[str, Any]:
        started = time.monotonic()
        expected = number * TRANSFERS_PER_ROUND
        kill_at = None
        if number == 2:  # queries while the first half runs; the kill in the second half
            self._produce(with_deposits=False, count=TRANSFERS_PER_ROUND // 2)
            self._wait_for_egress(consumers, TRANSFERS_PER_ROUND + TRANSFERS_PER_ROUND // 10)
            self._query_while_running(client)
            kill_at = expected - TRANSFERS_PER_ROUND // 4
        self._produce(with_deposits=number == 1, count=expected - self._inputs_produced())
        self._wait_for_egress(consumers, expected, kill_at)
        seconds = time.monotonic() - started
        if number == 2:
            generation = self._status().get("generation")
            totals = client.aggregate("Account", "sum:balance", "count")
            self.checks[f"the same query client answered after the rollback (generation "
                        f"{generation}): {totals['count']} accounts, money conserved"] = (
                totals == {"sum:balance": ACCOUNTS * OPENING, "count": ACCOUNTS})  # fmt: skip
        manifest = self._snapshot_covering(self.produced)
        self.console.print(
            f"[green]✓[/] round {number}: {TRANSFERS_PER_ROUND:,} transfers through Kafka and "
            f"the cluster in {seconds:.1f} s; {len(self.snapshots.manifests())} snapshots so "
            f"far, the latest ssid={manifest.ssid} (state Delta version "
            f"{manifest.state_versions.get('Account')})"
        )
        if number == 2:
            self._show_recovery()
        return {"manifest": manifest}

    def _query_while_running(self, client: Client) -> None:
        """Live reads at each isolation level and a client transaction, while transfers run."""
        from examples.bank.app import Transfer

        account, first = self.accounts[0], self.snapshots.manifests()[-1]
        table = Table(title=f"{account} while round 2 runs, at each isolation level")
        for column in ("isolation", "balance", "read at", "took"):
            table.add_column(column)
        for isolation in (LIVE, COMMITTED, SERIALIZABLE, SNAPSHOT(first.ssid)):
            started = time.perf_counter()
            value = client.get("Account", account, isolation=isolation)
            took = (time.perf_counter() - started) * 1000
            at = {"live": "the newest value in memory",
                  "committed": f"epoch {client.read_epoch}, one cut of every partition",
                  "serializable": "its own timestamp in the command log",
                  "snapshot": "the Delta tables"}  # fmt: skip
            table.add_row(repr(isolation), str(value.balance), at[isolation.level],
                          f"{took:.1f} ms")  # fmt: skip
        self.console.print(table)
        sums = [client.aggregate("Account", "sum:balance")["sum:balance"] for _ in range(50)]
        self.checks[f"50 COMMITTED sums of all {ACCOUNTS} balances while transfers ran: each "
                    "the total (a transfer is seen whole or not at all)"] = all(
            total == ACCOUNTS * OPENING for total in sums)  # fmt: skip
        outcome = client.submit("transfer", Transfer(account, self.accounts[1], 1)).result()
        self.console.print(
            f"[green]✓[/] client transaction transfer({account} → {self.accounts[1]}, 1): "
            f"{'committed' if outcome.committed else 'aborted: ' + outcome.reason} at epoch "
            f"{outcome.epoch}, seq {outcome.seq}"
        )
        self.submitted = outcome.request_id
        self.checks["the client transaction ran once and reported its outcome"] = outcome.epoch >= 0

    def _show_recovery(self) -> None:
        log = self.log_path.read_text(errors="replace")
        resumed = re.findall(r"resumed from snapshot ssid=(\d+)", log)
        recovered = re.findall(r"recovered worker=(\d+) from_ssid=(-?\d+) from_position=\d+ "
                               r"replayed_records=(\d+) seconds=([\d.]+)", log)  # fmt: skip
        after = [r for r in recovered if int(r[1]) >= 0]
        if resumed and after:
            worker, ssid, records, seconds = after[-1]
            self.console.print(
                f"[green]✓[/] rolled back to generation {self._status().get('generation')}: "
                f"worker {worker} resumed from snapshot ssid={ssid} and replayed {records} "
                f"command-log records in {float(seconds):.2f} s"
            )

    def _history(self, spark: SparkSession) -> list[tuple[int, int, int]]:
        """``(ssid, accounts, money)`` of every snapshot, by a Spark SQL query over the views
        epochal registers, shown as a table."""
        register_views(spark, self.app, str(self.warehouse))
        query = ("SELECT _ssid AS ssid, count(*) AS accounts, sum(balance) AS money "
                 "FROM account_history GROUP BY _ssid ORDER BY _ssid")  # fmt: skip
        _, rows = query_rows(spark, query)
        self.console.print(f"spark.sql({query!r})", highlight=False)
        table = Table()
        for column in ("ssid", "accounts", "money"):
            table.add_column(column)
        shown = rows if len(rows) <= 6 else [*rows[:3], ["…", "…", "…"], *rows[-3:]]
        for ssid, accounts, money in shown:
            table.add_row(str(ssid), str(accounts), str(money))
        self.console.print(table)
        return [(int(r[0]), int(r[1]), int(r[2])) for r in rows]

    def _report(self, spark: SparkSession, rounds: list[dict[str, Any]]) -> int:
        from deltalake import DeltaTable

        first, last = rounds[0]["manifest"], rounds[-1]["manifest"]
        state = str(self.snapshots.warehouse.state("Account"))
        version = first.state_versions["Account"]
        reader = spark.read.format("delta").option("versionAsOf", version)
        by_spark = {r["_key"]: r["balance"] for r in reader.load(state).collect()}
        columns = DeltaTable(state, version=version).to_pyarrow_table().to_pydict()
        by_delta_rs = dict(zip(columns["_key"], columns["balance"], strict=True))
        latest = DeltaTable(state, version=last.state_versions["Account"]).to_pyarrow_table()
        balances = dict(zip(latest.column("_key").to_pylist(),
                            latest.column("balance").to_pylist(), strict=True))  # fmt: skip
        topic = self.app.topics.input("transfers")
        kafka = spark.read.format("kafka").option("kafka.bootstrap.servers", self.bootstrap)
        inputs = kafka.option("subscribe", topic).load().count()
        trimmed, _ = self.clients.watermarks(topic)
        with self.console.status("replaying the command log from the oldest snapshot kept"):
            oldest = self.snapshots.restore(self.snapshots.manifests()[0].ssid)
            assert oldest is not None
            logged = KafkaCommandLog(self.clients, self.app.topics.command_log).epochs(
                oldest.manifest.command_log_position, to_end=True
            )
            engine, epochs = replay_command_log(self.app, logged, restored=oldest)
        newest = self.snapshots.manifests()[-1]
        history = self._history(spark)

        table = Table(title=f"balances ({ACCOUNTS} accounts, first 8)")
        for column in ("account", f"snapshot {first.ssid} (time travel, Spark)",
                       f"snapshot {last.ssid}"):  # fmt: skip
            table.add_column(column)
        for account in self.accounts[:8]:
            table.add_row(account, str(by_spark.get(account)), str(balances.get(account)))
        self.console.print(table)
        sources = [(r.source.partition, r.source.offset) for r in self._transfers() if r.source]
        submitted = [r for r in self.egress if r.request_id == self.submitted]
        transfers = 2 * TRANSFERS_PER_ROUND
        checks = {
            **self.checks,
            "every transfer has exactly one receipt or abort report, across the kill":
                len(sources) == len(set(sources)) == transfers,
            "the client transaction has exactly one receipt, and nothing else came out":
                len(submitted) == 1 and len(self.egress) == transfers + 1,
            f"Spark SQL over the history of all {len(history)} snapshots: money conserved in "
            "each": bool(history) and all(total == count * OPENING for _, count, total in history),
            "money conserved in both snapshots": all(
                sum(v) == ACCOUNTS * OPENING
                for v in (by_delta_rs.values(), balances.values())
            ),
            "no account overdrawn": min(balances.values()) >= 0,
            "time travel: Spark and delta-rs read the snapshot of round 1 back": by_spark
            == by_delta_rs and len(by_spark) == ACCOUNTS,
            f"the oldest snapshot kept (ssid={oldest.manifest.ssid}) + {epochs} epochs of the "
            f"command log replayed = the newest (ssid={newest.ssid}), digest for digest":
                engine.digest() == newest.digest and epochs > 0,
            f"the input topic is kept back to the oldest snapshot and no further ({trimmed:,} "
            f"records trimmed); Spark's Kafka source reads the {inputs:,} left":
                trimmed == oldest.manifest.input_positions.get(f"{topic}:0")
                and inputs == self.produced - trimmed,
        }  # fmt: skip
        for check, ok in checks.items():
            self.console.print(f"{'[green]✓' if ok else '[red]✗'}[/] {check}")
        ok = all(checks.values())
        self.console.print("[green]✓ demo finished[/]" if ok else "[red]✗ demo found a problem[/]")
        self.console.print(f"  logs: the cluster's {self.log_path}, Spark's {self.spark_log}")
        self.console.print(f"  {plot_run(self._timeline(), self.warehouse.parent / 'demo.png')}")
        return 0 if ok else 1

    def _timeline(self) -> list[tuple[float, float]]:
        """``(seconds since the first input, ms from input to egress)`` of each transfer's
        egress record, in the order they came out."""
        topic = self.app.topics.input("transfers")
        start = min(self.produced_at.values(), default=0.0)
        points = []
        for at, record in self.egressed_at:
            source = record.source
            if source is None or source.topic != topic:
                continue
            produced = self.produced_at.get((source.partition, source.offset))
            if produced is not None:
                points.append((at - start, 1000 * (at - produced)))
        return points


def plot_run(points: list[tuple[float, float]], path: Path) -> str:
    """A PNG of the transfers out per second and their latency from input to egress (median and
    max per second) over the run; the line that names it (or says why there is none)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: pip install matplotlib for demo.png"
    if not points:
        return "no plot: no transfer came out"
    seconds: dict[int, list[float]] = {}
    for at, latency in points:
        seconds.setdefault(int(at), []).append(latency)
    xs = sorted(seconds)
    figure, (rate, latency) = plt.subplots(2, 1, sharex=True, figsize=(8, 5))
    rate.bar(xs, [len(seconds[x]) for x in xs], width=0.9)
    rate.set_ylabel("transfers out / s")
    latency.plot(xs, [statistics.median(seconds[x]) for x in xs], label="median")
    latency.plot(xs, [max(seconds[x]) for x in xs], label="max")
    latency.set_yscale("log")
    latency.set_ylabel("input to egress (ms)")
    latency.set_xlabel("seconds since the first input (a backlog: latency includes its queue)")
    latency.legend()
    figure.suptitle("epochal demo: the bank, 2 workers, a kill -9 in round 2")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return f"throughput and latency over the run: {path.resolve()}"


def _free_port_pair() -> int:
    """Two adjacent free ports for the two workers' query servers, from 7700 up."""
    import socket

    for port in range(7700, 7800, 2):
        try:
            for candidate in (port, port + 1):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        return port
    raise EpochalError("no two adjacent free ports between 7700 and 7800 for live queries")
