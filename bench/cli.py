"""``epochal bench <workload>``: one command for every benchmark, from a checkout of epochal.

Workloads with an app of their own (``ycsbt``, …: :data:`bench.workloads.WORKLOADS`) drain a
backlog through the default cluster on 1 and 2 workers and through their baselines (the
workload's rules in plain Python and the stateless exactly-once pipe, over the same Kafka
batches), ``--repeats`` times interleaved, and report medians: transactions per second, the
ratio to each baseline, CPU microseconds per transaction by role (read from ``/proc``), peak
memory. Their parameters are flags (``--zipf 0.99``). The other benchmarks keep their own flags:
``bank``, ``queries``, ``recovery``, ``restart``, ``snapshots``.

``--quick`` is a smoke run for correctness, not for figures: a small backlog, one worker, one
repeat, no baselines, and the run checked against the serial oracle (``--check``, on by default
with ``--quick``). ``epochal bench all --quick`` runs every workload so.

Results go to ``bench/results/<workload>-<date>.json`` (with the machine, versions, commit and
date) and a PNG beside it.

    epochal bench ycsbt --zipf 0.99 --multi-partition 0.25
    epochal bench all --quick
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench import bank, queries, recover, restart, snapshots
from bench.drain import ROOT, CheckFailed, drain_baseline, drain_cluster
from bench.processes import Setup
from bench.report import machine, plot_bars, write_result
from bench.workloads import WORKLOADS
from bench.workloads.base import Workload
from epochal.config import CacheConfig, LocalBrokerConfig, cache_dir_from_env
from epochal.jvm import JarSet, fetch_jars
from epochal.log.local_broker import LocalBroker

__all__ = ["main"]

console = Console(width=None if sys.stdout.isatty() else 160)

OWN_FLAGS: dict[str, Callable[[list[str] | None], int]] = {
    "bank": bank.main,
    "queries": queries.main,
    "recovery": recover.main,
    "restart": restart.main,
    "snapshots": snapshots.main,
}
QUICK_TRANSACTIONS = 2_000
USAGE = """\
Workloads with an app of their own drain a backlog through the default cluster on 1 and 2
workers, and through their baselines (the workload's rules in plain Python, and the stateless
exactly-once pipe, over the same Kafka batches): medians of 3 interleaved runs, transactions
per second, ratios, CPU microseconds per transaction by role, peak memory. Their parameters are
flags: epochal bench ycsbt --help. bank, queries, recovery, restart and snapshots keep flags of
their own.

--quick is a smoke run for correctness: 2,000 transactions, 1 worker, once, no baselines, and
each run checked against the serial oracle. Results go to bench/results/ (JSON and PNG).

  epochal bench ycsbt --zipf 0.99 --multi-partition 0.25
  epochal bench tstream gs --read-ratio 0.8
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
    parser.add_argument("--bootstrap", help="an existing broker (default: a local one)")
    parser.add_argument("--port", type=int, default=19_792, help="port of the local broker")
    parser.add_argument("--port-base", type=int, default=20_000, help="the clusters' first port")
    parser.add_argument("--out", type=Path, default=Path("bench/results"), help="where results go")


def _settled(args: argparse.Namespace) -> argparse.Namespace:
    """``--quick``'s defaults, where a flag did not say otherwise."""
    if args.quick:
        args.transactions, args.workers, args.repeats = QUICK_TRANSACTIONS, [1], 1
    args.check = args.quick if args.check is None else args.check
    args.baselines = not args.quick if args.baselines is None else args.baselines
    return args


def run_workload(
    workload: Workload, args: argparse.Namespace, bootstrap: str, broker_pid: int | None
) -> dict[str, Any]:
    """Every configuration and baseline ``--repeats`` times, interleaved; the medians."""
    runs: dict[int, list[dict[str, Any]]] = {w: [] for w in args.workers}
    plain: dict[str, list[dict[str, Any]]] = {k: [] for k in BASELINES if args.baselines}
    partitions = 2 * max(args.workers)
    for repeat in range(args.repeats):
        for i, workers in enumerate(args.workers):
            backlog = workload.backlog(args.transactions, 2 * workers, args.seed)
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
        backlog = workload.backlog(args.transactions, partitions, args.seed)
        for kind, baseline_runs in plain.items():
            baseline_runs.append(drain_baseline(kind, workload, backlog, bootstrap, broker_pid))
    results = [_median(r) for r in runs.values()]
    baselines = [_median(r) for r in plain.values()]
    for r in results:
        r["ratio_to"] = {b["baseline"]: r["tps"] / b["tps"] for b in baselines}
    return {
        "workload": workload.name,
        "parameters": workload.parameters(),
        "anchor": workload.anchor,
        "transactions": args.transactions,
        "repeats": args.repeats,
        "results": results,
        "baselines": baselines,
    }


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
        ratio = r.get("ratio_to", {}).get("plain Python")
        cpu = ", ".join(f"{role} {us:.1f}" for role, us in r["cpu_us_per_tx"].items())
        table.add_row(
            label,
            f"{r['tps']:,.0f}",
            ", ".join(f"{t:,.0f}" for t in r["tps_runs"]),
            "-" if ratio is None else f"{ratio:.2f}x",
            cpu,
        )
    console.print(table)
    for r in report["results"]:
        if "checked" in r:
            console.print(f"checked ({r['workers']} worker(s)): {r['checked']}")


def _save(report: dict[str, Any], out: Path) -> None:
    stem = out / f"{report['workload']}-{time.strftime('%Y%m%d-%H%M%S')}"
    path = write_result(stem, report)
    bars = {
        (r.get("baseline") or f"epochal {r['workers']}w"): r["tps"]
        for r in report["results"] + report["baselines"]
    }
    plotted = plot_bars(stem.with_suffix(".png"), [(report["workload"], "tx/s (median)", bars)])
    console.print(f"results in {path}" + (f" and {stem}.png" if plotted else ""))


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
        kinds = list(WORKLOADS.values())
        parser = argparse.ArgumentParser(prog="epochal bench all")
        common_flags(parser)
        args = _settled(parser.parse_args(rest))
        workloads = [kind() for kind in kinds]
    elif name in WORKLOADS:
        parser = _workload_parser(WORKLOADS[name])
        args = _settled(parser.parse_args(rest))
        fields = {f.name: getattr(args, f.name) for f in dataclasses.fields(WORKLOADS[name])}
        workloads = [WORKLOADS[name](**fields)]
    else:
        print(f"epochal bench: no workload {name!r}; one of {', '.join(names)}", file=sys.stderr)
        return 2
    return _run(workloads, args)


def _run(workloads: list[Workload], args: argparse.Namespace) -> int:
    broker, bootstrap, broker_pid = None, args.bootstrap, None
    if bootstrap is None:
        jars = fetch_jars(CacheConfig(cache_dir_from_env()), JarSet.KAFKA_BROKER)
        broker = LocalBroker(
            LocalBrokerConfig(port=args.port, data_dir=Path(tempfile.mkdtemp()), jar_dir=jars)
        )
        broker.start()
        bootstrap, broker_pid = broker.config.bootstrap, broker.status().pid
    facts = machine(ROOT)
    try:
        for workload in workloads:
            report = {**run_workload(workload, args, bootstrap, broker_pid), "machine": facts}
            _print(report)
            _save(report, args.out)
    except CheckFailed as failed:
        console.print(f"[red]the run does not equal the serial oracle:[/] {failed}")
        return 1
    finally:
        if broker is not None:
            broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
