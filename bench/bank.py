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
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import msgspec
from confluent_kafka import Producer, TopicPartition
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from epochal.config import CacheConfig, KafkaConfig, LocalBrokerConfig, cache_dir_from_env
from epochal.jvm import JarSet, fetch_jars
from epochal.log.client import KafkaClients, arrived
from epochal.log.local_broker import LocalBroker
from examples.bank.app import app as bank_app
from examples.bank.producer import Deposit, Transfer, events

console = Console(width=None if sys.stdout.isatty() else 160)
ROOT = Path(__file__).resolve().parent.parent


def produce(bootstrap: str, topic: str, transfers: int, accounts: int) -> None:
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


def count_egress(
    clients: KafkaClients, name: str, transfers: int, progress: Progress
) -> tuple[float, float]:
    consumer = clients.consumer(
        **{"isolation.level": "read_committed", "group.id": f"{name}.bench"}
    )
    consumer.assign([TopicPartition(f"{name}.out.{t}", 0, 0) for t in ("receipts", "errors")])
    task = progress.add_task(f"{name}", total=transfers)
    seen, first, last = 0, 0.0, 0.0
    deadline = time.monotonic() + 600
    while seen < transfers and time.monotonic() < deadline:
        batch = arrived(consumer, 10_000, 0.2)
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


_TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process so far (None once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) * _TICK_S  # utime, stime: fields 14 and 15


