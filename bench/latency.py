"""Open-loop results as a reader takes them in: the repeats of one configuration as one row.

A report's ``steady`` runs (:func:`bench.steady.steady_run`) and ``search`` runs
(:func:`bench.steady.search_sustainable`) are kept run by run in its JSON; BENCHMARKS.md and the
console show one row per worker count and rate, the medians over the runs beside each run's
figure (their spread), and the search's phases as a throughput-against-latency curve (PNG).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.report import pyplot, save_figure

__all__ = ["plot_curve", "search_rows", "search_table", "steady_rows", "steady_table"]

QUANTILES = ("p50", "p99", "p99.9")


def steady_rows(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per worker count, rate and length, in the order they first ran: how many runs,
    the median of each percentile over them, each run's p99, and what they counted in all."""
    groups: dict[tuple[int, int, float], list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault((run["workers"], run["rate"], run["seconds"]), []).append(run)
    return [
        {
            "workers": workers,
            "rate": rate,
            "seconds": seconds,
            "warmup": group[0].get("warmup"),  # not in the results of before it was recorded
            "runs": len(group),
            "latency_ms": {
                q: statistics.median(r["latency_ms"][q] for r in group) for q in QUANTILES
            },
            "p99_runs": [r["latency_ms"]["p99"] for r in group],
            "counted": sum(r["counted"] for r in group),
            "missing": sum(r["missing"] for r in group),
            "rollbacks": sum(r.get("rollbacks", 0) for r in group),
        }
        for (workers, rate, seconds), group in groups.items()
    ]


def search_rows(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per worker count, in the order they first ran: how many searches, the median
    sustainable rate and unloaded p99 over them, and each search's sustainable rate."""
    groups: dict[int, list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault(run["workers"], []).append(run)
    return [
        {
            "workers": workers,
            "runs": len(group),
            "sustainable_tps": statistics.median(r["sustainable_tps"] for r in group),
            "sustainable_runs": [r["sustainable_tps"] for r in group],
            "unloaded_p99_ms": statistics.median(r["unloaded_p99_ms"] for r in group),
            "phases": max(len(r["phases"]) for r in group),
            "phase_seconds": group[0].get("phase_seconds"),
        }
        for workers, group in groups.items()
    ]


def steady_table(runs: Sequence[dict[str, Any]]) -> list[str]:
    """BENCHMARKS.md lines: the steady runs, a row per configuration (none without runs)."""
    rows = steady_rows(runs)
    if not rows:
        return []
    warmups = {row["warmup"] for row in rows}
    warmup = next(iter(warmups)) if len(warmups) == 1 else None
    left_out = (
        f"the first {warmup:g} s of each run left out"
        if warmup is not None
        else "each run's warm-up left out"
    )
    lines = [
        "Open loop: transactions fed at a fixed rate whatever the cluster does; latency from the "
        f"input record's timestamp to its egress record's, {left_out}; medians over the runs, "
        "and each run's p99 for their spread:",
        "",
        "| workers | rate | seconds | runs | p50 ms | p99 ms | p99.9 ms | p99 of each run, ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ms = row["latency_ms"]
        lines.append(
            f"| {row['workers']} | {row['rate']:,} tx/s | {row['seconds']:g} | {row['runs']} | "
            f"{ms['p50']:.0f} | {ms['p99']:.0f} | {ms['p99.9']:.0f} | "
            f"{', '.join(f'{p:.0f}' for p in row['p99_runs'])} |"
        )
    return [*lines, ""]


def search_table(runs: Sequence[dict[str, Any]]) -> list[str]:
    """BENCHMARKS.md lines: the sustainable-rate searches, a row per worker count."""
    rows = search_rows(runs)
    if not rows:
        return []
    lengths = {row["phase_seconds"] for row in rows}
    phase_s = next(iter(lengths)) if len(lengths) == 1 else None
    each = "" if phase_s is None else f" of {phase_s:g} s"
    lines = [
        f"Sustainable throughput (TSpoon's method): the rate grows by half each phase{each} "
        "until p99 passes 20x the unloaded p99 or the egress falls behind; the last rate that "
        "passed:",
        "",
        "| workers | runs | sustainable tx/s | each run | unloaded p99 ms | phases |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['workers']} | {row['runs']} | **{row['sustainable_tps']:,.0f}** | "
            f"{', '.join(f'{t:,}' for t in row['sustainable_runs'])} | "
            f"{row['unloaded_p99_ms']:.0f} | {row['phases']} |"
        )
    return [*lines, ""]


def plot_curve(path: Path, runs: Sequence[dict[str, Any]], title: str) -> bool:
    """The searches' phases as a PNG: p50 (dashed) and p99 latency against the offered rate, a
    colour per search, the phases that failed crossed; False without phases or matplotlib."""
    searches = [run for run in runs if run["phases"]]
    if not searches:
        return False
    plt = pyplot()
    if plt is None:
        return False
    per_workers = {w: [r for r in searches if r["workers"] == w] for w in _workers(searches)}
    fig, ax = plt.subplots(figsize=(7, 4.5))
    crossed = False
    for i, run in enumerate(searches):
        same = per_workers[run["workers"]]
        label = f"{run['workers']} worker(s)"
        if len(same) > 1:
            label += f", run {same.index(run) + 1}"
        rates = [p["rate"] for p in run["phases"]]
        for q, style in (("p50", "--"), ("p99", "-")):
            ms = [p["latency_ms"][q] for p in run["phases"]]
            ax.plot(rates, ms, style, marker="o", color=f"C{i}", label=f"{label}: {q}")
        failed = [p for p in run["phases"] if not p["passed"]]
        if failed:
            ax.plot(
                [p["rate"] for p in failed],
                [p["latency_ms"]["p99"] for p in failed],
                "x",
                color="black",
                markersize=10,
                label=None if crossed else "phase failed",
            )
            crossed = True
    ax.set_xscale("log")  # the rate grows by half each phase: the phases evenly spaced
    ax.set_yscale("log")  # the failing phase's p99 is 20x the unloaded one: every phase readable
    ax.set_xlabel("offered rate, tx/s")
    ax.set_ylabel("latency ms, input to egress")
    ax.set_title(f"{title}: latency against offered rate")
    ax.legend(fontsize=8)
    save_figure(plt, fig, path)
    return True


def _workers(runs: Sequence[dict[str, Any]]) -> list[int]:
    return list(dict.fromkeys(run["workers"] for run in runs))
