"""A long run: a backlog of 10,000,000 bank transfers drains without a rollback and with flat
memory.

The bank's drain (:func:`bench.bank.drain`) on the default cluster (2 workers, snapshots on,
strong recovery), once, on a backlog large enough for a leak to show: the RSS of every role
(supervisor, sequencer, each worker and its snapshot process, and the local broker) is sampled
every ``--every`` seconds and charted against the transfers drained so far. Reported:

- throughput, first egress record to last, and that every transfer's egress record came out;
- rollbacks: the generation the status file last showed, and the supervisor's ``rolling back``
  lines in the run's log (a rollback or a rebalance starts a new generation);
- memory per role: its RSS after the warm-up (the first sample once ``--warmup`` of the
  transfers are out), at the end, at its peak, and the slope of a least-squares line through
  the later half of the samples after the warm-up, in MB per million transfers. A role is
  *flat* when that slope would grow less than ``--flat-mb`` (20 MB) from the warm-up to the
  end, judged over at least 1,000,000 transfers after the warm-up (a shorter run reports the
  figures, no verdict). The later half, because a working set that fills up rises early and
  stops, where a leak keeps its slope to the end: over 30,000,000 transfers, worker 0's
  snapshot process (the committer) rose ~40 MB in its first ~70 snapshots (6M transfers), then
  +0.7 MB over the last 20M; a line through all of a 10M run read that rise as a leak. The
  broker's RSS is charted, not judged: it is Kafka's JVM, not epochal;
- money conserved: the cluster stops at a savepoint, and its accounts' balances add up to the
  deposits (a transfer moves money, an overdraft aborts), none below zero. The serial oracle
  (what ``--check`` holds a workload's run to) would replay all 10,000,000: too slow here.

It exits 1 if a rollback happened, the egress records were not one per transfer, money was not
conserved or a role's memory was not flat,
after writing the JSON (with the whole series) and a PNG to ``--out``. Producing the backlog
takes about a minute (~180,000 records/s); the drain, at 15,000-30,000 transfers/s on 2 shared
cores, 6 to 11 minutes.

    epochal bench long                          # 10,000,000 transfers, 2 workers: 7-13 min
    epochal bench long --transfers 300000
    epochal bench long --quick                  # 20,000 transfers: the machinery, not a figure
"""

from __future__ import annotations

import argparse
import bisect
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress

from bench.bank import Drained, drain
from bench.drain import ROOT
from bench.processes import Setup, rollbacks_logged
from bench.report import machine, pyplot, save_figure, write_result
from bench.scratch import broker_unless, cleans_up
from epochal.actors.api import named
from epochal.config import SnapshotConfig
from epochal.recovery.snapshots import DeltaSnapshots
from epochal.schemas.canonical import decode_canonical
from examples.bank.app import Account, app
from examples.bank.producer import OPENING_BALANCE

__all__ = ["describe", "drained_at", "flatness", "main", "memory", "slope", "verdict"]

console = Console(width=None if sys.stdout.isatty() else 160)

TRANSFERS = 10_000_000
QUICK_TRANSFERS = 20_000
WARMUP = 0.1  # of the transfers: what comes out before is start-up, caches and buffers filling
FLAT_MB = 20.0  # growth, fitted, from the warm-up to the end: 10M transfers, ~2 bytes each
STEADY = 0.5  # of the span after the warm-up: the later part, where the line is fitted
MIN_SPAN = 1_000_000  # transfers after the warm-up, for a verdict: a shorter run can't tell a
# leak of a few bytes a transfer from caches and buffers still filling (over 300,000 transfers
# a worker and a snapshot process still grew about 60 MB after the warm-up)
NOT_JUDGED = ("broker",)  # charted, not epochal's memory


