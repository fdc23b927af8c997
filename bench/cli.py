"""``epochal bench <workload>``: one command for every benchmark, from a checkout of epochal.

Workloads with an app of their own (``ycsbt``, …: :data:`bench.workloads.WORKLOADS`) drain a
backlog through the default cluster on 1 and 2 workers and through their baselines (the
workload's rules in plain Python and the stateless exactly-once pipe, over the same Kafka
batches), ``--repeats`` times interleaved, and report medians: transactions per second, the
ratio to each baseline, CPU microseconds per transaction by role (read from ``/proc``), peak
memory. Their parameters are flags (``--zipf 0.99``), and so is the clusters' epoch size
(``--epoch-records``, TStream's punctuation interval); ``--sweep FIELD=V1,V2`` runs once per
value of either (:class:`Point`). The other benchmarks keep their own flags: ``bank``,
``long``, ``queries``, ``recovery``, ``restart``, ``snapshots``.

``--quick`` is a smoke run for correctness, not for figures: a small backlog, one worker, one
repeat, no baselines, and the run checked against the serial oracle (``--check``, on by default
with ``--quick``). ``epochal bench all --quick`` runs every workload so; ``epochal bench all``
runs every workload in full (YCSB-T also open loop at its anchor's rate, and searched once:
:func:`_open_loop_plan`), then :func:`sweep_plan`'s sweeps and :func:`measures` (the bank on
10,000 accounts, the long run, queries, snapshots, restart, recovery), and writes
BENCHMARKS.md from all of it, the workloads' scaling (:mod:`bench.scaling`) with it.

Results go to ``bench/results/<workload>-<date>.json`` (with the machine, versions, commit and
date) and a PNG beside it.

    epochal bench ycsbt --zipf 0.99 --multi-partition 0.25
    epochal bench tstream-gs --sweep epoch_records=100,500,2000,5000
    epochal bench all --quick
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench import (
    bank,
    benchmarks_md,
    latency,
    long_run,
    queries,
    recover,
    restart,
    scaling,
    snapshots,
    sweeps,
)
from bench.client_ordered import client_ordered
from bench.drain import ROOT, CheckFailed, drain_baseline, drain_cluster
from bench.processes import Setup
from bench.report import cpu_by_role, machine, plot_bars, rate, slug, timed, write_result
from bench.scratch import broker_unless, cleans_up
from bench.steady import search_sustainable, steady_run
from bench.workloads import WORKLOADS
from bench.workloads.base import Workload
from bench.workloads.leaderboard import Leaderboard
from bench.workloads.tstream import GrepSum, StreamingLedger
from bench.workloads.ycsbt import YcsbT
from epochal.config import ClusterConfig

__all__ = ["Point", "main"]

console = Console(width=None if sys.stdout.isatty() else 160)

OWN_FLAGS: dict[str, Callable[[list[str] | None], int]] = {
    "bank": bank.main,
    "long": long_run.main,
    "queries": queries.main,
    "recovery": recover.main,
    "restart": restart.main,
    "snapshots": snapshots.main,
}
QUICK_TRANSACTIONS = 2_000
QUICK_PHASES, MAX_PHASES = 3, 16  # of a --rate search: --quick smokes its machinery only
USAGE = """\
Workloads with an app of their own drain a backlog through the default cluster on 1 and 2
workers, and through their baselines (the workload's rules in plain Python, and the stateless
exactly-once pipe, over the same Kafka batches): medians of 3 interleaved runs, transactions
per second, ratios, CPU microseconds per transaction by role, peak memory. Their parameters are
flags: epochal bench ycsbt --help; --epoch-records N closes the clusters' epochs after N
records (TStream's punctuation interval; or 20 ms, whichever comes first); --snapshots off, weak
or an interval in ms changes the clusters' snapshots. --sweep FIELD=V1,V2 runs once per value of
a parameter, of epoch_records or of snapshots, and adds the sweep as a table and a line plot
(from the drains: with --transactions 0 and --rate, each point's latency is its own report).
bank, long, queries, recovery, restart and snapshots keep flags of their own.

long drains a backlog of 10,000,000 bank transfers (--transfers) on 2 workers and reports the
memory of every process against the transfers drained (flat or not), rollbacks, and whether
money was conserved; --quick: 20,000 transfers.

--rate N adds open-loop runs at N transactions per second (latency p50/p99/p99.9 from the
input record's timestamp to its egress record's); --rate search raises the rate by half each
phase until p99 passes 20 times the unloaded p99 or the egress falls behind.

--quick is a smoke run for correctness: 2,000 transactions, 1 worker, once, no baselines, and
each run checked against the serial oracle. Results go to bench/results/ (JSON and PNG);
epochal bench all, without --quick, also runs YCSB-T open loop at its anchor's 2,000 tx/s and
searches its sustainable rate once (a throughput-against-latency plot), sweeps as TStream's
figures do (grep and sum over skew, read share, multi-partition length and epoch size; the
streaming ledger and YCSB-T over the multi-partition share), runs bank (10,000 accounts),
long (10,000,000 transfers), queries, snapshots, restart and recovery, and writes
BENCHMARKS.md (with the workloads' scaling from 1 to 2 workers).

  epochal bench ycsbt --zipf 0.99 --multi-partition 0.25
  epochal bench tstream gs --read-ratio 0.8
  epochal bench tstream-gs --sweep epoch_records=100,500,2000,5000
  epochal bench tspoon-bank --workers 1 --rate 15000 --sweep snapshots=default,off
  epochal bench leaderboard --rate search
  epochal bench long --quick
  epochal bench all --quick"""
BASELINES = ("workload", "pipe")
CLUSTER = ClusterConfig()  # epochal run's defaults
# Point's cluster settings (a --sweep may vary them too), each with how a --sweep value reads
CLUSTER_SETTINGS: dict[str, Callable[[str], Any]] = {"epoch_records": int, "snapshots": str}


@dataclass(frozen=True)
class Point:
    """What one report measures: a workload, on clusters with these settings (None: the
    checkout's default, no flag). ``epoch_records``: an epoch closes after this many records
    (or ``epochal run``'s 20 ms): TStream's punctuation interval. ``snapshots``: ``off``,
    ``weak`` (weak recovery) or an interval in ms (what snapshots cost, at a workload's own
    actor count). A sweep's value is one of the workload's fields or one of these settings."""

    workload: Workload
    epoch_records: int | None = None
    snapshots: str | None = None

    def __post_init__(self) -> None:
        if self.epoch_records is not None and self.epoch_records < 1:
            raise ValueError(f"epoch_records: 1 record or more, not {self.epoch_records}")
        known = self.snapshots in {None, "off", "weak", "default"}
        if not known and not (str(self.snapshots).isdigit() and int(str(self.snapshots)) >= 1):
            raise ValueError(f"snapshots: off, weak or an interval in ms, not {self.snapshots!r}")

    def parameters(self) -> dict[str, Any]:
        """The workload's parameters and the settings given: what a report records (and what a
        sweep of either finds its value in)."""
        given = {f: getattr(self, f) for f in CLUSTER_SETTINGS if getattr(self, f) is not None}
        return {**self.workload.parameters(), **given}

    def setup(self, workers: int) -> Setup:
        return Setup(ROOT, workers, self.snapshots or "default", self.epoch_records)


def _workload_parser(kind: type[Workload]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"epochal bench {kind.name}",
        description=(kind.__doc__ or "").splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    for field in dataclasses.fields(kind):
        parser.add_argument(
            f"--{field.name.replace('_', '-')}",
            type=type(field.default),
            default=field.default,
            help=f"a parameter of {kind.name}",
        )
    parser.add_argument(
        "--epoch-records",
        type=int,
        help=f"the clusters close an epoch after this many records or {CLUSTER.epoch_ms} ms, "
        "whichever comes first: TStream's punctuation interval (None: epochal run's "
        f"{CLUSTER.epoch_records})",
    )
    parser.add_argument(
        "--sweep",
        metavar="FIELD=V1,V2",
        help="run once per value of a parameter, of epoch_records or of snapshots",
    )
    parser.add_argument(
        "--snapshots",
        help="off, weak (weak recovery) or an interval in ms (None: epochal run's "
        f"{CLUSTER.snapshot_interval_ms} ms)",
    )
    common_flags(parser)
    return parser


def common_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--transactions", type=int, default=200_000, help="measured, per run")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3, help="runs per configuration (median)")
    parser.add_argument("--seed", type=int, default=1, help="of the backlog")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"a smoke run: {QUICK_TRANSACTIONS:,} transactions, 1 worker, once, "
        "no baselines, checked against the serial oracle",
    )
    parser.add_argument(
        "--check",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="hold each run against the serial oracle (default: with --quick)",
    )
    parser.add_argument(
        "--baselines",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also drain with the plain-Python baselines (default: not --quick)",
    )
    parser.add_argument(
        "--rate",
        help="also open-loop runs at this many transactions/s (latency p50/p99/p99.9), or "
        "'search': raise the rate until p99 passes 20x the unloaded p99 or the egress falls behind",
    )
    parser.add_argument("--seconds", type=float, default=30, help="of an open-loop run")
    parser.add_argument("--warmup", type=float, default=3, help="seconds not counted")
    parser.add_argument("--phase-seconds", type=float, default=5, help="of each search phase")
    parser.add_argument("--bootstrap", help="an existing broker (default: a local one)")
    parser.add_argument("--port", type=int, default=19_792, help="port of the local broker")
    parser.add_argument("--port-base", type=int, default=20_000, help="the clusters' first port")
    parser.add_argument("--out", type=Path, default=Path("bench/results"), help="where results go")


def _settled(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """``--quick``'s defaults, where a flag did not say otherwise; usage errors."""
    if args.rate not in (None, "search") and not str(args.rate).isdigit():
        parser.error(
            f"--rate takes a number of transactions per second or search, not {args.rate!r}"
        )
    if args.quick:
        args.transactions, args.workers, args.repeats = QUICK_TRANSACTIONS, [1], 1
    args.anchor_rates = args.anchor_search = False
    args.check = args.quick if args.check is None else args.check
    args.baselines = not args.quick if args.baselines is None else args.baselines
    return args


def run_workload(
    point: Point, args: argparse.Namespace, bootstrap: str, broker_pid: int | None
) -> dict[str, Any]:
    """Every configuration and baseline ``--repeats`` times, interleaved; the medians."""
    workload = point.workload
    runs: dict[int, list[dict[str, Any]]] = {w: [] for w in args.workers}
    plain: dict[str, list[dict[str, Any]]] = {k: [] for k in BASELINES if args.baselines}
    repeats = args.repeats if args.transactions > 0 else 0
    backlogs = {  # one per layout, made once: every repeat drains the same
        partitions: workload.backlog(args.transactions, partitions, args.seed)
        for partitions in ({2 * w for w in args.workers} if repeats else ())
    }
    for repeat in range(repeats):
        for i, workers in enumerate(args.workers):
            backlog = backlogs[2 * workers]
            port = args.port_base + 10 * i + 100 * repeat
            console.print(f"{workload.name}: {workers} worker(s), run {repeat + 1}")
            runs[workers].append(
                drain_cluster(
                    workload,
                    backlog,
                    bootstrap,
                    point.setup(workers),
                    port_base=port,
                    broker_pid=broker_pid,
                    check=args.check,
                )
            )
        for kind, baseline_runs in plain.items():  # over the widest layout's backlog
            baseline_runs.append(
                drain_baseline(kind, workload, backlogs[max(backlogs)], bootstrap, broker_pid)
            )
    results = [_median(r) for r in runs.values() if r]
    baselines = [_median(r) for r in plain.values() if r]
    for r in results:
        r["ratio_to"] = {b["baseline"]: r["tps"] / b["tps"] for b in baselines}
    defaults = type(workload)().parameters()
    changed = {k: v for k, v in point.parameters().items() if v != defaults.get(k)}
    return {
        **_open_loop(point, args, bootstrap),
        **_client_ordered(point, args, bootstrap, broker_pid),
        "workload": workload.name,
        "title": " ".join([workload.name, *(f"{k}={v}" for k, v in changed.items())]),
        "parameters": point.parameters(),
        "description": workload.summary,
        "anchor": workload.anchor,
        "anchor_per_core": workload.anchor_per_core(),
        "anchor_slowdown": workload.anchor_slowdown,
        "transactions": args.transactions,
        "repeats": args.repeats,
        "results": results,
        "baselines": baselines,
    }


def _open_loop(point: Point, args: argparse.Namespace, bootstrap: str) -> dict[str, Any]:
    """``--rate``'s runs: each worker count at the rate, or searched, ``--repeats`` times (every
    run is reported); see :func:`_open_loop_plan` for what a full ``all`` adds."""
    workload = point.workload
    plan = _open_loop_plan(workload, args)
    if not plan:
        return {}
    report: dict[str, Any] = {"steady": [], "search": []}
    for repeat, fed in plan:
        for i, workers in enumerate(args.workers):
            setup, port = point.setup(workers), args.port_base + 1_000 + 10 * i + 100 * repeat
            console.print(f"{workload.name}: {workers} worker(s), open loop {fed}")
            if fed == "search":
                report["search"].append(
                    search_sustainable(
                        workload,
                        bootstrap,
                        setup,
                        phase_s=args.phase_seconds,
                        port_base=port,
                        seed=args.seed,
                        max_phases=QUICK_PHASES if args.quick else MAX_PHASES,
                    )
                )
            else:
                report["steady"].append(
                    steady_run(
                        workload,
                        bootstrap,
                        setup,
                        rate=int(fed),
                        seconds=args.seconds,
                        warmup=args.warmup,
                        port_base=port,
                        seed=args.seed,
                    )
                )
    return report


def _open_loop_plan(workload: Workload, args: argparse.Namespace) -> list[tuple[int, str]]:
    """The open-loop rounds, ``(repeat, rate or 'search')``, each on every worker count:
    ``--rate``'s ``--repeats`` times. A full ``all`` runs a workload with a latency anchor at
    the anchor's rate (``anchor_rates``) and, on its defaults only, searches once more
    (``anchor_search``): its throughput-against-latency curve, for at most
    :data:`MAX_PHASES` phases of ``--phase-seconds`` per worker count."""
    rate = args.rate or (workload.anchor_rate if args.anchor_rates else None)
    plan = [(repeat, str(rate)) for repeat in range(args.repeats)] if rate else []
    anchored = workload.anchor_rate is not None and workload == type(workload)()
    if args.anchor_search and anchored and rate != "search":
        plan.append((args.repeats, "search"))
    return plan


def _client_ordered(
    point: Point, args: argparse.Namespace, bootstrap: str, broker_pid: int | None
) -> dict[str, Any]:
    """The leaderboard's votes sent one at a time by a client (:mod:`bench.client_ordered`), on
    the fewest workers drained; not with ``--quick`` (a cluster's start for a figure)."""
    workload = point.workload
    if not isinstance(workload, Leaderboard) or not workload.client_votes or args.quick:
        return {}
    workers = min(args.workers)
    console.print(
        f"{workload.name}: {workers} worker(s), {workload.client_votes} votes client-ordered"
    )
    run = client_ordered(
        workload,
        bootstrap,
        point.setup(workers),
        port_base=args.port_base + 2_000,
        broker_pid=broker_pid,
        seed=args.seed,
    )
    return {"client_ordered": run}


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ordered = sorted(runs, key=lambda r: r["tps"])
    return {
        **ordered[len(ordered) // 2],
        "tps_runs": [r["tps"] for r in runs],
        "tps_median": statistics.median(r["tps"] for r in runs),
    }


def _print(report: dict[str, Any]) -> None:
    table = Table(
        title=f"{report['workload']} {report['parameters']}: "
        f"{report['transactions']:,} transactions per run"
    )
    for column in ("system", "tx/s (median)", "runs", "vs plain Python", "CPU µs per tx by role"):
        table.add_column(column, justify="right")
    for r in report["results"] + report["baselines"]:
        label = r.get("baseline") or f"epochal, {r['workers']} worker(s)"
        ratio = r.get("ratio_to", {}).get("plain Python") if timed(r) else None
        cpu = cpu_by_role(r["cpu_us_per_tx"])
        table.add_row(
            label,
            rate(r),
            ", ".join(f"{t:,.0f}" for t in r["tps_runs"]) if timed(r) else "-",
            "-" if ratio is None else f"{ratio:.2f}x",
            cpu,
        )
    console.print(table)
    for r in report["results"]:
        if "checked" in r:
            console.print(f"checked ({r['workers']} worker(s)): {r['checked']}")
    if report.get("client_ordered"):
        console.print(benchmarks_md.client_ordered_line(report))
        console.print(f"checked: {report['client_ordered']['checked']}")
    _print_open_loop(report)


def _print_open_loop(report: dict[str, Any]) -> None:
    """The open-loop runs, a row per configuration (:mod:`bench.latency`); each search's
    phases, which differ from run to run."""
    rows = latency.steady_rows(report.get("steady", []))
    if rows:
        table = Table(title="open loop: latency ms, medians over the runs")
        for column in ("workers", "rate", "seconds", "runs", "p50", "p99", "p99.9"):
            table.add_column(column, justify="right")
        for column in ("p99 of each run", "counted, missing, rollbacks"):
            table.add_column(column, justify="right")
        for row in rows:
            ms = row["latency_ms"]
            table.add_row(
                str(row["workers"]),
                f"{row['rate']:,}/s",
                f"{row['seconds']:g}",
                str(row["runs"]),
                *(f"{ms[q]:.0f}" for q in latency.QUANTILES),
                ", ".join(f"{p:.0f}" for p in row["p99_runs"]),
                f"{row['counted']:,}, {row['missing']}, {row['rollbacks']}",
            )
        console.print(table)
    for row in latency.search_rows(report.get("search", [])):
        console.print(
            f"sustainable, {row['workers']} worker(s): {row['sustainable_tps']:,.0f} tx/s "
            f"(median of {row['runs']} run(s): "
            f"{', '.join(f'{t:,}' for t in row['sustainable_runs'])}; "
            f"unloaded p99 {row['unloaded_p99_ms']:.0f} ms)"
        )
    for r in report.get("search", []):
        steps = ", ".join(
            f"{p['rate']:,}/s p99 {p['latency_ms']['p99']:.0f} ms" + ("" if p["passed"] else " ✗")
            for p in r["phases"]
        )
        console.print(f"  search, {r['workers']} worker(s): {steps}")


def _save(report: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{slug(report['title'])}-{time.strftime('%Y%m%d-%H%M%S')}"
    bars = {
        (r.get("baseline") or f"epochal {r['workers']}w"): r["tps"]
        for r in report["results"] + report["baselines"]
    }
    panels = [(f"{report['workload']}: backlog drain", "tx/s (median)", bars)]
    if report.get("steady"):
        p99 = {
            f"{r['workers']}w at {r['rate']:,}/s": r["latency_ms"]["p99"] for r in report["steady"]
        }
        panels.append(("open loop", "p99 latency ms", p99))
    if report.get("search"):
        found = {f"{r['workers']}w": r["sustainable_tps"] for r in report["search"]}
        panels.append(("sustainable throughput", "tx/s", found))
    panels = [p for p in panels if p[2]]
    if panels and plot_bars(stem.with_suffix(".png"), panels):
        report["png"] = str(stem.with_suffix(".png"))
    curve = stem.with_name(f"{stem.name}-latency.png")
    if latency.plot_curve(curve, report.get("search", []), report["title"]):
        report["curve_png"] = str(curve)
    path = write_result(stem, report)
    pngs = [report[key] for key in benchmarks_md.PNGS if key in report]
    console.print(f"results in {path}" + "".join(f" and {png}" for png in pngs))


@cleans_up
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    names = sorted([*WORKLOADS, *OWN_FLAGS, "all"])
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: epochal bench {{{','.join(names)}}} [flags]\n\n{USAGE}")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name == "tstream" and rest:  # ``tstream gs`` as the paper names it
        name, rest = f"tstream-{rest[0]}", rest[1:]
    if name in OWN_FLAGS:
        sys.argv[0] = f"epochal bench {name}"  # what its usage line says it is
        return OWN_FLAGS[name](rest)
    if name == "all":
        parser = argparse.ArgumentParser(prog="epochal bench all")
        common_flags(parser)
        args = _settled(parser, parser.parse_args(rest))
        args.anchor_rates = not args.quick  # each anchor's latency at the rate it was measured
        args.anchor_search = not args.quick  # and its workload's throughput-latency curve
        return _run([Point(w) for w in _every_workload(args.quick)], args, full=not args.quick)
    if name in WORKLOADS:
        kind = WORKLOADS[name]
        parser = _workload_parser(kind)
        args = _settled(parser, parser.parse_args(rest))
        try:
            workload = kind(**{f.name: getattr(args, f.name) for f in dataclasses.fields(kind)})
            point = Point(workload, args.epoch_records, args.snapshots)
        except ValueError as exc:  # a parameter out of its range: a usage error, not a trace
            parser.error(str(exc))
        field = args.sweep.partition("=")[0].replace("-", "_") if args.sweep else None
        return _run(_swept(parser, point, args.sweep), args, sweep=field)
    print(f"epochal bench: no workload {name!r}; one of {', '.join(names)}", file=sys.stderr)
    return 2


def _every_workload(quick: bool) -> list[Workload]:
    """Each workload with its defaults; and for a full run YCSB-T also at Styx's extremes too
    (every transaction multi-partition; Zipf 0.99)."""
    defaults = [kind() for kind in WORKLOADS.values()]
    if quick:
        return defaults
    return [*defaults, YcsbT(multi_partition=1.0), YcsbT(zipf=0.99)]


def _swept(parser: argparse.ArgumentParser, point: Point, sweep: str | None) -> list[Point]:
    """``--sweep field=v1,v2``: the point once per value (a figure's x axis) of one of the
    workload's fields or of the clusters' settings (:data:`CLUSTER_SETTINGS`)."""
    if sweep is None:
        return [point]
    field, _, values = sweep.partition("=")
    field = field.replace("-", "_")
    fields = {f.name: f for f in dataclasses.fields(point.workload)}
    if field not in {*fields, *CLUSTER_SETTINGS} or not values:
        parser.error(
            "--sweep takes FIELD=V1,V2,... with FIELD one of "
            f"{sorted(fields)} or {sorted(CLUSTER_SETTINGS)}"
        )
    try:
        if field in CLUSTER_SETTINGS:
            read = CLUSTER_SETTINGS[field]
            return [dataclasses.replace(point, **{field: read(v)}) for v in values.split(",")]
        kind: Any = type(fields[field].default)  # every field has a default of its type
        return [
            dataclasses.replace(
                point, workload=dataclasses.replace(point.workload, **{field: kind(v)})
            )
            for v in values.split(",")
        ]
    except ValueError as exc:
        parser.error(f"--sweep {sweep}: {exc}")


def _run(
    points: list[Point],
    args: argparse.Namespace,
    full: bool = False,
    sweep: str | None = None,
) -> int:
    """Each point in turn on one broker; ``sweep``: the runs are one sweep of that field;
    ``full`` (``all`` without ``--quick``): then :func:`sweep_plan`'s sweeps, the workloads'
    scaling, each of :func:`measures`, and BENCHMARKS.md from every result."""
    try:
        reports = _run_workloads(points, args)
        if sweep is not None and args.transactions > 0:  # open loop alone: no drain to sweep
            _save_sweep(sweeps.summary(reports, sweep), args.out)
        swept = [_sweep(points, field, args) for points, field in sweep_plan()] if full else []
    except CheckFailed as failed:
        console.print(f"[red]the run does not equal the serial oracle:[/] {failed}")
        return 1
    if not full:
        return 0
    scaled = _save_scaling(reports, args.out)
    facts = reports[0]["machine"]
    ran = [run_measure(name, argv, args.out, facts) for name, argv in measures()]
    written = benchmarks_md.write([*reports, *scaled, *swept, *ran], ROOT, "epochal bench all")
    console.print(f"wrote {written}")
    return 0 if all(r.get("exit_code") == 0 for r in ran) else 1


def _run_workloads(points: list[Point], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each point's report, drained on one broker (a local one unless ``--bootstrap``)."""
    facts = machine(ROOT)
    reports = []
    with broker_unless(args.bootstrap, args.port) as broker:
        for point in points:
            report = {**run_workload(point, args, *broker), "machine": facts}
            _print(report)
            _save(report, args.out)
            reports.append(report)
    return reports


def sweep_plan() -> list[tuple[list[Point], str]]:
    """The sweeps a full ``all`` runs, as TStream's figures do: grep and sum against skew, the
    streaming ledger against the share of multi-partition transactions, grep and sum (every
    transaction multi-partition) against the most partitions one spans (its 10 keys reach that
    many; 2 workers have 4 partitions, so lengths 2 to 4) and against the epoch size (TStream's
    punctuation interval) and against its share of read-only transactions; and YCSB-T against
    the share of multi-partition transactions, as Styx's does."""
    return [
        ([Point(GrepSum(zipf=z)) for z in (0.0, 0.3, 0.6, 0.9)], "zipf"),
        ([Point(GrepSum(read_ratio=r)) for r in (0.0, 0.5, 1.0)], "read_ratio"),
        (
            [Point(StreamingLedger(multi_partition=m)) for m in (0.0, 0.25, 0.5, 1.0)],
            "multi_partition",
        ),
        (
            [Point(GrepSum(multi_partition=1.0, multi_partition_length=n)) for n in (2, 3, 4)],
            "multi_partition_length",
        ),
        ([Point(GrepSum(), epoch_records=n) for n in (100, 500, 2_000, 5_000)], "epoch_records"),
        ([Point(YcsbT(multi_partition=m)) for m in (0.0, 0.25, 0.5, 1.0)], "multi_partition"),
    ]


SWEEP_TRANSACTIONS = 300_000
"""Per point, once: a sweep shows a shape, not a figure. At 50,000 the plain baseline drained in
under a second (untimed: no reference line) and a 2-worker point could come out in one burst;
the plain baseline runs up to ~160,000 tx/s, so a timed second of it needs well over 160,000."""


def _sweep(points: list[Point], field: str, args: argparse.Namespace) -> dict[str, Any]:
    """One sweep of a full ``all``: each point once, on a smaller backlog, with the plain
    baseline (the reference line), without open-loop runs."""
    point_args = argparse.Namespace(**vars(args))
    point_args.transactions, point_args.repeats = SWEEP_TRANSACTIONS, 1
    point_args.anchor_rates = point_args.anchor_search = False
    point_args.rate = None
    summary = sweeps.summary(_run_workloads(points, point_args), field)
    _save_sweep(summary, args.out)
    return summary


def _save_sweep(summary: dict[str, Any], out: Path) -> None:
    stem = out / f"{slug(summary['title'])}-{time.strftime('%Y%m%d-%H%M%S')}"
    if sweeps.plot_lines(stem.with_suffix(".png"), summary):
        summary["png"] = str(stem.with_suffix(".png"))
    console.print("\n".join(sweeps.section(summary, plotted=False)))
    console.print(f"sweep in {write_result(stem, summary)}")


def _save_scaling(reports: list[dict[str, Any]], out: Path) -> list[dict[str, Any]]:
    """The workloads' drains against their worker counts (:mod:`bench.scaling`), from the
    reports at hand, as JSON and PNG; none with a single worker count (nothing to compare)."""
    summary = scaling.summary(reports)
    if len(summary["workers"]) < 2:
        return []
    stem = out / f"{slug(summary['title'])}-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    if scaling.plot(stem.with_suffix(".png"), summary):
        summary["png"] = str(stem.with_suffix(".png"))
    console.print("\n".join(scaling.section(summary, plotted=False)))
    console.print(f"scaling in {write_result(stem, summary)}")
    return [summary]


def measures() -> list[tuple[str, list[str]]]:
    """The benchmarks with flags of their own that a full ``all`` runs after the workloads
    (each on a broker of its own, so after the workloads' has stopped), with the flags of the
    figures they are compared with: the bank on all 10,000 accounts of its example
    (TSpoon's 100,000 are the ``tspoon-bank`` workload's), with snapshots and without, drained
    and at half its rate (S-QUERY's cost of snapshots to latency); 10M transfers on 2 workers
    for the long run (two workers and their snapshot processes: every role a cluster
    has, twice; about a minute to produce, 6 to 11 to drain at 15,000-30,000/s); a
    1M-transaction log replayed once (about 5 minutes on 2 cores)."""
    return [
        (
            "bank",
            shlex.split(
                "--accounts 10000 --transfers 200000 --workers 1 2 --repeats 3 "
                "--snapshots default off --rate half"
            ),
        ),
        ("long", shlex.split("--transfers 10000000 --workers 2")),
        ("queries", []),
        ("snapshots", []),
        ("restart", shlex.split("--parts kill --repeats 3")),
        ("recovery", shlex.split("--transactions 1000000 --repeats 1")),
    ]


def run_measure(name: str, argv: list[str], out: Path, facts: dict[str, Any]) -> dict[str, Any]:
    """One of :func:`measures` into a fresh folder under ``out``: the JSON it wrote (and its
    PNG), for BENCHMARKS.md. A run that raises is reported, not fatal: the hour of results
    before it still gets written."""
    out.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-", dir=out))
    report: dict[str, Any] = {
        "kind": name,
        "title": name,
        "command": " ".join(["epochal bench", name, *argv]),
        "machine": facts,
    }
    console.print(f"[bold]{report['command']}[/]")
    try:
        code = OWN_FLAGS[name]([*argv, "--out", str(folder)])
    except (Exception, SystemExit) as failed:  # the scripts exit with a message on failure
        console.print(f"[red]{name} failed:[/] {failed!r}")
        return {**report, "error": str(failed) or repr(failed)}
    written = sorted(folder.glob("*.json"))
    if not written:
        return {**report, "error": f"it exited with status {code} and wrote no JSON"}
    pngs = [p for p in (w.with_suffix(".png") for w in written) if p.is_file()]
    return {
        **report,
        "exit_code": code,
        "result": json.loads(written[-1].read_text()),
        **({"png": str(pngs[-1])} if pngs else {}),
    }


if __name__ == "__main__":
    sys.exit(main())
