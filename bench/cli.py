"""``epochal bench <workload>``: one command for every benchmark, from a checkout of epochal.

Workloads with an app of their own (``ycsbt``, …: :data:`bench.workloads.WORKLOADS`) drain a
backlog through the default cluster on 1 and 2 workers and through their baselines (the
workload's rules in plain Python and the stateless exactly-once pipe, over the same Kafka
batches), ``--repeats`` times interleaved, and report medians: transactions per second, the
ratio to each baseline, CPU microseconds per transaction by role (read from ``/proc``), peak
memory. Their parameters are flags (``--zipf 0.99``). The other benchmarks keep their own flags:
``bank``, ``long``, ``queries``, ``recovery``, ``restart``, ``snapshots``.

``--quick`` is a smoke run for correctness, not for figures: a small backlog, one worker, one
repeat, no baselines, and the run checked against the serial oracle (``--check``, on by default
with ``--quick``). ``epochal bench all --quick`` runs every workload so; ``epochal bench all``
runs every workload in full, then :func:`measures` (the bank on TSpoon's 100,000 accounts, the
long run, queries, snapshots, restart, recovery), and writes BENCHMARKS.md from all of it.

Results go to ``bench/results/<workload>-<date>.json`` (with the machine, versions, commit and
date) and a PNG beside it.

    epochal bench ycsbt --zipf 0.99 --multi-partition 0.25
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
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench import bank, benchmarks_md, long_run, queries, recover, restart, snapshots, sweeps
from bench.client_ordered import client_ordered
from bench.drain import ROOT, CheckFailed, drain_baseline, drain_cluster
from bench.processes import Setup
from bench.report import machine, plot_bars, rate, slug, timed, write_result
from bench.steady import search_sustainable, steady_run
from bench.workloads import WORKLOADS
from bench.workloads.base import Workload
from bench.workloads.leaderboard import Leaderboard
from bench.workloads.tstream import GrepSum, StreamingLedger
from bench.workloads.ycsbt import YcsbT
from epochal.config import CacheConfig, LocalBrokerConfig, cache_dir_from_env
from epochal.jvm import JarSet, fetch_jars
from epochal.log.local_broker import LocalBroker

__all__ = ["main"]

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
flags: epochal bench ycsbt --help. bank, long, queries, recovery, restart and snapshots keep
flags of their own.

long drains a backlog of 10,000,000 bank transfers (--transfers) on 2 workers and reports the
memory of every process against the transfers drained (flat or not), rollbacks, and whether
money was conserved; --quick: 20,000 transfers.

--rate N adds open-loop runs at N transactions per second (latency p50/p99/p99.9 from the
input record's timestamp to its egress record's); --rate search raises the rate by half each
phase until p99 passes 20 times the unloaded p99 or the egress falls behind.

--quick is a smoke run for correctness: 2,000 transactions, 1 worker, once, no baselines, and
each run checked against the serial oracle. Results go to bench/results/ (JSON and PNG);
epochal bench all, without --quick, then also runs bank (TSpoon's 100,000 accounts), long
(10,000,000 transfers), queries, snapshots, restart and recovery, and writes BENCHMARKS.md.

  epochal bench ycsbt --zipf 0.99 --multi-partition 0.25
  epochal bench tstream gs --read-ratio 0.8
  epochal bench leaderboard --rate search
  epochal bench long --quick
  epochal bench all --quick"""
BASELINES = ("workload", "pipe")


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
    parser.add_argument("--sweep", metavar="FIELD=V1,V2", help="run once per value of a parameter")
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
    args.anchor_rates = False
    args.check = args.quick if args.check is None else args.check
    args.baselines = not args.quick if args.baselines is None else args.baselines
    return args


def run_workload(
    workload: Workload, args: argparse.Namespace, bootstrap: str, broker_pid: int | None
) -> dict[str, Any]:
    """Every configuration and baseline ``--repeats`` times, interleaved; the medians."""
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
                    Setup(ROOT, workers),
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
    changed = {k: v for k, v in workload.parameters().items() if v != defaults.get(k)}
    return {
        **_open_loop(workload, args, bootstrap),
        **_client_ordered(workload, args, bootstrap, broker_pid),
        "workload": workload.name,
        "title": " ".join([workload.name, *(f"{k}={v}" for k, v in changed.items())]),
        "parameters": workload.parameters(),
        "description": workload.summary,
        "anchor": workload.anchor,
        "anchor_per_core": workload.anchor_per_core(),
        "transactions": args.transactions,
        "repeats": args.repeats,
        "results": results,
        "baselines": baselines,
    }