def _children(pid: int) -> list[int]:
    """The processes ``pid`` started (Linux), none once it is gone."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


class RssSampler(threading.Thread):
    """Samples a run's processes (from its status file, or ``pids``: a baseline's one process):
    their RSS every ``interval_s`` (the peak per role, and the whole series) and their CPU time
    every ``cpu_interval_s`` (per role, summed over every process that held it: a rollback
    starts new ones)."""

    def __init__(
        self,
        status_file: Path | None,
        interval_s: float = 1.0,
        cpu_interval_s: float = 0.1,
        broker_pid: int | None = None,
        pids: dict[str, int] | None = None,
    ) -> None:
        super().__init__(daemon=True)
        self.status_file = status_file
        self.pids = pids or {}
        self.interval_s = interval_s
        self.cpu_interval_s = cpu_interval_s
        self.broker_pid = broker_pid
        self.peak: dict[str, float] = {}
        self.series: list[tuple[float, dict[str, float]]] = []
        self.cpu: list[tuple[float, dict[str, float]]] = []  # (monotonic time, role -> CPU s)
        self.logging_from: float | None = None  # when the command log first held an epoch
        self.log_end: Callable[[], int] | None = None  # the command log's end offset
        self._cpu_of: dict[tuple[str, int], float] = {}  # last reading per (role, pid)
        self.generation = 0
        self.stopping = threading.Event()

    def _roles(self) -> dict[str, int]:
        if self.status_file is None:
            return dict(self.pids)
        status = json.loads(self.status_file.read_text())
        self.generation = int(status.get("generation", 0))
        roles = {"supervisor": status["supervisor"], "sequencer": status["sequencer"]}
        roles |= {f"worker{w}": pid for w, pid in enumerate(status["workers"])}
        roles = {role: int(pid) for role, pid in roles.items() if pid}
        for w, pid in enumerate(status["workers"]):  # each worker's snapshot process
            for child in _children(int(pid)) if pid else ():
                roles[f"snapshots{w}"] = child
        return roles

    def run(self) -> None:
        started = next_rss = time.monotonic()
        while not self.stopping.wait(self.cpu_interval_s):
            try:
                roles = self._roles()
            except (OSError, ValueError, KeyError):
                continue
            if self.broker_pid is not None:
                roles["broker"] = self.broker_pid
            self._sample_cpu(roles)
            if self.logging_from is None and self.log_end is not None and self.log_end() > 0:
                self.logging_from = self.cpu[-2][0] if len(self.cpu) > 1 else self.cpu[-1][0]
            if time.monotonic() >= next_rss:
                next_rss += self.interval_s
                sample = {role: _rss_mb(pid) for role, pid in roles.items() if role != "broker"}
                self.series.append((time.monotonic() - started, sample))
                for role, mb in sample.items():
                    self.peak[role] = max(self.peak.get(role, 0.0), mb)

    def _sample_cpu(self, roles: dict[str, int]) -> None:
        for role, pid in roles.items():
            used = _cpu_s(pid)
            if used is not None:
                self._cpu_of[role, pid] = used
        totals: dict[str, float] = {}
        for (role, _), used in self._cpu_of.items():
            totals[role] = totals.get(role, 0.0) + used
        self.cpu.append((time.monotonic(), totals))

    def cpu_between(self, start: float, end: float) -> dict[str, float]:
        """CPU seconds each role used from ``start`` to ``end`` (monotonic times), from the
        last sample at or before ``start`` to the first at or after ``end``."""
        before = [s for t, s in self.cpu if t <= start] or [s for _, s in self.cpu[:1]]
        after = [s for t, s in self.cpu if t >= end] or [s for _, s in self.cpu[-1:]]
        if not before or not after:
            return {}
        first, last = before[-1], after[0]
        used = {role: cpu - first.get(role, 0.0) for role, cpu in last.items()}
        if self.logging_from is not None and "sequencer" in last:
            logging = [s for t, s in self.cpu if t <= self.logging_from] or [
                s for _, s in self.cpu[:1]
            ]
            used["sequencer"] = last["sequencer"] - logging[-1].get("sequencer", 0.0)
        return used


@dataclass(frozen=True)
class Setup:
    """One configuration compared: a checkout of epochal, a worker count, snapshot settings
    (``off``, an interval in ms, ``weak``: weak recovery with the default interval, or
    ``default``: the checkout's own default, no flag)."""

    checkout: Path
    workers: int
    snapshots: str = "default"

    @property
    def label(self) -> str:
        snapshots = "" if self.snapshots == "default" else f", snapshots {self.snapshots}"
        return f"{self.checkout.name}, {self.workers}w{snapshots}"


def _command(setup: Setup, name: str, bootstrap: str, port_base: int, run_dir: Path) -> list[str]:
    command = [
        sys.executable, "-m", "epochal.cli", "run", "examples.bank.app:app", "--name", name,
        "--bootstrap", bootstrap, "--workers", str(setup.workers),
        "--partitions", str(2 * setup.workers), "--port-base", str(port_base),
        "--run-dir", str(run_dir),
    ]  # fmt: skip
    cli = setup.checkout / "epochal" / "cli.py"
    if "--warehouse" in cli.read_text():  # a checkout with snapshots: never into its own tree
        command += ["--warehouse", str(run_dir / "warehouse")]
    if setup.snapshots == "off":
        command.append("--no-snapshots")
    elif setup.snapshots == "weak":
        command += ["--recovery", "weak"]
    elif setup.snapshots != "default":
        command += ["--snapshot-interval-ms", setup.snapshots]
    return command


def _snapshots_taken(run_dir: Path) -> int:
    """Snapshots committed during the run, as its log says."""
    try:
        return (run_dir / "run.log").read_text(errors="replace").count("snapshot committed ssid=")
    except OSError:
        return 0


class _Sampled:
    """A process a run measures, started from ``cwd`` (its log in ``run_dir/run.log``), its
    CPU and RSS sampled by ``sampler``; stopped by SIGTERM."""

    command: list[str]
    sampler: RssSampler

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.run_dir = Path(tempfile.mkdtemp(prefix="epochal-bench-"))
        self.process: subprocess.Popen[bytes] | None = None
        self.started = 0.0

    def __enter__(self) -> Self:
        env = {**os.environ, "PYTHONPATH": str(self.cwd)}
        with open(self.run_dir / "run.log", "wb") as log:
            self.started = time.monotonic()
            self.process = subprocess.Popen(self.command, cwd=self.cwd, env=env, stdout=log,
                                            stderr=subprocess.STDOUT)  # fmt: skip
        self._started(self.process.pid)
        self.sampler.start()
        return self

    def _started(self, pid: int) -> None:
        """Before sampling starts (a cluster's sampler finds its pids in its status file)."""

    def __exit__(self, *exc: object) -> None:
        self.sampler.stopping.set()
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(60)


class _Cluster(_Sampled):
    """``epochal run`` of the bank for one run (of ``setup``'s checkout)."""

    def __init__(
        self,
        setup: Setup,
        name: str,
        bootstrap: str,
        port_base: int,
        broker_pid: int | None = None,
    ) -> None:
        super().__init__(setup.checkout)
        self.setup = setup
        self.name = name
        self.command = _command(setup, name, bootstrap, port_base, self.run_dir)
        self.sampler = RssSampler(self.run_dir / name / "processes.json", broker_pid=broker_pid)

    def facts(self) -> dict[str, Any]:
        return {
            "checkout": str(self.setup.checkout),
            "workers": self.setup.workers,
            "partitions": 2 * self.setup.workers,
            "snapshots": self.setup.snapshots,
            "snapshots_taken": _snapshots_taken(self.run_dir),
            "rollbacks": max(0, self.sampler.generation - 1),
            "peak_rss_mb": self.sampler.peak,
        }


def _end_offset(clients: KafkaClients, topic: str) -> int:
    """A topic's end offset, 0 while it does not exist yet (asked without creating it)."""
    if topic not in clients.admin().list_topics(timeout=5).topics:
        return 0
    return clients.end_offset(topic)


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
    name = f"bench{workers}w{uuid.uuid4().hex[:6]}"
    clients = KafkaClients(KafkaConfig(bootstrap))
    clients.create_topics([f"{name}.in.transfers"])
    produce(bootstrap, f"{name}.in.transfers", transfers, accounts)
    with _Cluster(setup, name, bootstrap, port_base, broker_pid) as cluster:
        cluster.sampler.log_end = lambda: _end_offset(clients, f"{name}.cmd")
        clients.create_topics([f"{name}.out.receipts", f"{name}.out.errors"])
        with Progress(console=console, transient=True) as progress:
            first, last = count_egress(clients, name, transfers, progress)
        time.sleep(2 * cluster.sampler.cpu_interval_s)  # a CPU sample after the last egress
        cpu = cluster.sampler.cpu_between(first, last)
    return {
        "cpu_us_per_tx": {role: 1e6 * s / transfers for role, s in sorted(cpu.items())},
        **cluster.facts(),
        "transfers": transfers,
        "seconds": last - first,
        "tps": transfers / (last - first),
        "seconds_from_start": last - cluster.started,
    }


# --- plain-Python baselines --------------------------------------------------------------

BASELINES = {"bank": "plain bank", "pipe": "exactly-once pipe"}  # kind -> label
PLAIN_BANK_BAR = 1 / 5  # epochal's default cluster should reach this share of the plain bank


class _Baseline(_Sampled):
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
            first, last = count_egress(clients, name, expected, progress)
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


def feed_at_rate(
    bootstrap: str,
    topic: str,
    source: Any,
    rate: int,
    seconds: float,
    *,
    stamps: dict[int, int],
    stop: threading.Event | None = None,
) -> int:
    """Transfers from ``source`` at ``rate`` per second, in bursts every 10 ms, for ``seconds``
    or until ``stop`` is set; returns how many were sent, and fills ``stamps`` with each one's
    offset and Kafka timestamp (from the delivery reports: the input topics may be trimmed
    behind the snapshots before anyone could read them back)."""

    def delivered(error: Any, message: Any) -> None:
        if error is None:
            stamps[message.offset()] = message.timestamp()[1]

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2})
    sent, started, tick = 0, time.monotonic(), 0
    while (elapsed := time.monotonic() - started) < seconds and not (stop and stop.is_set()):
        due = int(rate * min(elapsed + 0.01, seconds)) - sent
        for _ in range(due):
            producer.produce(topic, msgspec.msgpack.encode(next(source)), on_delivery=delivered)
        sent += max(0, due)
        producer.poll(0)
        tick += 1
        time.sleep(max(0.0, started + tick * 0.01 - time.monotonic()))
    assert producer.flush(60) == 0
    return sent


