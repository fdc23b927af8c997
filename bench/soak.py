"""A long run at a steady rate: does any process's memory grow with uptime?

Starts ``epochal run examples.bank.app:app``, feeds it transfers at ``--rate`` per second for
``--seconds`` (with idle pauses, so that idle time counts too), samples the RSS of the
supervisor, the sequencer and every worker every ``--every`` seconds, and checks at the end that
every transfer has its receipt or abort report. It reports, per process, the RSS after the
warm-up, at the end and at its peak, and the JSON has the whole series.

    python -m bench.soak --seconds 600 --rate 3000
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import msgspec
from confluent_kafka import Producer
from rich.console import Console
from rich.table import Table

from bench.bank import ROOT
from bench.processes import RssSampler
from bench.scratch import broker_unless, cleans_up, scratch_dir
from epochal.config import KafkaConfig
from epochal.interrupts import interrupts_held
from epochal.log.client import KafkaClients
from examples.bank.producer import Transfer, events

console = Console()


def _feed(bootstrap: str, topic: str, rate: int, seconds: float, stop: threading.Event) -> int:
    """Deposits, then transfers, at ``rate`` records per second in bursts every 100 ms; after
    two minutes, every other minute is idle. Returns the transfers sent."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    source = events(10**9, 10_000, seed=3)
    sent, started = 0, time.monotonic()
    while not stop.is_set() and (elapsed := time.monotonic() - started) < seconds:
        if int(elapsed // 60) % 2 == 1 and elapsed > 120:  # idle minutes after the warm-up
            time.sleep(0.1)
            continue
        for _ in range(rate // 10):
            event = next(source)
            producer.produce(topic, msgspec.msgpack.encode(event))
            sent += isinstance(event, Transfer)
        producer.poll(0)
        time.sleep(max(0.0, 0.1 - (time.monotonic() - started - elapsed)))
    assert producer.flush(60) == 0
    return sent


def _outputs(clients: KafkaClients, name: str) -> int:
    total = 0
    for suffix in ("receipts", "errors"):
        consumer = clients.assigned_consumer(
            f"{name}.out.{suffix}", {0: 0}, **{"isolation.level": "read_committed"}
        )
        while batch := consumer.consume(10_000, 2.0):
            total += sum(1 for m in batch if m.error() is None)
        consumer.close()
    return total


def _report(args: argparse.Namespace, sampler: RssSampler, sent: int, out: int) -> None:
    warm = [s for t, s in sampler.series if t >= args.warmup] or [s for _, s in sampler.series]
    table = Table(title=f"RSS MB over {args.seconds:.0f} s at {args.rate}/s ({sent:,} transfers)")
    for column in ("process", "after warm-up", "at the end", "peak"):
        table.add_column(column, justify="right")
    for role in sorted(warm[-1]) if warm else []:
        table.add_row(role, f"{warm[0].get(role, 0):.0f}", f"{warm[-1].get(role, 0):.0f}",
                      f"{max(s.get(role, 0) for s in warm):.0f}")  # fmt: skip
    console.print(table)
    rollbacks = max(0, sampler.generation - 1)
    console.print(f"outputs {out:,} for {sent:,} transfers; rollbacks {rollbacks}")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"soak-{time.strftime('%Y%m%d-%H%M%S')}.json"
    report = {"bench": "soak", "rate": args.rate, "seconds": args.seconds, "sent": sent,
              "outputs": out, "rollbacks": rollbacks, "series": sampler.series}  # fmt: skip
    path.write_text(json.dumps(report))
    console.print(f"results in {path}")


def _soak(args: argparse.Namespace, bootstrap: str) -> None:
    name = f"soak{uuid.uuid4().hex[:6]}"
    clients = KafkaClients(KafkaConfig(bootstrap))
    clients.create_topics([f"{name}.in.transfers", f"{name}.out.receipts", f"{name}.out.errors"])
    run_dir = scratch_dir("soak-")
    command = [
        sys.executable, "-m", "epochal.cli", "run", "examples.bank.app:app", "--name", name,
        "--bootstrap", bootstrap, "--workers", str(args.workers),
        "--partitions", str(2 * args.workers), "--run-dir", str(run_dir),
    ]  # fmt: skip
    sampler = RssSampler(run_dir / name / "processes.json", args.every)
    stop = threading.Event()
    process: subprocess.Popen[bytes] | None = None
    with open(run_dir / "run.log", "wb") as log:
        try:
            with interrupts_held():  # until the ``finally`` has the process to stop
                process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
            sampler.start()
            with console.status(f"feeding {args.rate}/s for {args.seconds:.0f} s"):
                sent = _feed(bootstrap, f"{name}.in.transfers", args.rate, args.seconds, stop)
                time.sleep(10)  # the last epochs drain
                out = _outputs(clients, name)
        finally:
            stop.set()
            sampler.stopping.set()
            if process is not None:
                process.send_signal(signal.SIGTERM)
                process.wait(60)
    _report(args, sampler, sent, out)


@cleans_up
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--rate", type=int, default=3000, help="records per second")
    parser.add_argument("--every", type=float, default=10, help="seconds between RSS samples")
    parser.add_argument("--warmup", type=float, default=60, help="seconds before the baseline")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--bootstrap", help="an existing broker (default: a local one)")
    parser.add_argument("--port", type=int, default=19892, help="port of the local broker")
    parser.add_argument("--out", default="bench/results", help="where the JSON goes")
    args = parser.parse_args()
    with broker_unless(args.bootstrap, args.port) as broker:
        _soak(args, broker.bootstrap)
    return 0


if __name__ == "__main__":
    sys.exit(main())
