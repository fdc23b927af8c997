"""The demo behind the README's first command: the bank example, end to end, on this machine.

On a local Kafka broker it runs ``examples.bank.app`` as a cluster of two worker processes and
a sequencer (``epochal run``), feeds it two rounds of transfers from a plain Kafka client (some
in JSON, as another language would send them), waits for every transfer's egress record, rebuilds
the balances from the command log (``epochal replay``) and checks that money was conserved.
Each round's balances go to a Delta table through Spark; the first round is read back by time
travel, from Spark and from delta-rs, and Spark's Kafka source counts the input topic.
"""

from __future__ import annotations

import random
import signal
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
from epochal.analytics.spark import spark_session
from epochal.config import CacheConfig, KafkaConfig, SparkConfig
from epochal.errors import EpochalError
from epochal.jvm import JarSet, fetch_jars
from epochal.log.client import KafkaClients
from epochal.log.command_log import KafkaCommandLog
from epochal.log.local_broker import LocalBroker
from epochal.recovery.replay import replay_command_log

__all__ = ["run_demo"]

ACCOUNTS = 500
OPENING = 1_000
TRANSFERS_PER_ROUND = 10_000


def run_demo(cache: CacheConfig, broker: LocalBroker, warehouse: Path, console: Console) -> int:
    """Run the demo; stops the broker at the end only if this run started it."""
    with console.status("fetching jars (first run only)"):
        for jar_set in JarSet:
            fetch_jars(cache, jar_set)
    with console.status(f"starting Kafka on {broker.config.bootstrap}"):
        started = broker.start()
    console.print(
        f"[green]✓[/] Kafka at {broker.config.bootstrap}"
        + ("" if started else " (already running)")
    )
    try:
        return _Demo(cache, broker.config.bootstrap, warehouse.resolve(), console).run()
    finally:
        if started:
            broker.stop()


