"""Bank transfers through Kafka, end to end, on 1 and on 2 workers, side by side in one run.

Deposits and transfers are produced first (so that the producer does not compete for the two
cores), then ``epochal run examples.bank.app:app`` is started and the benchmark counts the
transfers' egress records (receipts and abort reports, ``read_committed``) until all are out:
every run drains a backlog. Throughput = transfers / (time of the last egress record - time of
the first one); each configuration runs ``--repeats`` times, interleaved, and the median is
reported, with the rollbacks each run needed (its last generation - 1) and the peak memory
(RSS) of its supervisor, sequencer and workers, sampled every second. The CPU time each role
used during the drain (``/proc/<pid>/stat``, user + system, sampled every 0.1 s: the
sequencer, each worker, each worker's snapshot process, the supervisor and the local broker) is
reported per transfer, in microseconds: a measure far steadier than the wall-clock rate. The
window is the drain's (first egress record to last), except for the sequencer, which runs
ahead of the workers: its window starts when its first epoch is logged.

    python -m bench.bank --transfers 200000 --workers 1 2
    python -m bench.bank --transfers 100000 --workers 1 --checkouts ../baseline .   # before/after
    python -m bench.bank --transfers 1000000 --workers 1 --repeats 1               # a big backlog

Beside epochal, in the same run and over the same backlog, two plain-Python baselines
(``bench/baselines.py``, on by default, ``--no-baselines`` to skip): one process with a
confluent-kafka consumer (``read_committed``) and a transactional producer that commits each
batch of up to 10,000 input records with its outputs and offsets in one Kafka transaction. The
**plain bank** keeps the balances in a dict and writes one receipt or abort report per transfer,
as the app does; the **exactly-once pipe** copies every input record unchanged, so its rate is in
records per second (deposits + transfers), not transfers. Each runs once per repeat, after the
epochal configurations, measured the same way (first output record to last, CPU per record of
the process and the broker); each epochal configuration's ``ratio_to_plain_bank`` is its median
throughput over the plain bank's (the bar: >= 1/5 for the default cluster). Neither baseline
recovers state after a failure: they are bars for throughput, not alternatives. The window
starts with the first output, so a baseline's first batch is counted but not timed: a backlog of
a few batches overstates its rate (20,000 transfers: about 2x); the default 200,000 does not.

``--checkouts`` runs the cluster of each given checkout of epochal (its package and examples),
interleaved with the others, to compare two versions side by side on one broker. ``--snapshots``
does the same for snapshot settings: ``off``, or an interval in ms (the warehouse is the run's
own, in a temporary directory). Clusters take their ports from ``--port-base`` (20000) on.

Latency needs a steady rate, not a backlog: ``--rate N`` adds runs fed N transfers per second
while the cluster runs (after one probe transfer has come out, so start-up is not counted), for
``--seconds``; a transfer's latency is the Kafka timestamp of its egress record (produced when
its epoch's egress is committed) minus that of its input record, and also the time the
benchmark's ``read_committed`` consumer saw the egress minus the input's timestamp. ``--rate
half`` first drains the backlogs, then feeds every configuration at half the lowest median peak.

    python -m bench.bank --workers 2 --snapshots off 1000 --rate half    # snapshot overhead
    python -m bench.bank --transfers 0 --workers 1 --rate 10000 --seconds 30
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from confluent_kafka import Producer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench.drain import produce_records
from bench.open_loop import EgressWatcher, feed_at_rate, percentiles
from bench.processes import (
    OUTSIDE,
    ClusterProcess,
    MeasuredProcess,
    RssSampler,
    Setup,
    count_egress,
    end_offset,
)
from bench.report import cpu_by_role, plot_bars
from bench.scratch import broker_unless, cleans_up
from bench.workloads.base import Record
from epochal.config import KafkaConfig
from epochal.log.client import KafkaClients
from examples.bank.producer import Deposit, Transfer, events

console = Console(width=None if sys.stdout.isatty() else 160)
ROOT = Path(__file__).resolve().parent.parent


def produce(
    bootstrap: str, topic: str, transfers: int, accounts: int, progress: Progress | None = None
) -> None:
    """The producer's deposits and ``transfers`` transfers onto ``topic``, keyed by account;
    counted on a task of ``progress`` if given (10,000,000 take about a minute)."""
    total = accounts + transfers
    task = None if progress is None else progress.add_task(f"producing {topic}", total=total)

    def records() -> Iterator[Record]:
        for i, event in enumerate(events(transfers, accounts, seed=1)):
            if progress is not None and task is not None and i % 100_000 == 0:
                progress.update(task, completed=i)
            key = event.account if isinstance(event, Deposit) else event.source
            yield Record(topic, key.encode(), msgspec.msgpack.encode(event))
        if progress is not None and task is not None:
            progress.update(task, completed=total)

    produce_records(bootstrap, "", records())


def run_once(
    bootstrap: str,
    workers: int,
    transfers: int,
    accounts: int,
    port_base: int,
    *,
    checkout: Path = ROOT,
    snapshots: str = "default",
    broker_pid: int | None = None,
) -> dict[str, Any]:
    """Drain a backlog of ``transfers``: throughput from the first egress record to the last,
    and the CPU each role used meanwhile, per transfer."""
    setup = Setup(checkout, workers, snapshots)
    return drain(bootstrap, setup, transfers, accounts, port_base, broker_pid=broker_pid).result


@dataclass
class Drained:
    """A drain's result, and what a caller that measures more than its rate reads after it (a
    long run): the stopped cluster (its sampler's RSS series, its run directory and warehouse),
    the app's name, and ``(monotonic time, egress records out)`` over the drain."""

    result: dict[str, Any]
    cluster: ClusterProcess
    name: str
    timeline: list[tuple[float, int]]


def drain(
    bootstrap: str,
    setup: Setup,
    transfers: int,
    accounts: int,
    port_base: int,
    *,
    broker_pid: int | None = None,
    timeout_s: float = 600,
    rss_every_s: float = 1.0,
    untracked: Sequence[str] = OUTSIDE,
    progress: Progress | None = None,
) -> Drained:
    """:func:`run_once`'s drain: the backlog produced, then the cluster started on it until
    every transfer's egress record is out (``timeout_s`` at most), then stopped. RSS is
    sampled every ``rss_every_s`` for each role but ``untracked``; ``progress``, if given,
    counts the production and the drain (else a transient bar of its own counts the drain)."""
    name = f"bench{setup.workers}w{uuid.uuid4().hex[:6]}"
    clients = KafkaClients(KafkaConfig(bootstrap))
    clients.create_topics([f"{name}.in.transfers"])
    produce(bootstrap, f"{name}.in.transfers", transfers, accounts, progress)
    cluster = ClusterProcess(setup, name, bootstrap, port_base, broker_pid)
    cluster.sampler.interval_s, cluster.sampler.untracked = rss_every_s, tuple(untracked)
    timeline: list[tuple[float, int]] = []
    shown = nullcontext(progress) if progress else Progress(console=console, transient=True)
    with cluster, shown as bars:
        cluster.sampler.log_end = lambda: end_offset(clients, f"{name}.cmd")
        clients.create_topics([f"{name}.out.receipts", f"{name}.out.errors"])
        first, last = count_egress(
            clients, name, transfers, bars, process=cluster, timeout_s=timeout_s, timeline=timeline
        )
        time.sleep(2 * cluster.sampler.cpu_interval_s)  # a CPU sample after the last egress
        cpu = cluster.sampler.cpu_between(first, last)
    result = {
        "cpu_us_per_tx": {role: 1e6 * s / transfers for role, s in sorted(cpu.items())},
        **cluster.facts(),
        "transfers": transfers,
        "seconds": last - first,
        "tps": transfers / (last - first),
        "seconds_from_start": last - cluster.started,
    }
    return Drained(result, cluster, name, timeline)


# --- plain-Python baselines --------------------------------------------------------------

BASELINES = {"bank": "plain bank", "pipe": "exactly-once pipe"}  # kind -> label
PLAIN_BANK_BAR = 1 / 5  # epochal's default cluster should reach this share of the plain bank


class _Baseline(MeasuredProcess):
    """``python -m bench.baselines <kind>`` for one run, sampled like a cluster's roles (role
    ``baseline``)."""

    def __init__(self, kind: str, name: str, bootstrap: str, broker_pid: int | None) -> None:
        super().__init__(ROOT)
        self.command = [
            sys.executable, "-m", "bench.baselines", kind, "--bootstrap", bootstrap,
            "--input", f"{name}.in.transfers", "--output", f"{name}.out.receipts",
            "--errors", f"{name}.out.errors", "--transactional-id", f"{name}.plain-{kind}",
        ]  # fmt: skip
        self.sampler = RssSampler(None, broker_pid=broker_pid)

    def _started(self, pid: int) -> None:
        self.sampler.pids = {"baseline": pid}


def run_baseline(
    bootstrap: str, kind: str, transfers: int, accounts: int, broker_pid: int | None = None
) -> dict[str, Any]:
    """Drain the same backlog as ``run_once`` with a plain-Python baseline (``bench.baselines``),
    measured the same way: records out / (last egress record - first), CPU per record from
    ``/proc``. The bank's records are its transfers' receipts and abort reports; the pipe copies
    every input record, so its unit is the record (deposits + transfers), not the transfer."""
    name = f"{kind}{uuid.uuid4().hex[:6]}"
    clients = KafkaClients(KafkaConfig(bootstrap))
    clients.create_topics([f"{name}.in.transfers", f"{name}.out.receipts", f"{name}.out.errors"])
    produce(bootstrap, f"{name}.in.transfers", transfers, accounts)
    expected = transfers if kind == "bank" else accounts + transfers
    with _Baseline(kind, name, bootstrap, broker_pid) as baseline:
        with Progress(console=console, transient=True) as progress:
            first, last = count_egress(clients, name, expected, progress, process=baseline)
        time.sleep(2 * baseline.sampler.cpu_interval_s)  # a CPU sample after the last egress
        cpu = baseline.sampler.cpu_between(first, last)
    return {
        "baseline": BASELINES[kind],
        "unit": "transfers" if kind == "bank" else "records",
        "cpu_us_per_tx": {role: 1e6 * s / expected for role, s in sorted(cpu.items())},
        "checkout": str(ROOT),
        "workers": 1,
        "partitions": 1,
        "snapshots": "-",
        "snapshots_taken": 0,
        "rollbacks": 0,
        "peak_rss_mb": baseline.sampler.peak,
        "transfers": transfers,
        "records": expected,
        "seconds": last - first,
        "tps": expected / (last - first),
        "seconds_from_start": last - baseline.started,
    }


# --- steady rate: latency -----------------------------------------------------------------


def run_steady(
    bootstrap: str, setup: Setup, *, rate: int, seconds: float, warmup: float, accounts: int,
    port_base: int, broker_pid: int | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Feed transfers at ``rate``/s while the cluster runs; latency per transfer, and the CPU
    each role spent per transfer fed after ``warmup`` (a steady rate's epochs and Kafka
    transactions are small: their fixed costs weigh more per transfer than in a drain)."""
    name = f"steady{setup.workers}w{uuid.uuid4().hex[:6]}"
    topic = f"{name}.in.transfers"
    clients = KafkaClients(KafkaConfig(bootstrap))
    clients.create_topics([topic, f"{name}.out.receipts", f"{name}.out.errors"])
    source = events(10**9, accounts, seed=1)
    produce_events(bootstrap, topic, [next(source) for _ in range(accounts + 1)])  # + a probe
    latencies = EgressWatcher(clients, name)
    with ClusterProcess(setup, name, bootstrap, port_base, broker_pid) as cluster:
        latencies.start()
        deadline = time.monotonic() + 180
        while not latencies.out and time.monotonic() < deadline:
            time.sleep(0.05)
        if not latencies.out:
            raise SystemExit(f"{name}: the probe transfer never came out")
        stamps: dict[int, int] = {}
        feed_started_ms, fed_from = time.time() * 1000, time.monotonic()
        sent = feed_at_rate(bootstrap, topic, source, rate, seconds, stamps=stamps)
        cpu = cluster.sampler.cpu_between(fed_from + warmup, time.monotonic())
        deadline = time.monotonic() + 60
        while len(latencies.out) < sent + 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        latencies.stopping.set()
        latencies.join(10)
    counted = [o for o, ts in stamps.items() if ts >= feed_started_ms + 1000 * warmup]
    done = [o for o in counted if o in latencies.out]
    by_ts = [latencies.out[o][0] - stamps[o] for o in done]
    by_seen = [latencies.out[o][1] - stamps[o] for o in done]
    return {
        **cluster.facts(),
        "cpu_us_per_tx": {role: 1e6 * s / max(1, len(counted)) for role, s in sorted(cpu.items())},
        "rate": rate,
        "seconds": seconds,
        "sent": sent,
        "out": len(latencies.out) - 1,
        "counted": len(counted),
        "missing": len(counted) - len(done),
        "latency_ms": percentiles(by_ts),
        "seen_latency_ms": percentiles(by_seen),
    }


def produce_events(bootstrap: str, topic: str, values: list[Deposit | Transfer]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for value in values:
        producer.produce(topic, msgspec.msgpack.encode(value))
    assert producer.flush(60) == 0


# --- reports ------------------------------------------------------------------------------


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median run by throughput, with every run's throughput and rollbacks beside it."""
    ordered = sorted(runs, key=lambda r: r["tps"])
    return {
        **ordered[len(ordered) // 2],
        "tps_runs": [r["tps"] for r in runs],
        "rollbacks_runs": [r["rollbacks"] for r in runs],
    }


def _median_steady(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median run by p99 latency, with every run's p99 beside it."""
    ordered = sorted(runs, key=lambda r: r["latency_ms"]["p99"])
    return {
        **ordered[len(ordered) // 2],
        "p99_runs": [r["latency_ms"]["p99"] for r in runs],
        "rollbacks_runs": [r["rollbacks"] for r in runs],
    }


def _label(r: dict[str, Any]) -> str:
    if "baseline" in r:
        return str(r["baseline"])
    return Setup(Path(r["checkout"]), r["workers"], r.get("snapshots", "default")).label


def _print_backlog(
    results: list[dict[str, Any]], transfers: int, baselines: list[dict[str, Any]]
) -> None:
    table = Table(title=f"bank transfers end to end through Kafka ({transfers:,} transfers)")
    columns = ("checkout", "workers", "partitions", "snapshots", "taken", "tx/s (median)",
               "ratio", "vs plain bank", "runs", "rollbacks")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="right")
    for r in results + baselines:
        runs_text = ", ".join(f"{t:,.0f}" for t in r["tps_runs"])
        unit = " records/s" if r.get("unit") == "records" else ""
        vs_plain = f"{r['ratio_to_plain_bank']:.2f}x" if "ratio_to_plain_bank" in r else "-"
        table.add_row(
            r.get("baseline") or Path(r["checkout"]).name,
            "-" if "baseline" in r else str(r["workers"]), str(r["partitions"]), r["snapshots"],
            str(r["snapshots_taken"]), f"{r['tps']:,.0f}{unit}",
            f"{r['tps'] / results[0]['tps']:.2f}x", vs_plain, runs_text,
            ", ".join(map(str, r["rollbacks_runs"])),
        )  # fmt: skip
    console.print(table)
    for r in results + baselines:
        rss = ", ".join(f"{role} {mb:.0f}" for role, mb in sorted(r["peak_rss_mb"].items()))
        console.print(f"peak RSS MB ({_label(r)}): {rss}")
    for r in results + baselines:
        cpu = cpu_by_role(r["cpu_us_per_tx"])
        per = "record" if r.get("unit") == "records" else "transfer"
        console.print(f"CPU us per {per}, median run ({_label(r)}): {cpu}")
    for r in results:
        if "ratio_to_plain_bank" in r:
            ratio = r["ratio_to_plain_bank"]
            met = "met" if ratio >= PLAIN_BANK_BAR else "not met"
            console.print(f"ratio to the plain bank ({_label(r)}): {ratio:.2f} "
                          f"(bar >= {PLAIN_BANK_BAR:.2f}: {met})")  # fmt: skip


def _print_steady(results: list[dict[str, Any]]) -> None:
    table = Table(title="steady rate: latency per transfer, ms (median run by p99)")
    columns = ("checkout", "workers", "snapshots", "taken", "rate/s", "p50", "p99", "max",
               "seen p50", "seen p99", "p99 runs", "missing", "rollbacks")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="right")
    for r in results:
        ts, seen = r["latency_ms"], r["seen_latency_ms"]
        table.add_row(
            Path(r["checkout"]).name, str(r["workers"]), r["snapshots"],
            str(r["snapshots_taken"]), f"{r['rate']:,}", f"{ts['p50']:.0f}", f"{ts['p99']:.0f}",
            f"{ts['max']:.0f}", f"{seen['p50']:.0f}", f"{seen['p99']:.0f}",
            ", ".join(f"{p:.0f}" for p in r["p99_runs"]), str(r["missing"]),
            ", ".join(map(str, r["rollbacks_runs"])),
        )  # fmt: skip
    console.print(table)
    for r in results:
        cpu = cpu_by_role(r["cpu_us_per_tx"])
        console.print(f"CPU us per transfer at {r['rate']:,}/s, median run ({_label(r)}): {cpu}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transfers", type=int, default=200_000,
                        help="backlog per run (0: none, with a numeric --rate)")  # fmt: skip
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
    parser.add_argument(
        "--snapshots", nargs="+", default=["default"],
        help="snapshot settings to compare: off, an interval in ms, or weak (weak recovery: no "
        "command log) (default: the cluster's)",
    )  # fmt: skip
    parser.add_argument("--rate", help="also steady-rate runs at this many transfers/s, or "
                        "'half': half the lowest median peak of the backlog runs")  # fmt: skip
    parser.add_argument("--seconds", type=float, default=30, help="length of a steady run")
    parser.add_argument(
        "--baselines", action=argparse.BooleanOptionalAction, default=True,
        help="also drain each backlog with the plain-Python baselines (bench.baselines)",
    )  # fmt: skip
    parser.add_argument(
        "--port-base", type=int, default=20_000,
        help="the clusters' first port: each backlog run takes 10 from here, steady runs from "
        "here + 1000",
    )  # fmt: skip
    parser.set_defaults(broker_pid=None)  # set when the run starts its own broker
    parser.add_argument("--warmup", type=float, default=3,
                        help="seconds of a steady run left out of the latencies")  # fmt: skip
    return parser


MAX_ACCOUNTS = 10_000
"""The bank example's key space (``acct-\\d{4}``)."""


def _check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for value in args.snapshots:
        if value not in ("off", "default", "weak") and not value.isdigit():
            parser.error(f"--snapshots takes off, weak or an interval in ms, not {value!r}")
    if args.rate not in (None, "half") and not str(args.rate).isdigit():
        parser.error("--rate takes a number of transfers per second, or half")
    if args.transfers <= 0 and (args.rate is None or args.rate == "half"):
        parser.error("without backlog runs (--transfers 0), --rate needs a number")
    if not 2 <= args.accounts <= MAX_ACCOUNTS:  # more would fold onto the same keys, unsaid
        parser.error(
            f"--accounts takes 2 to {MAX_ACCOUNTS:,}: the bank example's keys are acct-0000 to "
            f"acct-9999, not {args.accounts:,}"
        )


def _run_all(args: argparse.Namespace, bootstrap: str, setups: list[Setup]) -> dict[str, Any]:
    """Every configuration ``--repeats`` times, interleaved, so drift hits each alike."""
    report: dict[str, Any] = {"results": [], "baselines": [], "steady": []}
    if args.transfers > 0:
        runs: dict[Setup, list[dict[str, Any]]] = {s: [] for s in setups}
        plain: dict[str, list[dict[str, Any]]] = {k: [] for k in BASELINES if args.baselines}
        for repeat in range(args.repeats):
            for i, setup in enumerate(setups):
                port = args.port_base + 10 * i + 100 * repeat  # clear of the query ports (7700)
                runs[setup].append(run_once(
                    bootstrap, setup.workers, args.transfers, args.accounts, port,
                    checkout=setup.checkout, snapshots=setup.snapshots,
                    broker_pid=args.broker_pid,
                ))  # fmt: skip
            for kind, baseline_runs in plain.items():
                baseline_runs.append(run_baseline(
                    bootstrap, kind, args.transfers, args.accounts, args.broker_pid
                ))  # fmt: skip
        report["results"] = [_median(r) for r in runs.values()]
        report["baselines"] = [_median(r) for r in plain.values()]
        if plain:
            bank_tps = _median(plain["bank"])["tps"]
            for r in report["results"]:
                r["ratio_to_plain_bank"] = r["tps"] / bank_tps
        _print_backlog(report["results"], args.transfers, report["baselines"])
    if args.rate is not None:
        rate = (
            int(min(r["tps"] for r in report["results"]) / 2)
            if args.rate == "half"
            else int(args.rate)
        )
        steady: dict[Setup, list[dict[str, Any]]] = {s: [] for s in setups}
        for repeat in range(args.repeats):
            for i, setup in enumerate(setups):
                port = args.port_base + 1_000 + 10 * i + 100 * repeat
                console.print(f"steady {rate:,}/s for {args.seconds:.0f} s: {setup.label}")
                steady[setup].append(run_steady(
                    bootstrap, setup, rate=rate, seconds=args.seconds, warmup=args.warmup,
                    accounts=args.accounts, port_base=port, broker_pid=args.broker_pid,
                ))  # fmt: skip
        report["steady"] = [_median_steady(r) for r in steady.values()]
        _print_steady(report["steady"])
    return report


@cleans_up
def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    _check_args(parser, args)
    setups = [
        Setup(c.resolve(), w, s)
        for c in args.checkouts
        for w in args.workers
        for s in args.snapshots
    ]
    with broker_unless(args.bootstrap, args.port) as broker:
        args.broker_pid = broker.pid
        report = _run_all(args, broker.bootstrap, setups)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "bench": "bank",
        "machine": platform.node(),
        "cpus": os.cpu_count(),
        "accounts": args.accounts,
        **report,
    }
    stem = out / f"bank-{time.strftime('%Y%m%d-%H%M%S')}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2))
    drained = report["results"] + report["baselines"]
    panels = [("backlog drain", "transfers/s (median; the pipe: records/s)",
               {_label(r): r["tps"] for r in drained})]  # fmt: skip
    if report["steady"]:
        panels.append((f"steady {report['steady'][0]['rate']:,}/s", "p99 latency ms",
                       {_label(r): r["latency_ms"]["p99"] for r in report["steady"]}))  # fmt: skip
    plotted = plot_bars(stem.with_suffix(".png"), [p for p in panels if p[2]])
    console.print(f"results in {stem}.json" + (f" and {stem}.png" if plotted else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