def drained_at(timeline: Sequence[tuple[float, int]], at: float) -> int:
    """Transfers out at monotonic time ``at``, from the drain's ``(time, count)`` steps."""
    i = bisect.bisect_right([t for t, _ in timeline], at)
    return timeline[i - 1][1] if i else 0


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The least-squares slope of ``ys`` against ``xs``; ValueError unless two xs differ."""
    n = len(xs)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    spread = sum((x - mean_x) ** 2 for x in xs)
    if spread == 0:
        raise ValueError("a slope needs two different x")
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread


def flatness(
    points: Sequence[tuple[int, float]],
    warm_from: int,
    bound_mb: float = FLAT_MB,
    min_span: int = MIN_SPAN,
) -> dict[str, Any]:
    """One role's memory over the drain, ``(transfers out, RSS MB)`` in order: after the warm-up
    (the first point at ``warm_from`` or later), at the end, at the peak, the slope in MB per
    million transfers fitted over the later half of the points after the warm-up (:data:`STEADY`)
    and the growth it makes from the warm-up to the end. ``flat``: growth under ``bound_mb``;
    None (not judged) with fewer than ``min_span`` transfers after the warm-up, or too few
    points there to fit a line."""
    after = [(x, mb) for x, mb in points if x >= warm_from]
    span = after[-1][0] - after[0][0] if after else 0
    steady = [(x, mb) for x, mb in after if x >= after[0][0] + (1 - STEADY) * span]
    judged: dict[str, Any] = {
        "after_warmup_mb": after[0][1] if after else None,
        "end_mb": points[-1][1],
        "peak_mb": max(mb for _, mb in points),
        "samples": len(after),
        "span": span,
        "slope_mb_per_m": None,
        "growth_mb": None,
        "flat": None,
    }
    try:
        fitted = slope([x / 1e6 for x, _ in steady], [mb for _, mb in steady])
    except (ValueError, ZeroDivisionError):  # no points after the warm-up, or all at one count
        return judged
    growth = fitted * span / 1e6
    flat = growth < bound_mb if span >= min_span else None
    return {**judged, "slope_mb_per_m": fitted, "growth_mb": growth, "flat": flat}


def memory(
    series: Sequence[dict[str, Any]], transfers: int, warmup: float, bound_mb: float
) -> dict[str, dict[str, Any]]:
    """:func:`flatness` of each role in ``series`` (``{"transfers", "rss_mb"}`` samples), the
    warm-up being ``warmup`` of ``transfers``; the broker's numbers with ``flat`` None."""
    roles = sorted({role for s in series for role in s["rss_mb"]})
    judged = {}
    for role in roles:
        points = [(s["transfers"], s["rss_mb"][role]) for s in series if role in s["rss_mb"]]
        judged[role] = flatness(points, int(warmup * transfers), bound_mb)
        if role in NOT_JUDGED:
            judged[role]["flat"] = None
    return judged


def verdict(judged: dict[str, dict[str, Any]]) -> bool | None:
    """True if every judged role was flat, False if one was not, None if none could be judged."""
    flags = [j["flat"] for role, j in judged.items() if role not in NOT_JUDGED]
    if False in flags:
        return False
    return True if flags and all(flags) else None


def describe(role: str, judged: dict[str, Any], bound_mb: float) -> str:
    """One role's memory in a line: ``flat: +3.1 MB over 9.00M transfers (bound 20 MB)``."""
    warm = judged["after_warmup_mb"]
    line = (
        f"{role}: {'-' if warm is None else f'{warm:.0f}'} MB after the warm-up, "
        f"{judged['end_mb']:.0f} at the end, peak {judged['peak_mb']:.0f}"
    )
    if judged["growth_mb"] is None:
        return f"{line}; not judged ({judged['samples']} sample(s) after the warm-up)"
    over = f"{judged['growth_mb']:+.1f} MB over {judged['span'] / 1e6:.2f}M transfers"
    slope_text = f"{judged['slope_mb_per_m']:+.2f} MB per 1M"
    if role in NOT_JUDGED:
        return f"{line}, {slope_text}; {over} (Kafka's JVM: not judged)"
    if judged["flat"] is None:
        return f"{line}, {slope_text}; {over} (too short to judge: {MIN_SPAN / 1e6:.0f}M needed)"
    word = "flat" if judged["flat"] else "NOT flat"
    return f"{line}, {slope_text}; {word}: {over} (bound {bound_mb:.0f} MB)"


