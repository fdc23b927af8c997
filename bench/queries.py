"""Live point queries against the bank on 2 workers: q/s, keys/s and latency per isolation level,
with the engine idle and under load, and the engine's throughput with and without the queries.

Runs, on a local broker of its own (``--port``, default 19392; queries on ``--query-port``,
default 7950, so that it collides with nobody's tests):

1. **Peak** (unless ``--load-rate`` is given): a backlog of ``--transfers`` drained by
   ``epochal run examples.bank.app:app`` on 2 workers, as ``bench.bank`` does: transfers/s at
   the egress. Then the same backlog again while a client process reads ``--drain-query``
   (default ``committed:1``, ``--in-flight`` at once) the whole time: the engine's peak with
   that query load.
2. **Idle**: a cluster with the 10,000 accounts deposited and nothing else running; for each
   level in ``--levels`` and each ``--keys`` per query (``get`` for 1, ``get_many`` for more),
   for each ``--in-flight`` (many pipelined queries, and 1 at a time for latency), one cell of
   ``--seconds`` (``--serializable-seconds`` for ``SERIALIZABLE``, which goes through Kafka and
   pays an epoch's latency per read). ``SNAPSHOT`` reads the newest snapshot when its cell starts.
3. **Load**: the same cluster fed transfers at half the peak (or ``--load-rate``); ``--seconds``
   without queries, then every cell again, then ``--seconds`` without queries. The egress seen
   in each window gives the engine's transfers/s and each transfer's latency (egress timestamp -
   input timestamp) with and without queries, side by side.

The client runs in its own process (``bench/query_load.py``): one asyncio (uvloop) loop, one
pipelined connection per worker, ``in_flight`` tasks. **The machine has 2 cores**: the client
competes with the 2 workers, the sequencer, the broker and this process (which feeds the
transfers and reads the egress); the JSON has every role's CPU share per cell.

    python -m bench.queries                                  # everything, ~6 minutes
    python -m bench.queries --levels live committed --keys 1 100 --seconds 3 --load-rate 20000
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import multiprocessing
import os
import platform
import queue
import shutil
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from rich.table import Table

from bench.bank import (
    ROOT,
    console,
    produce,
    produce_events,
)
from bench.open_loop import EgressWatcher, feed_at_rate, percentiles
from bench.processes import ClusterProcess, Setup, cpu_s
from bench.query_load import LEVELS, Cell, CellResult, Target, client_process
from bench.scratch import broker_unless, cleans_up
from epochal.config import (
    KafkaConfig,
    SnapshotConfig,
)
from epochal.log.client import KafkaClients
from epochal.recovery.snapshot_reads import SnapshotReader
from examples.bank.producer import events

NOTE = (
    "2 cores: the query client process competes with the 2 workers, the sequencer, the broker "
    "and the benchmark's own feeder/egress reader for CPU; q/s is what the client gets, not "
    "what the servers could give"
)
WORKERS = 2


# --- the cluster, and what its processes use --------------------------------------------------


class CpuSampler(threading.Thread):
    """Every ``interval_s``, the CPU seconds used so far by each role of a run (from its status
    file), the broker and this process, and the machine's busy and total jiffies."""

    def __init__(self, status_file: Path, pids: dict[str, int], interval_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.status_file = status_file
        self.pids = pids
        self.interval_s = interval_s
        self.samples: list[tuple[float, dict[str, float]]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(self.interval_s):
            pids = dict(self.pids)
            with suppress(OSError, ValueError, KeyError):
                status = json.loads(self.status_file.read_text())
                pids |= {"sequencer": status["sequencer"]}
                pids |= {f"worker{w}": pid for w, pid in enumerate(status["workers"])}
            sample = {role: cpu_s(int(pid)) or 0.0 for role, pid in pids.items() if pid}
            sample |= _machine()
            self.samples.append((time.time() * 1000, sample))

    def usage(self, started_ms: float, ended_ms: float) -> dict[str, float]:
        """Each role's CPU share over a window (1.0: one core), and the machine's busy share
        (1.0: every core), from the samples just outside it."""
        times = [t for t, _ in self.samples]
        i = max(0, bisect.bisect_right(times, started_ms) - 1)
        j = min(len(times) - 1, bisect.bisect_left(times, ended_ms))
        if j <= i:
            return {}
        (t0, a), (t1, b) = self.samples[i], self.samples[j]
        seconds = (t1 - t0) / 1000
        shares = {r: (b[r] - a[r]) / seconds for r in b if r in a and not r.startswith("_")}
        total = b["_total"] - a["_total"]
        shares["machine"] = (b["_busy"] - a["_busy"]) / total if total else 0.0
        shares["workers"] = sum(v for r, v in shares.items() if r.startswith("worker"))
        return shares


def _machine() -> dict[str, float]:
    jiffies = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = jiffies[3] + jiffies[4]  # idle + iowait
    return {"_busy": float(sum(jiffies) - idle), "_total": float(sum(jiffies))}


@contextmanager
def cluster(name: str, bootstrap: str, query_port: int, pids: dict[str, int]) -> Iterator[Any]:
    """``epochal run examples.bank.app:app`` on 2 workers with queries on ``query_port`` + w
    (its peers 10 ports up), CPU sampled; stopped (and its run dir removed) on the way out."""
    run = ClusterProcess(Setup(ROOT, WORKERS), name, bootstrap, query_port + 10)
    run.command += ["--query-port", str(query_port)]
    sampler = CpuSampler(run.run_dir / name / "processes.json", pids)
    try:
        with run:
            sampler.start()
            yield run, sampler
    finally:
        sampler.stopping.set()
        if run.process is not None and run.process.poll() is None:
            run.process.kill()  # __exit__ gave up waiting for it
        shutil.rmtree(run.run_dir, ignore_errors=True)


# --- the client process ---------------------------------------------------------------------


class ClientProcess:
    """``bench.query_load.client_process`` in a spawned process; results as they come."""

    def __init__(self, target: Target, cells: list[Cell]) -> None:
        context = multiprocessing.get_context("spawn")
        self.out = context.Queue()
        self.stop = context.Event()
        self.process = context.Process(target=client_process, args=(target, cells, self.out,
                                       self.stop), daemon=True)  # fmt: skip
        self.results: list[CellResult] = []
        self.pid = 0

    def __enter__(self) -> ClientProcess:
        self.process.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.process.join(30)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()

    def wait_ready(self, timeout_s: float = 150) -> None:
        kind, value = self._next(timeout_s)
        if kind != "ready":
            raise SystemExit(f"the query client did not connect: {value}")
        self.pid = value

    def results_until_done(self, timeout_s: float) -> list[CellResult]:
        """Every cell's result, printed as it comes, until the process is done."""
        deadline = time.monotonic() + timeout_s
        while (kind_value := self._next(deadline - time.monotonic()))[0] == "cell":
            result = kind_value[1]
            self.results.append(result)
            console.print(_progress_line(result))
        if kind_value[0] != "done":
            raise SystemExit(f"the query client failed: {kind_value[1]}")
        return self.results

    def _next(self, timeout_s: float) -> tuple[str, Any]:
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            try:
                item: tuple[str, Any] = self.out.get(timeout=0.5)
                return item
            except queue.Empty:
                if not self.process.is_alive():
                    return ("error", f"the client process exited ({self.process.exitcode})")
                if time.monotonic() > deadline:
                    return ("error", "the query client took too long")


def _progress_line(r: CellResult) -> str:
    lat = r.latency_ms
    errors = f" [red]errors {r.errors}: {r.error_samples[0]}[/red]" if r.errors else ""
    return (f"  {r.cell.phase:5} {r.cell.label:24} {r.qps:>9,.0f} q/s {r.keys_per_s:>11,.0f} "
            f"keys/s  p50 {lat['p50']:7.2f} ms  p99 {lat['p99']:7.2f} ms  client cpu "
            f"{r.client_cpu:.0%}{errors}")  # fmt: skip


# --- the phases -------------------------------------------------------------------------------


def _watch_egress(clients: KafkaClients, name: str) -> EgressWatcher:
    clients.create_topics([f"{name}.out.receipts", f"{name}.out.errors"])
    watcher = EgressWatcher(clients, name)
    watcher.start()
    return watcher


def _egress_rate(watcher: EgressWatcher, started_ms: float, ended_ms: float) -> float:
    stamps = [ts for ts, _ in list(watcher.out.values())]
    inside = sum(1 for ts in stamps if started_ms <= ts <= ended_ms)
    return 1000 * inside / (ended_ms - started_ms) if ended_ms > started_ms else 0.0


def drain(args: argparse.Namespace, bootstrap: str, index: int,
          query: Cell | None) -> dict[str, Any]:  # fmt: skip
    """Drain a backlog of transfers, with ``query`` running the whole time if given: the
    engine's transfers/s at its egress (over the part of the drain the queries overlapped)."""
    name = f"qdrain{uuid.uuid4().hex[:6]}"
    clients = KafkaClients(KafkaConfig(bootstrap))
    clients.create_topics([f"{name}.in.transfers"])
    produce(bootstrap, f"{name}.in.transfers", args.transfers, args.accounts)
    query_port = args.query_port + 20 * index
    pids = {"broker": args.broker_pid, "bench": os.getpid()}
    with cluster(name, bootstrap, query_port, pids) as (run, sampler):
        watcher = _watch_egress(clients, name)
        target = Target(name, f"127.0.0.1:{query_port}", bootstrap, str(run.run_dir / "warehouse"),
                        args.loop)  # fmt: skip
        with ClientProcess(target, [query] if query else []) as client:
            if query is not None:
                client.wait_ready()
            deadline = time.monotonic() + 600
            while len(watcher.out) < args.transfers and time.monotonic() < deadline:
                time.sleep(0.05)
            client.stop.set()
            results = client.results_until_done(60) if query is not None else []
        watcher.stopping.set()
        watcher.join(10)
    if len(watcher.out) < args.transfers:
        raise SystemExit(f"{name}: only {len(watcher.out)} of {args.transfers} transfers came out")
    stamps = sorted(ts for ts, _ in watcher.out.values())
    first, last = stamps[0], stamps[-1]
    row: dict[str, Any] = {"transfers": args.transfers, "tps": 1000 * len(stamps) / (last - first),
                           "cpu": sampler.usage(first, last), "query": None}  # fmt: skip
    if results:
        r = results[0]
        started, ended = max(first, r.started_ms), min(last, r.ended_ms)
        if ended - started < 1000:
            raise SystemExit(f"{name}: the queries overlapped the drain for {ended - started:.0f}"
                             " ms: give a larger --transfers")  # fmt: skip
        row |= {"tps": _egress_rate(watcher, started, ended), "overlap_s": (ended - started) / 1000,
                "cpu": sampler.usage(started, ended), "query": r.as_json()}  # fmt: skip
    return row


def _window(watcher: EgressWatcher, stamps: dict[int, int], sampler: CpuSampler,
            started_ms: float, ended_ms: float) -> dict[str, Any]:  # fmt: skip
    """The engine over a window: transfers/s at the egress, their latency, the CPU shares."""
    out = list(watcher.out.items())
    inside = [(o, ts) for o, (ts, _) in out if started_ms <= ts <= ended_ms]
    latency = [ts - stamps[o] for o, ts in inside if o in stamps]
    seconds = (ended_ms - started_ms) / 1000
    return {"tps": len(inside) / seconds if seconds > 0 else 0.0,
            "latency_ms": percentiles(latency), "cpu": sampler.usage(started_ms, ended_ms),
            "started_ms": started_ms, "ended_ms": ended_ms}  # fmt: skip


def _idle_window(seconds: float) -> tuple[float, float]:
    started = time.time() * 1000
    time.sleep(seconds)
    return started, time.time() * 1000


def steady(args: argparse.Namespace, bootstrap: str, index: int, rate: int) -> dict[str, Any]:
    """The query cells with the engine idle, then under transfers at ``rate``/s."""
    name = f"qsteady{uuid.uuid4().hex[:6]}"
    topic = f"{name}.in.transfers"
    clients = KafkaClients(KafkaConfig(bootstrap))
    clients.create_topics([topic])
    source = events(10**9, args.accounts, seed=1)
    produce_events(bootstrap, topic, [next(source) for _ in range(args.accounts + 1)])  # + probe
    query_port = args.query_port + 20 * index
    pids = {"broker": args.broker_pid, "bench": os.getpid()}
    report: dict[str, Any] = {"rate": rate}
    with cluster(name, bootstrap, query_port, pids) as (run, sampler):
        watcher = _watch_egress(clients, name)
        _wait(lambda: bool(watcher.out), 180, f"{name}: the probe transfer never came out")
        reader = SnapshotReader(SnapshotConfig(str(run.run_dir / "warehouse")), name)
        _wait(lambda: reader.latest() is not None, 60, f"{name}: no snapshot was taken")
        target = Target(name, f"127.0.0.1:{query_port}", bootstrap, str(run.run_dir / "warehouse"),
                        args.loop)  # fmt: skip
        console.print(f"[bold]idle[/bold]: {len(_cells(args, 'idle'))} cells")
        report["idle"] = _run_cells(target, _cells(args, "idle"), sampler)
        stamps: dict[int, int] = {}
        stop = threading.Event()
        feeder = threading.Thread(target=feed_at_rate, args=(bootstrap, topic, source, rate, 1e9),
                                  kwargs={"stamps": stamps, "stop": stop}, daemon=True)  # fmt: skip
        feeder.start()
        try:
            console.print(f"[bold]load[/bold]: transfers at {rate:,}/s")
            time.sleep(args.warmup)
            before = _window(watcher, stamps, sampler, *_idle_window(args.seconds))
            report["load"] = _run_cells(target, _cells(args, "load"), sampler)
            after = _window(watcher, stamps, sampler, *_idle_window(args.seconds))
        finally:
            stop.set()
            feeder.join(60)
        time.sleep(2)  # the last windows' egress
        for row in report["load"]:
            row["engine"] = _window(watcher, stamps, sampler, row["started_ms"], row["ended_ms"])
        watcher.stopping.set()
        watcher.join(10)
    report["engine_without_queries"] = [before, after]
    return report


def _wait(ready: Any, timeout_s: float, failure: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise SystemExit(failure)
        time.sleep(0.2)


def _cells(args: argparse.Namespace, phase: str) -> list[Cell]:
    cells = []
    for _ in range(args.repeats):
        for level in args.levels:
            seconds = args.serializable_seconds if level == "serializable" else args.seconds
            for keys in args.keys:
                for in_flight in args.in_flight:
                    cells.append(Cell(level, keys, in_flight, seconds, phase))
    return cells


def _run_cells(target: Target, cells: list[Cell], sampler: CpuSampler) -> list[dict[str, Any]]:
    budget = sum(c.seconds + 30 for c in cells) + 150
    with ClientProcess(target, cells) as client:
        client.wait_ready()
        results = client.results_until_done(budget)
    rows = []
    for r in results:
        row = r.as_json()
        row["cpu"] = sampler.usage(r.started_ms, r.ended_ms)
        rows.append(row)
    return rows


# --- reports ----------------------------------------------------------------------------------


def summarize(rows: list[dict[str, Any]]) -> dict[tuple[str, int, int], dict[str, Any]]:
    """Per (level, keys, in flight): the median repeat by q/s, with every repeat's q/s."""
    groups: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["level"], row["keys"], row["in_flight"]), []).append(row)
    summary = {}
    for key, group in groups.items():
        ordered = sorted(group, key=lambda r: r["qps"])
        summary[key] = {**ordered[len(ordered) // 2], "qps_runs": [r["qps"] for r in group]}
    return summary


def engine_with_queries(load: list[dict[str, Any]]) -> dict[str, Any]:
    """The engine over every window a load cell ran in, as one: transfers/s and CPU shares
    weighted by time, the median cell's transfer p50, the worst cell's p99."""
    weights = [(r["engine"]["ended_ms"] - r["engine"]["started_ms"]) / 1000 for r in load]
    seconds = sum(weights) or 1.0

    def mean(pick: Callable[[dict[str, Any]], float]) -> float:
        return float(sum(pick(r) * w for r, w in zip(load, weights, strict=True)) / seconds)

    def share(role: str) -> float:
        return mean(lambda r: float(r["engine"]["cpu"].get(role, 0.0)))

    p50s = sorted(r["engine"]["latency_ms"]["p50"] for r in load)
    return {
        "tps": mean(lambda r: r["engine"]["tps"]),
        "latency_ms": {"p50": p50s[len(p50s) // 2],
                       "p99": max(r["engine"]["latency_ms"]["p99"] for r in load)},
        "cpu": {role: share(role) for role in ("workers", "machine")},
        "qps": sum(r["queries"] for r in load) / sum(r["seconds"] for r in load),
    }  # fmt: skip


def _fmt(value: float, digits: int = 0) -> str:
    return "-" if math.isnan(value) else f"{value:,.{digits}f}"  # NaN: no query answered


def print_tables(report: dict[str, Any]) -> None:
    idle, load = summarize(report["idle"]), summarize(report["load"])
    table = Table(title=f"live point queries, bank on {WORKERS} workers (latency ms per query)")
    for column in ("level", "keys", "in flight", "idle q/s", "idle keys/s", "p50", "p99",
                   "load q/s", "load keys/s", "p50", "p99", "engine tx/s", "errors"):  # fmt: skip
        table.add_column(column, justify="right")
    for key in sorted(idle.keys() | load.keys(),
                      key=lambda k: (LEVELS.index(k[0]), k[1], -k[2])):  # fmt: skip
        cells = []
        for row in (idle.get(key), load.get(key)):
            if row is None:
                cells += ["", "", "", ""]
                continue
            lat = row["latency_ms"]
            cells += [_fmt(row["qps"]), _fmt(row["keys_per_s"]), _fmt(lat["p50"], 2),
                      _fmt(lat["p99"], 2)]  # fmt: skip
        errors = sum(r["errors"] + r["missing"] for r in (idle.get(key), load.get(key)) if r)
        engine = load[key]["engine"]["tps"] if key in load else float("nan")
        table.add_row(key[0], str(key[1]), str(key[2]), *cells, _fmt(engine),
                      str(errors) if errors else "")  # fmt: skip
    console.print(table)
    print_engine(report)
    console.print(f"[dim]{NOTE}[/dim]")


def print_engine(report: dict[str, Any]) -> None:
    table = Table(title="the engine's throughput (transfers/s at its egress), with and without "
                        "queries")  # fmt: skip
    for column in ("run", "queries", "q/s", "tx/s", "transfer p50 ms", "p99 ms", "workers CPU",
                   "machine busy"):  # fmt: skip
        table.add_column(column, justify="right")
    for label, row in (("peak (backlog drain)", report.get("peak")),
                       ("peak with queries", report.get("peak_with_queries"))):  # fmt: skip
        if row:
            q = row["query"]
            table.add_row(label, f"{q['level']} {q['keys']}k x{q['in_flight']}" if q else "none",
                          _fmt(q["qps"]) if q else "", _fmt(row["tps"]), "", "",
                          f"{row['cpu'].get('workers', 0):.0%}",
                          f"{row['cpu'].get('machine', 0):.0%}")  # fmt: skip
    rate = report["rate"]
    windows = [(f"{rate:,}/s fed, {label}", "none", float("nan"), window)
               for label, window in zip(("before the queries", "after the queries"),
                                        report["engine_without_queries"], strict=True)]  # fmt: skip
    for level in dict.fromkeys(r["level"] for r in report["load"]):
        engine = engine_with_queries([r for r in report["load"] if r["level"] == level])
        windows.append((f"{rate:,}/s fed, queries running", level, engine["qps"], engine))
    for label, level, qps, window in windows:
        lat, cpu = window["latency_ms"], window["cpu"]
        table.add_row(label, level, _fmt(qps), _fmt(window["tps"]), _fmt(lat["p50"]),
                      _fmt(lat["p99"]), f"{cpu.get('workers', 0):.0%}",
                      f"{cpu.get('machine', 0):.0%}")  # fmt: skip
    console.print(table)


def plot(path: Path, report: dict[str, Any]) -> bool:
    """q/s and p99 against keys per query, per level (idle solid, load dashed), and the
    engine's transfers/s with and without queries; False (and a note) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        console.print("no matplotlib: no PNG (pip install matplotlib)")
        return False
    fig, axes = plt.subplots(1, 3, figsize=(17, 5))
    many = max(report["args"]["in_flight"])
    for phase, style in (("idle", "-"), ("load", "--")):
        summary = summarize(report[phase])
        for i, level in enumerate(report["args"]["levels"]):
            for ax, in_flight, measure in ((axes[0], many, "qps"), (axes[1], 1, "p99")):
                points = sorted((k[1], r) for k, r in summary.items()
                                if k[0] == level and k[2] == in_flight)  # fmt: skip
                xy = [(k, r["qps"] if measure == "qps" else r["latency_ms"]["p99"])
                      for k, r in points]  # fmt: skip
                xy = [(x, y) for x, y in xy if y > 0]  # log scales
                ax.plot([x for x, _ in xy], [y for _, y in xy], style, marker="o", color=f"C{i}",
                        label=f"{level} ({phase})")  # fmt: skip
    axes[0].set(title=f"queries/s, {many} in flight", xlabel="keys per query", ylabel="q/s",
                xscale="log", yscale="log")  # fmt: skip
    axes[1].set(title="p99 latency, 1 in flight", xlabel="keys per query", ylabel="ms",
                xscale="log", yscale="log")  # fmt: skip
    axes[0].legend(fontsize=7)
    bars = _engine_bars(report)
    axes[2].bar(range(len(bars)), list(bars.values()), color="tab:blue")
    axes[2].set_xticks(range(len(bars)), list(bars), rotation=20, fontsize=7, ha="right")
    axes[2].set(title="engine transfers/s at the egress", ylabel="tx/s")
    for i, value in enumerate(bars.values()):
        axes[2].annotate(f"{value:,.0f}", (i, value), ha="center", va="bottom", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def _engine_bars(report: dict[str, Any]) -> dict[str, float]:
    bars: dict[str, float] = {}
    if report.get("peak"):
        bars["peak, no queries"] = report["peak"]["tps"]
    if report.get("peak_with_queries"):
        bars["peak, queries"] = report["peak_with_queries"]["tps"]
    before, after = report["engine_without_queries"]
    bars["fed, no queries"] = (before["tps"] + after["tps"]) / 2
    for level in dict.fromkeys(r["level"] for r in report["load"]):
        rows = [r for r in report["load"] if r["level"] == level]
        bars[f"fed, {level} queries"] = engine_with_queries(rows)["tps"]
    return bars


# --- main -------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, nargs="+", default=[1, 10, 100, 1000],
                        help="keys per query (1: get; more: get_many)")  # fmt: skip
    parser.add_argument("--levels", nargs="+", choices=LEVELS, default=list(LEVELS))
    parser.add_argument("--in-flight", type=int, nargs="+", default=[32, 1],
                        help="queries outstanding at once (a cell for each)")  # fmt: skip
    parser.add_argument("--seconds", type=float, default=4, help="length of a cell")
    parser.add_argument("--serializable-seconds", type=float, default=2,
                        help="length of a SERIALIZABLE cell (a read is a transaction)")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=1, help="runs of each cell (median)")
    parser.add_argument("--transfers", type=int, default=200_000,
                        help="backlog of the peak runs (0: none; needs --load-rate)")  # fmt: skip
    parser.add_argument("--load-rate", type=int, help="transfers/s under load (default: half "
                        "the peak measured first)")  # fmt: skip
    parser.add_argument("--drain-query", default="committed:1",
                        help="LEVEL:KEYS read in the second peak run, or none")  # fmt: skip
    parser.add_argument("--accounts", type=int, default=10_000)
    parser.add_argument("--warmup", type=float, default=3, help="seconds of load before measuring")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop",
                        help="the client's event loop")  # fmt: skip
    parser.add_argument("--port", type=int, default=19392, help="port of the local broker")
    parser.add_argument("--query-port", type=int, default=7950,
                        help="the first cluster's query port (each next one 20 up)")  # fmt: skip
    parser.add_argument("--out", default="bench/results", help="where the JSON and PNG go")
    return parser


def _drain_query(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Cell | None:
    if args.drain_query == "none":
        return None
    level, _, keys = args.drain_query.partition(":")
    if level not in LEVELS or not keys.isdigit():
        parser.error("--drain-query takes LEVEL:KEYS, e.g. committed:1, or none")
    return Cell(level, int(keys), max(args.in_flight), 10**6, "peak")


def _run(args: argparse.Namespace, bootstrap: str, query: Cell | None) -> dict[str, Any]:
    report: dict[str, Any] = {}
    index = 0
    if args.transfers > 0:
        console.print(f"[bold]peak[/bold]: a backlog of {args.transfers:,} transfers")
        report["peak"] = drain(args, bootstrap, index, None)
        console.print(f"  {report['peak']['tps']:,.0f} transfers/s")
        if query is not None:
            console.print(f"[bold]peak with queries[/bold]: {query.label}")
            report["peak_with_queries"] = drain(args, bootstrap, index + 1, query)
            console.print(f"  {report['peak_with_queries']['tps']:,.0f} transfers/s")
        index += 2
    rate = args.load_rate or int(report["peak"]["tps"] / 2)
    return report | steady(args, bootstrap, index, rate)


@cleans_up
def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.transfers <= 0 and args.load_rate is None:
        parser.error("without peak runs (--transfers 0), give --load-rate")
    query = _drain_query(parser, args)
    started = time.monotonic()
    with broker_unless(None, args.port) as broker:
        args.broker_pid = broker.pid or 0
        report = _run(args, broker.bootstrap, query)
    args_json = {k: v for k, v in vars(args).items() if k != "broker_pid"}
    report = {"bench": "queries", "machine": platform.node(), "cpus": os.cpu_count(),
              "note": NOTE, "args": args_json, "minutes": (time.monotonic() - started) / 60,
              **report}  # fmt: skip
    print_tables(report)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"queries-{time.strftime('%Y%m%d-%H%M%S')}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2, default=str))
    plotted = plot(stem.with_suffix(".png"), report)
    console.print(f"results in {stem}.json" + (f" and {stem}.png" if plotted else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
