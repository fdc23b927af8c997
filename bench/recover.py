"""Strong recovery, side by side in one run: the in-engine serial replay (``replay_command_log``)
and the Spark job (``recover_strong``) at ``local[1]`` and ``local[2]``.

The command log is written straight to Kafka in the sequencer's format (each epoch's chunks in
one Kafka transaction, ordered by the sequencer's own :func:`order`), with the snapshot a worker
would take at the end of epoch 0 (a deposit into every account), rather than by running a
cluster for minutes. The workload partitions well: accounts sit in branches, and a transfer
stays within its branch, so every branch is a key group of its own.

    python -m bench.recover --transactions 1000000 --repeats 3
    python -m bench.recover --transactions 100000 --masters "local[2]"

Each Spark run recovers in place into a fresh copy of the warehouse (the snapshot at epoch 0),
so every repeat replays the whole log. Rates are transactions replayed per second of wall time,
the median of ``--repeats``; the Spark figures include reading the log and the state, grouping,
replaying and committing the snapshot, not starting the session. Results go to
``bench/results/recover-<time>.json`` and a PNG beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import json
import platform
import random
import shutil
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console
from rich.table import Table

from bench.scratch import broker_unless, cleans_up, scratch_dir
from epochal.actors.api import App
from epochal.actors.context import Context
from epochal.actors.engine import Engine
from epochal.actors.snapshots import with_log_position
from epochal.config import (
    CacheConfig,
    KafkaConfig,
    SnapshotConfig,
    SparkConfig,
    cache_dir_from_env,
)
from epochal.jvm import JarSet, fetch_jars
from epochal.log.client import FOREVER, KafkaClients
from epochal.log.command_log import DEFAULT_CHUNK_BYTES, KafkaCommandLog, chunk_epoch
from epochal.log.ordering import EpochStamp, order
from epochal.recovery.replay import replay_command_log
from epochal.recovery.snapshots import DeltaSnapshots
from epochal.schemas.codec import encode
from epochal.schemas.commands import EpochRecord, InputRecord
from epochal.schemas.snapshots import Manifest

__all__ = [
    "Census",
    "Deposit",
    "Transfer",
    "app",
    "branch_log",
    "fee_app",
    "log_epochs",
    "snapshot_log",
    "transfer_with_fee",
    "with_handler",
]

console = Console()
APP_SPEC = "bench.recover:app"

app = App("branches")


@app.actor(key=int, constraints={"balance >= 0": lambda a: a.balance >= 0})
class Account(msgspec.Struct):
    balance: int = 0
    transfers: int = 0


class Deposit(msgspec.Struct, frozen=True, tag=True):
    account: int
    amount: int


class Transfer(msgspec.Struct, frozen=True, tag=True):
    source: int
    target: int
    amount: int


class Census(msgspec.Struct, frozen=True, tag=True):
    """Counts the transfers of one account per branch: its key set links every branch."""

    accounts: list[int]


@app.transaction(topic="ops", event=Deposit, keys=lambda e: {Account: [e.account]})
def deposit(ctx: Context, e: Deposit) -> None:
    account = ctx.get(Account, e.account)
    account.balance += e.amount
    ctx.put(e.account, account)


@app.transaction(topic="ops", event=Transfer, keys=lambda e: {Account: [e.source, e.target]})
def transfer(ctx: Context, e: Transfer) -> None:
    source, target = ctx.get(Account, e.source), ctx.get(Account, e.target)
    source.balance -= e.amount  # may break balance >= 0: then the transfer aborts
    target.balance += e.amount
    source.transfers += 1
    ctx.put(e.source, source)
    ctx.put(e.target, target)


@app.transaction(topic="ops", event=Census, keys=lambda e: {Account: e.accounts})
def census(ctx: Context, e: Census) -> None:
    for key in e.accounts:
        account = ctx.get(Account, key)
        account.transfers += 1
        ctx.put(key, account)


def transfer_with_fee(ctx: Context, e: Transfer) -> None:
    """A "corrected" transfer, for replays ``into`` a namespace: the target gets the amount less
    a fee of 1."""
    source, target = ctx.get(Account, e.source), ctx.get(Account, e.target)
    source.balance -= e.amount
    target.balance += e.amount - 1
    source.transfers += 1
    ctx.put(e.source, source)
    ctx.put(e.target, target)


def with_handler(base: App, name: str, fn: Callable[..., Any]) -> App:
    """``base`` (its name, actors and handlers) with the handler ``name`` running ``fn``."""
    changed = App(base.name)
    for t in base.actor_types.values():
        changed.actor(key=t.key_type, constraints=t.constraints, key_sample=t.key_sample,
                      name=t.name)(t.state)  # fmt: skip
    for h in base.handlers.values():
        if h.name in changed.handlers:  # built in: every App has it (epochal.read)
            continue
        register = changed.transaction(
            event=h.event, keys=h.keys, topic=h.topic, client=h.client, aborts_to=h.aborts_to,
            name=h.name,
        )  # fmt: skip
        register(fn if h.name == name else h.fn)
    return changed


fee_app = with_handler(app, "transfer", transfer_with_fee)


def branch_log(
    named: App,
    transactions: int,
    accounts: int,
    branches: int,
    *,
    per_epoch: int = 5000,
    seed: int = 1,
    opening: int = 1000,
    snapshot_every: int = 0,
    census_at: int | None = None,
) -> list[EpochRecord]:
    """Epoch 0 deposits ``opening`` into every account (marked for a snapshot), then transfers
    within branches, ``per_epoch`` an epoch; every ``snapshot_every``-th epoch is marked too;
    a census of every branch as transaction number ``census_at``, if given."""
    rng = random.Random(seed)
    size = accounts // branches
    events: list[object] = []
    for i in range(transactions):
        if i == census_at:
            events.append(Census([b * size for b in range(branches)]))
            continue
        branch = rng.randrange(branches) * size
        events.append(Transfer(branch + rng.randrange(size), branch + rng.randrange(size),
                               rng.randrange(1, 50)))  # fmt: skip
    batches: list[list[object]] = [[Deposit(a, opening) for a in range(accounts)]]
    batches += [events[i : i + per_epoch] for i in range(0, len(events), per_epoch)]
    topic, code_hash = named.topics.input("ops"), named.code_hash()
    records, offset, positions = [], 0, dict[str, int]()
    for epoch, batch in enumerate(batches):
        inputs = [InputRecord(topic, 0, offset + i, encode(e)) for i, e in enumerate(batch)]
        offset += len(batch)
        marked = epoch == 0 or (snapshot_every > 0 and epoch % snapshot_every == 0)
        stamp = EpochStamp(epoch, 1_700_000_000_000 + 20 * epoch, seed * 7919 + epoch, code_hash,
                           marked)  # fmt: skip
        record = order(named, stamp, inputs, positions=positions).record
        positions = record.next_offsets
        records.append(record)
    return records


def log_epochs(
    clients: KafkaClients,
    topic: str,
    records: Sequence[EpochRecord],
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> list[int]:
    """Append epochs to a command-log topic as the sequencer does (each in one Kafka
    transaction, in chunks of ``chunk_bytes``); returns each epoch's position (the offset of
    its final chunk)."""
    clients.create_topics([topic], config={"retention.ms": str(FOREVER)})
    producer = clients.producer(**{"transactional.id": f"{topic}.writer", "linger.ms": 5})
    producer.init_transactions(30)
    positions: list[int] = []
    for record in records:
        finals: list[int] = []

        def delivered(error: object, message: Any, out: list[int] = finals) -> None:
            out.append(message.offset())

        producer.begin_transaction()
        for chunk in chunk_epoch(record, chunk_bytes):
            producer.produce(topic, chunk, on_delivery=delivered)
        producer.commit_transaction(60)
        positions.append(max(finals))
    return positions


def snapshot_log(
    named: App,
    config: SnapshotConfig,
    records: Sequence[EpochRecord],
    positions: Sequence[int],
    until: int,
) -> list[Manifest]:
    """The snapshots a one-worker cluster would have taken at the marked epochs up to ``until``
    (each archiving the epochs it closes)."""
    snapshots = DeltaSnapshots(named, config, partitions=1)
    snapshots.ensure_tables(named.code_hash())
    engine = Engine(named, 1, snapshots=True)
    manifests, since = [], []

    async def run() -> None:
        for record, position in zip(records, positions, strict=True):
            if record.epoch > until:
                return
            result = await engine.run_epoch(record)
            since.append(record)
            if result.changes is not None:
                part = snapshots.write(record.epoch, 0, result.changes, commands=since,
                                       reported=engine.take_reported())  # fmt: skip
                since.clear()
                part = with_log_position(part, record, position + 1, engine.carried)
                manifests.append(snapshots.commit([part], record.epoch))

    asyncio.run(run())
    return manifests


# --- the benchmark ------------------------------------------------------------------------------


def _in_engine(named: App, clients: KafkaClients, config: SnapshotConfig) -> dict[str, Any]:
    started = time.perf_counter()
    restored = DeltaSnapshots(named, config, 1).restore()
    assert restored is not None
    logged = KafkaCommandLog(clients, named.topics.command_log).epochs(
        restored.manifest.command_log_position, to_end=True
    )
    engine, epochs = replay_command_log(named, logged, restored=restored)
    return {"seconds": time.perf_counter() - started, "digest": engine.digest(), "epochs": epochs}


def _spark_runs(
    master: str, cache: CacheConfig, named: App, kafka: KafkaConfig, *, warehouse: Path,
    repeats: int, work: Path,
) -> list[dict[str, Any]]:  # fmt: skip
    from epochal.analytics.spark import spark_session
    from epochal.recovery.spark_recovery import recover_strong

    config = SparkConfig(jar_dir=cache.jar_dir(JarSet.SPARK.value), master=master,
                         app_name="epochal-bench-recover", work_dir=work / "spark",
                         driver_memory="2g")  # fmt: skip
    spark = spark_session(config)
    runs = []
    try:
        for repeat in range(repeats):
            copy = work / f"warehouse-{uuid.uuid4().hex[:8]}"
            shutil.copytree(warehouse, copy)
            started = time.perf_counter()
            report = recover_strong(APP_SPEC, named.name, SnapshotConfig(str(copy)), spark,
                                    kafka=kafka)  # fmt: skip
            seconds = time.perf_counter() - started
            runs.append({
                "seconds": seconds, "digest": report.digest, "tasks": report.tasks,
                "groups": report.groups, "ordered_reason": report.ordered_reason,
            })  # fmt: skip
            console.print(f"  {master} run {repeat + 1}: {seconds:.1f} s, {report.tasks} tasks")
            shutil.rmtree(copy)
    finally:
        spark.stop()
    return runs


def _summary(name: str, runs: list[dict[str, Any]], transactions: int) -> dict[str, Any]:
    seconds = statistics.median(r["seconds"] for r in runs)
    return {
        "how": name, "seconds": seconds, "tps": transactions / seconds,
        "seconds_runs": [r["seconds"] for r in runs],
        "digests": sorted({r["digest"] for r in runs}), "tasks": runs[0].get("tasks"),
    }  # fmt: skip


def _plot(results: list[dict[str, Any]], transactions: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    names = [r["how"] for r in results]
    bars = axis.bar(names, [r["tps"] for r in results], color=["#888", "#4a7ebb", "#2e5c8a"])
    for bar, r in zip(bars, results, strict=True):
        top = (bar.get_x() + bar.get_width() / 2, bar.get_height())
        label = f"{r['tps']:,.0f}/s\n{r['seconds']:.1f} s"
        axis.annotate(label, top, ha="center", va="bottom", fontsize=9)
    axis.set_ylabel("transactions replayed per second")
    axis.set_title(f"strong recovery of {transactions:,} transactions (median)")
    axis.margins(y=0.2)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def _report(results: list[dict[str, Any]], args: argparse.Namespace) -> int:
    """The table on the console, the JSON and the plot; 1 if the digests differ."""
    agree = len({d for r in results for d in r["digests"]}) == 1
    table = Table(title=f"strong recovery of {args.transactions:,} transactions "
                        f"({args.branches} branches, {args.accounts:,} accounts)")  # fmt: skip
    for column in ("how", "tx/s (median)", "wall s (median)", "runs (s)", "tasks"):
        table.add_column(column, justify="right")
    for r in results:
        runs_text = ", ".join(f"{s:.1f}" for s in r["seconds_runs"])
        table.add_row(r["how"], f"{r['tps']:,.0f}", f"{r['seconds']:.1f}", runs_text,
                      str(r["tasks"] or "-"))  # fmt: skip
    console.print(table)
    console.print(f"digests {'all equal' if agree else 'DIFFER'}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    report = {"bench": "recover", "machine": platform.node(), "args": vars(args),
              "digests_agree": agree, "results": results}  # fmt: skip
    (out / f"recover-{stamp}.json").write_text(json.dumps(report, indent=2))
    _plot(results, args.transactions, out / f"recover-{stamp}.png")
    console.print(f"results in {out}/recover-{stamp}.json and .png")
    return 0 if agree else 1


@cleans_up
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transactions", type=int, default=1_000_000)
    parser.add_argument("--accounts", type=int, default=100_000)
    parser.add_argument("--branches", type=int, default=1000)
    parser.add_argument("--per-epoch", type=int, default=5000, help="transactions an epoch")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each (median)")
    parser.add_argument("--masters", nargs="+", default=["local[1]", "local[2]"])
    parser.add_argument("--port", type=int, default=19592, help="port of the local broker")
    parser.add_argument("--out", default="bench/results", help="where the JSON and PNG go")
    args = parser.parse_args(argv)

    cache = CacheConfig(cache_dir_from_env())
    fetch_jars(cache, JarSet.SPARK)
    work = scratch_dir("recover-")
    # the app as executors import it (bench.recover, not __main__: the code hash names modules)
    workload = importlib.import_module(APP_SPEC.partition(":")[0])
    named = dataclasses.replace(workload.app, name=f"recover{int(time.time())}")
    with broker_unless(None, args.port) as broker:
        kafka = KafkaConfig(broker.bootstrap)
        clients = KafkaClients(kafka)
        with console.status(f"writing a command log of {args.transactions:,} transactions"):
            records = branch_log(named, args.transactions, args.accounts, args.branches,
                                 per_epoch=args.per_epoch)  # fmt: skip
            positions = log_epochs(clients, named.topics.command_log, records)
            warehouse = work / "warehouse"
            snapshot_log(named, SnapshotConfig(str(warehouse)), records, positions, until=0)
        console.print(f"{len(records)} epochs logged; the snapshot is at epoch 0")
        serial = []
        for repeat in range(args.repeats):
            serial.append(_in_engine(named, clients, SnapshotConfig(str(warehouse))))
            console.print(f"  in-engine run {repeat + 1}: {serial[-1]['seconds']:.1f} s")
        results = [_summary("in-engine serial", serial, args.transactions)]
        for master in args.masters:
            runs = _spark_runs(master, cache, named, kafka, warehouse=warehouse,
                               repeats=args.repeats, work=work)  # fmt: skip
            results.append(_summary(f"Spark {master}", runs, args.transactions))
    return _report(results, args)


if __name__ == "__main__":
    sys.exit(main())