def _series(drained: Drained, last: float) -> list[dict[str, Any]]:
    """The sampler's RSS samples, each with the transfers out, up to the first one at or after
    the last egress record (so the series ends with every transfer out, even when a short drain
    fits between two samples)."""
    sampler = drained.cluster.sampler
    series = []
    for t, sample in sampler.series:
        series.append(
            {
                "seconds": round(t, 2),
                "transfers": drained_at(drained.timeline, sampler.began + t),
                "rss_mb": {role: round(mb, 1) for role, mb in sorted(sample.items())},
            }
        )
        if sampler.began + t >= last:
            break
    return series


def conservation(drained: Drained, accounts: int) -> dict[str, Any]:
    """The savepoint the stopped cluster wrote: its accounts' total against the deposits'."""
    setup = drained.cluster.setup
    deposits = accounts * OPENING_BALANCE
    exited = drained.cluster.process.returncode if drained.cluster.process else None
    snapshots = DeltaSnapshots(
        named(app, drained.name),
        SnapshotConfig(str(drained.cluster.run_dir / "warehouse")),
        2 * setup.workers,
    )
    restored = snapshots.restore()
    if restored is None:
        return {"holds": False, "deposits": deposits, "why": "no snapshot", "exit_code": exited}
    balances = [decode_canonical(b, Account).balance for _, b in restored.actors["Account"]]
    total = sum(balances)
    return {
        "holds": total == deposits and min(balances, default=0) >= 0,
        "deposits": deposits,
        "total": total,
        "accounts": len(balances),
        "lowest": min(balances, default=0),
        "epoch": restored.manifest.epoch,
        "exit_code": exited,
    }


def plot(path: Path, series: Sequence[dict[str, Any]], warm_from: int) -> bool:
    """RSS against transfers drained, a line per role, as a PNG; False without matplotlib."""
    plt = pyplot()
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for role in sorted({role for s in series for role in s["rss_mb"]}):
        points = [(s["transfers"] / 1e6, s["rss_mb"][role]) for s in series if role in s["rss_mb"]]
        ax.plot([x for x, _ in points], [y for _, y in points], label=role, linewidth=1)
    ax.axvline(warm_from / 1e6, color="grey", linestyle="--", linewidth=0.8, label="warm-up")
    ax.set_xlabel("transfers drained (millions)")
    ax.set_ylabel("RSS MB")
    ax.set_title("long run: memory of each process against the transfers drained")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))  # off the lines
    save_figure(plt, fig, path)
    return True


def run(args: argparse.Namespace, bootstrap: str, broker_pid: int | None) -> dict[str, Any]:
    """The drain, and what it says about rollbacks, memory and money."""
    setup = Setup(ROOT, args.workers)
    with Progress(console=console, transient=True) as progress:
        drained = drain(
            bootstrap,
            setup,
            args.transfers,
            args.accounts,
            args.port_base,
            broker_pid=broker_pid,
            timeout_s=max(600.0, args.transfers / 1_000),  # 10M: ~3 hours at 1,000/s at worst
            rss_every_s=args.every,
            untracked=("bench",),
            progress=progress,
        )
    last = max((t for t, _ in drained.timeline), default=0.0)
    series = _series(drained, last)
    judged = memory(series, args.transfers, args.warmup, args.flat_mb)
    result = drained.result
    return {
        "bench": "long",
        "args": {k: v for k, v in vars(args).items() if k not in ("out", "bootstrap")},
        "transfers": args.transfers,
        "workers": args.workers,
        "tps": result["tps"],
        "seconds": result["seconds"],
        "egress": drained.timeline[-1][1] if drained.timeline else 0,
        "generation": drained.cluster.sampler.generation,
        "rollbacks": max(result["rollbacks"], rollbacks_logged(drained.cluster.run_dir)),
        "snapshots_taken": result["snapshots_taken"],
        "cpu_us_per_tx": result["cpu_us_per_tx"],
        "conservation": conservation(drained, args.accounts),
        "warmup_transfers": int(args.warmup * args.transfers),
        "flat_mb": args.flat_mb,
        "memory": judged,
        "flat": verdict(judged),
        "series": series,
    }