class EgressWatcher(threading.Thread):
    """Reads the egress as it comes (``read_committed``): per input offset, the egress
    record's timestamp and when it was seen (both ms since the epoch)."""

    def __init__(self, clients: KafkaClients, name: str) -> None:
        super().__init__(daemon=True)
        self.consumer = clients.consumer(**{
            "isolation.level": "read_committed", "group.id": f"{name}.bench",
            "fetch.wait.max.ms": 5,
        })  # fmt: skip
        topics = [f"{name}.out.{t}" for t in ("receipts", "errors")]
        self.consumer.assign([TopicPartition(t, 0, 0) for t in topics])
        self.out: dict[int, tuple[int, float]] = {}
        self.stopping = threading.Event()

    def run(self) -> None:
        read = bank_app.egress_codec.read_record  # in the format of the app the bench runs
        while not self.stopping.is_set():
            for message in arrived(self.consumer, 10_000, 0.05):
                if message.error() is not None:
                    continue
                seen = time.time() * 1000
                record = read(message.value() or b"")
                if record.source is not None:
                    self.out[record.source.offset] = (message.timestamp()[1], seen)
        self.consumer.close()


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """p50, p99 and max of ``values`` (NaN when there are none)."""
    ordered = sorted(values)
    if not ordered:
        return {"p50": float("nan"), "p99": float("nan"), "max": float("nan")}
    return {
        "p50": ordered[int(0.50 * len(ordered))],
        "p99": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "max": ordered[-1],
    }


