"""The demo behind the README's first command, on a local broker, local Spark and a warehouse.

At this stage it is a smoke run of the foundation: deposits go to Kafka inside a transaction
(msgpack, and a few in JSON as another client would send them), come back to a ``read_committed``
consumer, are counted by Spark through the Kafka source, and the balances are written to a Delta
table twice, the first version read back by time travel from Spark and from delta-rs.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import msgspec
from pyspark.sql import SparkSession
from rich.console import Console
from rich.table import Table

from epochal.analytics.spark import spark_session
from epochal.config import CacheConfig, KafkaConfig, SparkConfig
from epochal.errors import LogError
from epochal.jvm import JarSet, fetch_jars
from epochal.log.client import KafkaClients
from epochal.log.local_broker import LocalBroker
from epochal.log.topics import TopicNames
from epochal.schemas.codec import decode, encode

__all__ = ["Deposit", "run_demo"]

APP = "demo"
ROUNDS = 2
DEPOSITS_PER_ROUND = 10_000
ACCOUNTS = 20


class Deposit(msgspec.Struct, frozen=True):
    """One deposit event on ``demo.in.deposits``."""

    account: str
    amount: int


def _deposits(rng: random.Random) -> list[Deposit]:
    return [
        Deposit(f"acct-{rng.randrange(ACCOUNTS):02d}", rng.randrange(1, 100))
        for _ in range(DEPOSITS_PER_ROUND)
    ]


def _produce_round(clients: KafkaClients, topic: str, deposits: list[Deposit]) -> None:
    """All deposits of a round in one Kafka transaction; every tenth as JSON."""
    producer = clients.producer(**{"transactional.id": f"{APP}.producer", "linger.ms": 5})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i, deposit in enumerate(deposits):
        value = msgspec.json.encode(deposit) if i % 10 == 0 else encode(deposit)
        producer.produce(topic, value=value, key=deposit.account.encode())
    producer.commit_transaction(30)


def _consume(clients: KafkaClients, topic: str, start: int, count: int) -> list[Deposit]:
    consumer = clients.assigned_consumer(topic, {0: start}, **{"isolation.level": "read_committed"})
    out: list[Deposit] = []
    try:
        while len(out) < count:
            batch = consumer.consume(num_messages=count - len(out), timeout=10.0)
            if not batch:
                raise LogError("timed out reading back deposits", topic=topic, got=len(out))
            out.extend(decode(m.value() or b"", Deposit) for m in batch if m.error() is None)
    finally:
        consumer.close()
    return out


def _balances(deposits: list[Deposit]) -> dict[str, int]:
    totals: Counter[str] = Counter()
    for deposit in deposits:
        totals[deposit.account] += deposit.amount
    return dict(sorted(totals.items()))


def run_demo(cache: CacheConfig, broker: LocalBroker, warehouse: Path, console: Console) -> int:
    """Run the smoke demo; stops the broker at the end only if this run started it."""
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
        clients = KafkaClients(KafkaConfig(broker.config.bootstrap))
        with console.status("starting Spark"):
            spark = spark_session(
                SparkConfig(jar_dir=cache.jar_dir(JarSet.SPARK.value), app_name="epochal-demo")
            )
        return _run(clients, spark, warehouse.resolve() / APP / "state" / "Balance", console)
    finally:
        if started:
            broker.stop()


def _write_balances(spark: SparkSession, table: Path, balances: dict[str, int]) -> None:
    frame = spark.createDataFrame(list(balances.items()), "account string, balance long")
    frame.write.format("delta").mode("overwrite").save(str(table))


def _kafka_count(spark: SparkSession, bootstrap: str, topic: str) -> int:
    reader = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("kafka.isolation.level", "read_committed")
        .option("subscribe", topic)
    )
    return int(reader.load().count())


def _version_0(spark: SparkSession, table: Path) -> tuple[dict[str, int], dict[str, int]]:
    """Version 0 of the table as Spark and as delta-rs read it."""
    from deltalake import DeltaTable

    rows = spark.read.format("delta").option("versionAsOf", 0).load(str(table)).collect()
    by_spark = {row["account"]: row["balance"] for row in rows}
    columns = DeltaTable(str(table), version=0).to_pyarrow_table().to_pydict()
    by_delta_rs = dict(zip(columns["account"], columns["balance"], strict=True))
    return by_spark, by_delta_rs


def _run(clients: KafkaClients, spark: SparkSession, table: Path, console: Console) -> int:
    topic = TopicNames(APP).input("deposits")
    clients.create_topics([topic])
    rng = random.Random(7)
    seen: list[Deposit] = []
    versions: list[dict[str, int]] = []
    for round_no in range(ROUNDS):
        start = clients.end_offset(topic)
        with console.status(f"round {round_no}: {DEPOSITS_PER_ROUND:,} deposits, one transaction"):
            _produce_round(clients, topic, _deposits(rng))
            seen.extend(_consume(clients, topic, start, DEPOSITS_PER_ROUND))
        versions.append(_balances(seen))
        _write_balances(spark, table, versions[-1])
        console.print(
            f"[green]✓[/] round {round_no}: {len(seen):,} deposits read back with read_committed, "
            f"Delta version {round_no} written"
        )
    by_spark, by_delta_rs = _version_0(spark, table)
    report = Table(title=f"Delta table {table}")
    for column in ("account", "v0 by Spark", "v0 by delta-rs", "now"):
        report.add_column(column)
    for account, now in versions[-1].items():
        report.add_row(account, str(by_spark.get(account)), str(by_delta_rs.get(account)), str(now))
    console.print(report)
    in_kafka = _kafka_count(spark, clients.config.bootstrap_servers, topic)
    console.print(f"Spark's Kafka source reads {in_kafka:,} records in {topic} (every demo run)")
    ok = by_spark == versions[0] == by_delta_rs
    console.print(
        "[green]✓ demo finished[/]" if ok else "[red]✗ time travel gave other balances[/]"
    )
    return 0 if ok else 1