def _open_loop(workload: Workload, args: argparse.Namespace, bootstrap: str) -> dict[str, Any]:
    """``--rate``'s runs: each worker count at the rate, or searched, ``--repeats`` times (every
    run is reported)."""
    rate = args.rate or (workload.anchor_rate if args.anchor_rates else None)
    if rate is None:
        return {}
    report: dict[str, Any] = {"steady": [], "search": []}
    for repeat in range(args.repeats):
        for i, workers in enumerate(args.workers):
            setup, port = Setup(ROOT, workers), args.port_base + 1_000 + 10 * i + 100 * repeat
            console.print(f"{workload.name}: {workers} worker(s), open loop {rate}")
            if rate == "search":
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
                        rate=int(rate),
                        seconds=args.seconds,
                        warmup=args.warmup,
                        port_base=port,
                        seed=args.seed,
                    )
                )
    return report


def _client_ordered(
    workload: Workload, args: argparse.Namespace, bootstrap: str, broker_pid: int | None
) -> dict[str, Any]:
    """The leaderboard's votes sent one at a time by a client (:mod:`bench.client_ordered`), on
    the fewest workers drained; not with ``--quick`` (a cluster's start for a figure)."""
    if not isinstance(workload, Leaderboard) or not workload.client_votes or args.quick:
        return {}
    workers = min(args.workers)
    console.print(
        f"{workload.name}: {workers} worker(s), {workload.client_votes} votes client-ordered"
    )
    run = client_ordered(
        workload,
        bootstrap,
        Setup(ROOT, workers),
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
        cpu = ", ".join(f"{role} {us:.1f}" for role, us in r["cpu_us_per_tx"].items())
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
    for r in report.get("steady", []):
        ms = r["latency_ms"]
        console.print(
            f"open loop, {r['workers']} worker(s), {r['rate']:,}/s for {r['seconds']:.0f} s: "
            f"p50 {ms['p50']:.0f} ms, p99 {ms['p99']:.0f} ms, p99.9 {ms['p99.9']:.0f} ms "
            f"({r['counted']:,} counted, {r['missing']} missing, {r['rollbacks']} rollbacks)"
        )
    for r in report.get("search", []):
        steps = ", ".join(
            f"{p['rate']:,}/s p99 {p['latency_ms']['p99']:.0f} ms" + ("" if p["passed"] else " ✗")
            for p in r["phases"]
        )
        console.print(
            f"sustainable, {r['workers']} worker(s): {r['sustainable_tps']:,} tx/s "
            f"(unloaded p99 {r['unloaded_p99_ms']:.0f} ms; {steps})"
        )


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
    path = write_result(stem, report)
    console.print(f"results in {path}" + (f" and {report['png']}" if "png" in report else ""))


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
        return _run(_every_workload(args.quick), args, full=not args.quick)
    if name in WORKLOADS:
        kind = WORKLOADS[name]
        parser = _workload_parser(kind)
        args = _settled(parser, parser.parse_args(rest))
        workload = kind(**{f.name: getattr(args, f.name) for f in dataclasses.fields(kind)})
        field = args.sweep.partition("=")[0].replace("-", "_") if args.sweep else None
        return _run(_swept(parser, workload, args.sweep), args, sweep=field)
    print(f"epochal bench: no workload {name!r}; one of {', '.join(names)}", file=sys.stderr)
    return 2


def _every_workload(quick: bool) -> list[Workload]:
    """Each workload with its defaults; and for a full run YCSB-T also at Styx's extremes too
    (every transaction multi-partition; Zipf 0.99)."""
    defaults = [kind() for kind in WORKLOADS.values()]
    if quick:
        return defaults
    return [*defaults, YcsbT(multi_partition=1.0), YcsbT(zipf=0.99)]


def _swept(
    parser: argparse.ArgumentParser, workload: Workload, sweep: str | None
) -> list[Workload]:
    """``--sweep field=v1,v2``: the workload once per value (a figure's x axis)."""
    if sweep is None:
        return [workload]
    field, _, values = sweep.partition("=")
    field = field.replace("-", "_")
    fields = {f.name: f for f in dataclasses.fields(workload)}
    if field not in fields or not values:
        parser.error(f"--sweep takes FIELD=V1,V2,... with FIELD one of {sorted(fields)}")
    kind: Any = type(fields[field].default)  # every field has a default of its type
    try:
        return [dataclasses.replace(workload, **{field: kind(v)}) for v in values.split(",")]
    except ValueError as exc:
        parser.error(f"--sweep {sweep}: {exc}")


def _run(
    workloads: list[Workload],
    args: argparse.Namespace,
    full: bool = False,
    sweep: str | None = None,
) -> int:
    """Each workload in turn on one broker; ``sweep``: the runs are one sweep of that field;
    ``full`` (``all`` without ``--quick``): then :func:`sweep_plan`'s sweeps and each of
    :func:`measures`, and BENCHMARKS.md from every result."""
    try:
        reports = _run_workloads(workloads, args)
        if sweep is not None:
            _save_sweep(sweeps.summary(reports, sweep), args.out)
        swept = [_sweep(points, field, args) for points, field in sweep_plan()] if full else []
    except CheckFailed as failed:
        console.print(f"[red]the run does not equal the serial oracle:[/] {failed}")
        return 1
    if not full:
        return 0
    facts = reports[0]["machine"]
    ran = [run_measure(name, argv, args.out, facts) for name, argv in measures()]
    written = benchmarks_md.write([*reports, *swept, *ran], ROOT, "epochal bench all")
    console.print(f"wrote {written}")
    return 0 if all(r.get("exit_code") == 0 for r in ran) else 1


def _run_workloads(workloads: list[Workload], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each workload's report, drained on one broker (a local one unless ``--bootstrap``)."""
    broker, bootstrap, broker_pid = None, args.bootstrap, None
    if bootstrap is None:
        jars = fetch_jars(CacheConfig(cache_dir_from_env()), JarSet.KAFKA_BROKER)
        broker = LocalBroker(
            LocalBrokerConfig(port=args.port, data_dir=Path(tempfile.mkdtemp()), jar_dir=jars)
        )
        broker.start()
        bootstrap, broker_pid = broker.config.bootstrap, broker.status().pid
    facts = machine(ROOT)
    reports = []
    try:
        for workload in workloads:
            report = {**run_workload(workload, args, bootstrap, broker_pid), "machine": facts}
            _print(report)
            _save(report, args.out)
            reports.append(report)
    finally:
        if broker is not None:
            broker.stop()
    return reports


def sweep_plan() -> list[tuple[list[Workload], str]]:
    """The sweeps a full ``all`` runs, as TStream's figures do: grep and sum against skew, the
    streaming ledger against the share of multi-partition transactions."""
    return [
        ([GrepSum(zipf=z) for z in (0.0, 0.3, 0.6, 0.9)], "zipf"),
        ([StreamingLedger(multi_partition=m) for m in (0.0, 0.25, 0.5, 1.0)], "multi_partition"),
    ]


SWEEP_TRANSACTIONS = 50_000  # per point, once: a sweep shows a shape, not a figure


def _sweep(points: list[Workload], field: str, args: argparse.Namespace) -> dict[str, Any]:
    """One sweep of a full ``all``: each point once, on a smaller backlog, with the plain
    baseline (the reference line), without open-loop runs."""
    point_args = argparse.Namespace(**vars(args))
    point_args.transactions, point_args.repeats = SWEEP_TRANSACTIONS, 1
    point_args.anchor_rates, point_args.rate = False, None
    summary = sweeps.summary(_run_workloads(points, point_args), field)
    _save_sweep(summary, args.out)
    return summary


def _save_sweep(summary: dict[str, Any], out: Path) -> None:
    stem = out / f"{slug(summary['title'])}-{time.strftime('%Y%m%d-%H%M%S')}"
    if sweeps.plot_lines(stem.with_suffix(".png"), summary):
        summary["png"] = str(stem.with_suffix(".png"))
    console.print("\n".join(sweeps.section(summary, plotted=False)))
    console.print(f"sweep in {write_result(stem, summary)}")


def measures() -> list[tuple[str, list[str]]]:
    """The benchmarks with flags of their own that a full ``all`` runs after the workloads
    (each on a broker of its own, so after the workloads' has stopped), with the flags of the
    figures they are compared with: TSpoon's 100,000 accounts for the bank; 10M transfers on 2
    workers for the long run (two workers and their snapshot processes: every role a cluster
    has, twice; about a minute to produce, 6 to 11 to drain at 15,000-30,000/s); a
    1M-transaction log replayed once (about 5 minutes on 2 cores)."""
    return [
        ("bank", shlex.split("--accounts 100000 --transfers 200000 --workers 1 2 --repeats 3")),
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
