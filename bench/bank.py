"""Bank transfers through Kafka, end to end, on 1 and on 2 workers, side by side in one run.

Deposits and transfers are produced first (so that the producer does not compete for the two
cores), then ``epochal run examples.bank.app:app`` is started and the benchmark counts the
transfers' egress records (receipts and abort reports, ``read_committed``) until all are out:
every run drains a backlog. Throughput = transfers / (time of the last egress record - time of
the first one); each configuration runs ``--repeats`` times, interleaved, and the median is
reported, with the rollbacks each run needed (its last generation - 1) and the peak memory
(RSS) of its supervisor, sequencer and workers, sampled every second.

    python -m bench.bank --transfers 200000 --workers 1 2
    python -m bench.bank --transfers 100000 --workers 1 --checkouts ../baseline .   # before/after
    python -m bench.bank --transfers 1000000 --workers 1 --repeats 1               # a big backlog

``--checkouts`` runs the cluster of each given checkout of epochal (its package and examples),
interleaved with the others, to compare two versions side by side on one broker.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from epochal.config import CacheConfig, KafkaConfig, LocalBrokerConfig, cache_dir_from_env
from epochal.jvm import JarSet, fetch_jars
from epochal.log.client import KafkaClients
from epochal.log.local_broker import LocalBroker
from examples.bank.producer import Deposit, events

console = Console()
ROOT = Path(__file__).resolve().parent.parent


def _produce(bootstrap: str, topic: str, transfers: int, accounts: int) -> None:
    import msgspec

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000})
    for event in events(transfers, accounts, seed=1):
        key = event.account if isinstance(event, Deposit) else event.source
        while True:
            try:
                producer.produce(topic, msgspec.msgpack.encode(event), key.encode())
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0


def _count_egress(
    clients: KafkaClients, name: str, transfers: int, progress: Progress
) -> tuple[float, float]:
    consumer = clients.consumer(
        **{"isolation.level": "read_committed", "group.id": f"{name}.bench"}
    )
    from confluent_kafka import TopicPartition

    consumer.assign([TopicPartition(f"{name}.out.{t}", 0, 0) for t in ("receipts", "errors")])
    task = progress.add_task(f"{name}", total=transfers)
    seen, first, last = 0, 0.0, 0.0
    deadline = time.monotonic() + 600
    while seen < transfers and time.monotonic() < deadline:
        batch = consumer.consume(10_000, 0.2)
        if batch:
            now = time.monotonic()
            first = first or now
            last = now
            seen += sum(1 for m in batch if m.error() is None)
            progress.update(task, completed=seen)
    consumer.close()
    if seen < transfers:
        raise SystemExit(f"only {seen} of {transfers} transfers came out")
    return first, last


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class RssSampler(threading.Thread):
    """Samples the RSS of a run's processes (from its status file) every ``interval_s``: the
    peak per role, and the whole series."""

    def __init__(self, status_file: Path, interval_s: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.status_file = status_file
        self.interval_s = interval_s
        self.peak: dict[str, float] = {}
        self.series: list[tuple[float, dict[str, float]]] = []
        self.generation = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        started = time.monotonic()
        while not self.stopping.wait(self.interval_s):
            try:
                status = json.loads(self.status_file.read_text())
            except (OSError, ValueError):
                continue
            self.generation = int(status.get("generation", 0))
            roles = {"supervisor": status["supervisor"], "sequencer": status["sequencer"]}
            roles |= {f"worker{w}": pid for w, pid in enumerate(status["workers"])}
            sample = {role: _rss_mb(int(pid)) for role, pid in roles.items() if pid}
            self.series.append((time.monotonic() - started, sample))
            for role, mb in sample.items():
                self.peak[role] = max(self.peak.get(role, 0.0), mb)


def run_once(
    bootstrap: str,
    workers: int,
    transfers: int,
    accounts: int,
    port_base: int,
    *,
    checkout: Path = ROOT,
) -> dict[str, Any]:
    name = f"bench{workers}w{uuid.uuid4().hex[:6]}"
    clients = KafkaClients(KafkaConfig(bootstrap))
    clients.create_topics([f"{name}.in.transfers"])
    _produce(bootstrap, f"{name}.in.transfers", transfers, accounts)
    run_dir = Path(tempfile.mkdtemp(prefix="epochal-bench-"))
    command = [
        sys.executable, "-m", "epochal.cli", "run", "examples.bank.app:app", "--name", name,
        "--bootstrap", bootstrap, "--workers", str(workers), "--partitions", str(2 * workers),
        "--port-base", str(port_base), "--run-dir", str(run_dir),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    sampler = RssSampler(run_dir / name / "processes.json")
    with open(run_dir / "run.log", "wb") as log:
        started = time.monotonic()
        process = subprocess.Popen(
            command, cwd=checkout, env=env, stdout=log, stderr=subprocess.STDOUT
        )
        sampler.start()
        try:
            clients.create_topics([f"{name}.out.receipts", f"{name}.out.errors"])
            with Progress(console=console, transient=True) as progress:
                first, last = _count_egress(clients, name, transfers, progress)
        finally:
            sampler.stopping.set()
            process.send_signal(signal.SIGTERM)
            process.wait(60)
    return {
        "checkout": str(checkout),
        "workers": workers,
        "partitions": 2 * workers,
        "transfers": transfers,
        "seconds": last - first,
        "tps": transfers / (last - first),
        "seconds_from_start": last - started,
        "rollbacks": max(0, sampler.generation - 1),
        "peak_rss_mb": sampler.peak,
    }


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median run by throughput, with every run's throughput and rollbacks beside it."""
    ordered = sorted(runs, key=lambda r: r["tps"])
    return {
        **ordered[len(ordered) // 2],
        "tps_runs": [r["tps"] for r in runs],
        "rollbacks_runs": [r["rollbacks"] for r in runs],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transfers", type=int, default=200_000)
    parser.add_argument("--accounts", type=int, default=10_000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3, help="runs per configuration (median)")
    parser.add_argument(
        "--bootstrap", help="an existing broker (default: a local one for this run)"
    )
    parser.add_argument("--port", type=int, default=19792, help="port of the local broker")
    parser.add_argument("--out", default="bench/results", help="where the JSON goes")
    parser.add_argument(
        "--checkouts", nargs="+", type=Path, default=[ROOT],
        help="epochal checkouts whose clusters to compare (default: this one)",
    )  # fmt: skip
    args = parser.parse_args()

    broker = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        cache = CacheConfig(cache_dir_from_env())
        jars = fetch_jars(cache, JarSet.KAFKA_BROKER)
        broker = LocalBroker(
            LocalBrokerConfig(port=args.port, data_dir=Path(tempfile.mkdtemp()), jar_dir=jars)
        )
        broker.start()
        bootstrap = broker.config.bootstrap
    configurations = [(c.resolve(), w) for c in args.checkouts for w in args.workers]
    try:
        runs: dict[tuple[Path, int], list[dict[str, Any]]] = {c: [] for c in configurations}
        for repeat in range(args.repeats):  # interleaved, so drift hits every configuration
            for i, (checkout, w) in enumerate(configurations):
                port = 7700 + 10 * i + 100 * repeat
                runs[checkout, w].append(
                    run_once(bootstrap, w, args.transfers, args.accounts, port, checkout=checkout)
                )
        results = [_median(r) for r in runs.values()]
    finally:
        if broker is not None:
            broker.stop()
    table = Table(title=f"bank transfers end to end through Kafka ({args.transfers:,} transfers)")
    columns = ("checkout", "workers", "partitions", "tx/s (median)", "ratio", "runs", "rollbacks")
    for column in columns:
        table.add_column(column, justify="right")
    for r in results:
        runs_text = ", ".join(f"{t:,.0f}" for t in r["tps_runs"])
        table.add_row(
            Path(r["checkout"]).name, str(r["workers"]), str(r["partitions"]),
            f"{r['tps']:,.0f}", f"{r['tps'] / results[0]['tps']:.2f}x", runs_text,
            ", ".join(map(str, r["rollbacks_runs"])),
        )  # fmt: skip
    console.print(table)
    for r in results:
        rss = ", ".join(f"{role} {mb:.0f}" for role, mb in sorted(r["peak_rss_mb"].items()))
        console.print(f"peak RSS MB ({Path(r['checkout']).name}, {r['workers']} workers): {rss}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "bench": "bank",
        "machine": platform.node(),
        "cpus": __import__("os").cpu_count(),
        "results": results,
    }
    path = out / f"bank-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=2))
    console.print(f"results in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