def run_steady(
    bootstrap: str, setup: Setup, *, rate: int, seconds: float, warmup: float, accounts: int,
    port_base: int,
) -> dict[str, Any]:  # fmt: skip
    """Feed transfers at ``rate``/s while the cluster runs; latency per transfer."""
    name = f"steady{setup.workers}w{uuid.uuid4().hex[:6]}"
    topic = f"{name}.in.transfers"
    clients = KafkaClients(KafkaConfig(bootstrap))
    clients.create_topics([topic, f"{name}.out.receipts", f"{name}.out.errors"])
    source = events(10**9, accounts, seed=1)
    produce_events(bootstrap, topic, [next(source) for _ in range(accounts + 1)])  # + a probe
    latencies = EgressWatcher(clients, name)
    with _Cluster(setup, name, bootstrap, port_base) as cluster:
        latencies.start()
        deadline = time.monotonic() + 180
        while not latencies.out and time.monotonic() < deadline:
            time.sleep(0.05)
        if not latencies.out:
            raise SystemExit(f"{name}: the probe transfer never came out")
        stamps: dict[int, int] = {}
        feed_started_ms = time.time() * 1000
        sent = feed_at_rate(bootstrap, topic, source, rate, seconds, stamps=stamps)
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
        cpu = ", ".join(f"{role} {us:.1f}" for role, us in r["cpu_us_per_tx"].items())
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


def plot_bars(path: Path, panels: list[tuple[str, str, dict[str, float]]]) -> bool:
    """One bar chart per panel ``(title, y label, {bar label: value})``, side by side, as a
    PNG; False (and a note) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        console.print("no matplotlib: no PNG (pip install matplotlib)")
        return False
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.5), squeeze=False)
    for ax, (title, ylabel, bars) in zip(axes[0], panels, strict=True):
        ax.bar(range(len(bars)), list(bars.values()), color="tab:blue")
        ax.set_xticks(range(len(bars)), list(bars), rotation=15, fontsize=8)
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        for i, value in enumerate(bars.values()):
            text = f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}"
            ax.annotate(text, (i, value), ha="center", va="bottom", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


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


def _check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for value in args.snapshots:
        if value not in ("off", "default", "weak") and not value.isdigit():
            parser.error(f"--snapshots takes off, weak or an interval in ms, not {value!r}")
    if args.rate not in (None, "half") and not str(args.rate).isdigit():
        parser.error("--rate takes a number of transfers per second, or half")
    if args.transfers <= 0 and (args.rate is None or args.rate == "half"):
        parser.error("without backlog runs (--transfers 0), --rate needs a number")


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
                    accounts=args.accounts, port_base=port,
                ))  # fmt: skip
        report["steady"] = [_median_steady(r) for r in steady.values()]
        _print_steady(report["steady"])
    return report


def main() -> int:
    parser = _parser()
    args = parser.parse_args()
    _check_args(parser, args)
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
        args.broker_pid = broker.status().pid
    setups = [
        Setup(c.resolve(), w, s)
        for c in args.checkouts
        for w in args.workers
        for s in args.snapshots
    ]
    try:
        report = _run_all(args, bootstrap, setups)
    finally:
        if broker is not None:
            broker.stop()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"bench": "bank", "machine": platform.node(), "cpus": os.cpu_count(), **report}
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