def passed(report: dict[str, Any]) -> bool:
    """The bar of a long run: no rollback, one egress record per transfer, money conserved, no
    judged role's memory growing."""
    return (
        report["rollbacks"] == 0
        and report["egress"] == report["transfers"]
        and report["conservation"]["holds"]
        and report["flat"] is not False
    )


def _print(report: dict[str, Any]) -> None:
    console.print(
        f"long run: {report['transfers']:,} transfers on {report['workers']} worker(s) in "
        f"{report['seconds']:,.0f} s: {report['tps']:,.0f} transfers/s; "
        f"{report['egress']:,} egress records (receipts and abort reports); "
        f"{report['snapshots_taken']} snapshots"
    )
    console.print(
        f"rollbacks: {report['rollbacks']} (generation {report['generation']} at the end)"
    )
    money = report["conservation"]
    if "total" in money:
        console.print(
            f"money: {money['total']:,} in {money['accounts']:,} accounts at the savepoint "
            f"(epoch {money['epoch']}), {money['deposits']:,} deposited, lowest "
            f"{money['lowest']:,}: {'conserved' if money['holds'] else 'NOT conserved'}"
        )
    else:
        console.print(f"money: not checked, {money['why']} (exit code {money['exit_code']})")
    for role, judged in report["memory"].items():
        console.print(describe(role, judged, report["flat_mb"]))
    flat = {True: "flat", False: "NOT flat", None: "not judged"}[report["flat"]]
    console.print(
        f"memory: {flat} (warm-up: the first {report['warmup_transfers']:,} transfers; a role "
        f"is flat if its fitted RSS grows less than {report['flat_mb']:.0f} MB from there to the "
        f"end, over at least {MIN_SPAN:,} transfers)"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="epochal bench long",
        description=" ".join((__doc__ or "").split("\n\n")[0].split()),  # its first sentence
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--transfers", type=int, default=TRANSFERS, help="the backlog")
    parser.add_argument("--accounts", type=int, default=10_000, help="at most 10,000")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--every", type=float, default=1.0, help="seconds between RSS samples")
    parser.add_argument("--warmup", type=float, default=WARMUP, help="share of the transfers")
    parser.add_argument("--flat-mb", type=float, default=FLAT_MB, help="growth allowed a role")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_TRANSFERS:,} transfers, RSS every 0.2 s: the machinery, not a figure",
    )
    parser.add_argument("--bootstrap", help="an existing broker (default: a local one)")
    parser.add_argument("--port", type=int, default=19_792, help="port of the local broker")
    parser.add_argument("--port-base", type=int, default=20_000, help="the cluster's first port")
    parser.add_argument("--out", type=Path, default=Path("bench/results"), help="where it goes")
    return parser


@cleans_up
def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.quick:
        args.transfers, args.every = QUICK_TRANSFERS, 0.2
    if not 2 <= args.accounts <= 10_000 or args.transfers <= 0 or not 0 <= args.warmup < 1:
        parser.error("--accounts takes 2 to 10,000, --transfers more than 0, --warmup [0, 1)")
    with broker_unless(args.bootstrap, args.port) as broker:  # 10M transfers: gigabytes of log
        report = {**run(args, *broker), "machine": machine(ROOT)}
    _print(report)
    stem = args.out / f"long-{time.strftime('%Y%m%d-%H%M%S')}"
    stem.parent.mkdir(parents=True, exist_ok=True)
    plotted = plot(stem.with_suffix(".png"), report["series"], report["warmup_transfers"])
    path = write_result(stem, report)
    console.print(f"results in {path}" + (f" and {stem}.png" if plotted else ""))
    return 0 if passed(report) else 1


if __name__ == "__main__":
    sys.exit(main())
