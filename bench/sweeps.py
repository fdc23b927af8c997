"""A sweep: one workload's throughput against one of its parameters or of its clusters' settings
(TStream's figures: skew, multi-partition share and length, punctuation interval: the epoch
size), each configuration a line, as JSON, a PNG and a BENCHMARKS.md section.

``epochal bench tstream-gs --sweep zipf=0,0.3,0.6,0.9`` runs the workload once per value; the
runs' reports, in that order, make the sweep."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.report import cell, measured, pyplot, save_figure, slug
from epochal.config import ClusterConfig

__all__ = ["SWEPT", "plot_lines", "section", "summary"]

_CLUSTER = ClusterConfig()  # epochal run's defaults
# What a swept field is, in words: (its axis, what a value means). A field not here is its name.
SWEPT: dict[str, tuple[str, str]] = {
    "zipf": ("skew (Zipf theta)", "0 is uniform; TStream's default is 0.6"),
    "read_ratio": (
        "share of read-only transactions",
        "grep and sum: a transaction reads its rows and egresses their sum, or writes them all",
    ),
    "multi_partition": (
        "multi-partition share",
        "the share of transactions whose keys lie on more than one partition",
    ),
    "multi_partition_length": (
        "multi-partition length, partitions",
        "the most partitions a multi-partition transaction's keys lie on (TStream's 4). 1 worker "
        "has 2 partitions and 2 workers 4: only lines of 2 workers or more tell the lengths apart",
    ),
    "epoch_records": (
        "epoch size (TStream's punctuation interval), records",
        f"an epoch closes after this many records or after {_CLUSTER.epoch_ms} ms, whichever "
        f"comes first; epochal run's default is {_CLUSTER.epoch_records:,} (`--epoch-records`)",
    ),
    "snapshots": (
        "snapshots",
        f"off, weak (weak recovery), an interval in ms, or default: epochal run's, every "
        f"{_CLUSTER.snapshot_interval_ms:,} ms (`--snapshots`)",
    ),
}


def summary(reports: Sequence[dict[str, Any]], field: str) -> dict[str, Any]:
    """The sweep over ``field`` of the workload's ``reports`` (one per value): per value, each
    epochal configuration's and each baseline's transactions per second (the pipe's records per
    second are no transactions: left out)."""
    first = reports[0]
    points = []
    for report in reports:
        lines = {f"epochal, {r['workers']} worker(s)": measured(r) for r in report["results"]}
        for baseline in report["baselines"]:
            if baseline.get("unit") != "records":
                lines[baseline["baseline"]] = measured(baseline)
        points.append({"value": report["parameters"][field], "tps": lines})
    return {
        "kind": "sweep",
        "workload": first["workload"],
        "field": field,
        "title": f"{first['workload']} sweep {field}",
        "description": first["description"],
        "fixed": {k: v for k, v in first["parameters"].items() if k != field},
        "transactions": first["transactions"],
        "repeats": first["repeats"],
        "machine": first["machine"],
        "points": points,
    }


def section(sweep: dict[str, Any], plotted: bool) -> list[str]:
    """BENCHMARKS.md lines: a row per value, a column per configuration."""
    names = _names(sweep)
    fixed = ", ".join(f"{k} {v}" for k, v in sweep["fixed"].items())
    field = sweep["field"]
    axis, meaning = SWEPT.get(field, (field, ""))
    swept = f"{axis} (`{field}`)" + (f": {meaning}" if meaning else "")
    lines = [
        f"## {sweep['workload']}: throughput against {axis}",
        "",
        f"{sweep['description']}",
        "",
        f"Swept: {swept}. Fixed: {fixed}. {sweep['transactions']:,} measured "
        f"transactions per run, {sweep['repeats']} run(s) per point (median), tx/s:",
        "",
        "| " + " | ".join([sweep["field"], *names]) + " |",
        "|" + "---|" * (len(names) + 1),
    ]
    for point in sweep["points"]:
        cells = [cell(point["tps"].get(name)) for name in names]
        lines.append("| " + " | ".join([str(point["value"]), *cells]) + " |")
    lines.append("")
    if plotted:
        lines += [f"![{sweep['title']}](bench/plots/{slug(sweep['title'])}.png)", ""]
    return lines


def _names(sweep: dict[str, Any]) -> list[str]:
    """The configurations of a sweep, in the order they first ran."""
    return list(dict.fromkeys(name for p in sweep["points"] for name in p["tps"]))


def plot_lines(path: Path, sweep: dict[str, Any]) -> bool:
    """The sweep as a PNG, a line per configuration; False (and a note) without matplotlib."""
    plt = pyplot()
    if plt is None:
        return False
    values = [p["value"] for p in sweep["points"]]
    names = _names(sweep)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in names:
        ys = [p["tps"].get(name) for p in sweep["points"]]
        ax.plot(values, [float("nan") if y is None else y for y in ys], marker="o", label=name)
    axis = SWEPT.get(sweep["field"], (sweep["field"], ""))[0]
    ax.set_xlabel(axis)
    ax.set_ylabel("tx/s (median)")
    ax.set_yscale("log")  # the baselines run several times faster: every line readable
    ax.set_title(f"{sweep['workload']}: throughput against {axis}")
    ax.legend(fontsize=8)
    save_figure(plt, fig, path)
    return True