class _Demo:
    def __init__(
        self, cache: CacheConfig, bootstrap: str, warehouse: Path, console: Console
    ) -> None:
        self.cache = cache
        self.bootstrap = bootstrap
        self.clients = KafkaClients(KafkaConfig(bootstrap))
        self.console = console
        self.name = f"bank-demo-{time.strftime('%Y%m%d-%H%M%S')}"
        self.warehouse = warehouse
        self.table = warehouse / "bank" / "state" / "Account"
        self.app = load_app("examples.bank.app:app", self.name)
        self.accounts = [f"acct-{i * 10_000 // ACCOUNTS:04d}" for i in range(ACCOUNTS)]
        self.rng = random.Random(7)
        self.egress_seen = 0

    def run(self) -> int:
        egress = [self.app.topics.egress(name) for name in ("receipts", "errors")]
        self.clients.create_topics(egress)
        consumers = [
            self.clients.assigned_consumer(topic, {0: 0}, **{"isolation.level": "read_committed"})
            for topic in egress
        ]
        cluster = self._start_cluster()
        try:
            with self.console.status("starting Spark"):
                jars = self.cache.jar_dir(JarSet.SPARK.value)
                spark = spark_session(SparkConfig(jar_dir=jars, app_name="epochal-demo"))
            rounds = [self._round(spark, consumers, number) for number in (1, 2)]
        finally:
            for consumer in consumers:
                consumer.close()
            cluster.send_signal(signal.SIGTERM)
            cluster.wait(60)
        return self._report(spark, rounds)

    def _start_cluster(self) -> subprocess.Popen[bytes]:
        run_dir = Path(tempfile.mkdtemp(prefix="epochal-demo-"))
        command = [sys.executable, "-m", "epochal.cli", "run", "examples.bank.app:app",
                   "--name", self.name, "--bootstrap", self.bootstrap, "--workers", "2",
                   "--run-dir", str(run_dir), "--warehouse", str(self.warehouse)]  # fmt: skip
        log = open(run_dir / "cluster.log", "wb")  # noqa: SIM115 - the child keeps it open
        cluster = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        self.console.print(
            f"[green]✓[/] epochal run examples.bank.app:app as {self.name!r}: 2 workers, "
            f"4 partitions (log: {run_dir / 'cluster.log'})"
        )
        return cluster

    def _produce(self, with_deposits: bool) -> None:
        """Like any client: msgpack, and every tenth record as JSON."""
        from examples.bank.producer import Deposit, Transfer

        producer = self.clients.producer(**{"linger.ms": 5})
        topic = self.app.topics.input("transfers")
        events: list[Any] = [Deposit(a, OPENING) for a in self.accounts] if with_deposits else []
        for _ in range(TRANSFERS_PER_ROUND):
            source, target = self.rng.sample(self.accounts, 2)
            events.append(Transfer(source, target, self.rng.randrange(1, OPENING // 2)))
        for i, event in enumerate(events):
            encode = msgspec.json.encode if i % 10 == 0 else msgspec.msgpack.encode
            producer.produce(topic, encode(event))
        producer.flush(30)

    def _wait_for_egress(self, consumers: list[Any], expected: int) -> float:
        """Count receipts and abort reports (read_committed) until every transfer has one."""
        started = time.monotonic()
        with Progress(console=self.console, transient=True) as progress:
            task = progress.add_task("transfers through the cluster", total=expected)
            while self.egress_seen < expected:
                if time.monotonic() - started > 120:
                    raise EpochalError("the cluster did not process the transfers in 120 s")
                for consumer in consumers:
                    self.egress_seen += len(consumer.consume(10_000, 0.1))
                progress.update(task, completed=self.egress_seen)
        return time.monotonic() - started

    def _round(self, spark: SparkSession, consumers: list[Any], number: int) -> dict[str, Any]:
        from examples.bank.app import Account

        self._produce(with_deposits=number == 1)
        seconds = self._wait_for_egress(consumers, number * TRANSFERS_PER_ROUND)
        with self.console.status("replaying the command log"):
            logged = KafkaCommandLog(self.clients, self.app.topics.command_log).epochs(to_end=True)
            engine, epochs = replay_command_log(self.app, logged)
        balances = {
            str(ref.key): value.balance
            for ref, value in engine.items()
            if isinstance(value, Account)
        }
        frame = spark.createDataFrame(sorted(balances.items()), "account string, balance long")
        frame.write.format("delta").mode("overwrite").save(str(self.table))
        from deltalake import DeltaTable

        version = DeltaTable(str(self.table)).version()
        self.console.print(
            f"[green]✓[/] round {number}: {TRANSFERS_PER_ROUND:,} transfers through Kafka and "
            f"the cluster in {seconds:.1f} s, each with one receipt or abort report; "
            f"{epochs} epochs replayed; Delta version {version}"
        )
        return {"balances": balances, "version": version}

    def _report(self, spark: SparkSession, rounds: list[dict[str, Any]]) -> int:
        from deltalake import DeltaTable

        first = rounds[0]
        reader = spark.read.format("delta").option("versionAsOf", first["version"])
        by_spark = {r["account"]: r["balance"] for r in reader.load(str(self.table)).collect()}
        columns = (
            DeltaTable(str(self.table), version=first["version"]).to_pyarrow_table().to_pydict()
        )
        by_delta_rs = dict(zip(columns["account"], columns["balance"], strict=True))
        kafka = spark.read.format("kafka").option("kafka.bootstrap.servers", self.bootstrap)
        inputs = kafka.option("subscribe", self.app.topics.input("transfers")).load().count()

        table = Table(title=f"balances ({ACCOUNTS} accounts, first 8)")
        for column in ("account", "after round 1 (time travel, Spark)", "after round 2"):
            table.add_column(column)
        for account in self.accounts[:8]:
            table.add_row(account, str(by_spark.get(account)), str(rounds[-1]["balances"][account]))
        self.console.print(table)
        checks = {
            "money conserved in every round": all(
                sum(r["balances"].values()) == ACCOUNTS * OPENING for r in rounds
            ),
            "no account overdrawn": all(min(r["balances"].values()) >= 0 for r in rounds),
            "time travel: Spark and delta-rs read round 1 back": by_spark
            == by_delta_rs
            == first["balances"],
            "Spark's Kafka source sees every input record": inputs
            == ACCOUNTS + 2 * TRANSFERS_PER_ROUND,
        }
        for check, ok in checks.items():
            self.console.print(f"{'[green]✓' if ok else '[red]✗'}[/] {check}")
        ok = all(checks.values())
        self.console.print("[green]✓ demo finished[/]" if ok else "[red]✗ demo found a problem[/]")
        return 0 if ok else 1
