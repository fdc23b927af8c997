"""Scaling: each workload's drain on every worker count of the run, side by side, as JSON, a PNG
and a BENCHMARKS.md section.

Made from the workload reports a run already has (no run of its own): whether a second worker
pays for itself on a machine whose cores it shares with the broker and the sequencer, workload
by workload, with the plain-Python baseline over the same batches as the bar to reach. A drain
too short to time has no rate here either (:func:`bench.report.timed`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.report import cell, measured, pyplot, save_figure, slug

__all__ = ["plot", "section", "summary"]

PLAIN = "plain Python"


def summary(reports: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per workload report (those without a ``kind``), epochal's rate on each worker count (as
    a string: JSON's keys are) and the plain baseline's; None where untimed or not run."""
    workloads = [r for r in reports if "kind" not in r]
    rows = []
    for report in workloads:
        plain = [b for b in report["baselines"] if b.get("baseline") == PLAIN]
        rows.append(
            {
                "title": report["title"],
                "tps": {str(r["workers"]): measured(r) for r in report["results"]},
                "plain": measured(plain[0]) if plain else None,
            }
        )
    workers = sorted({r["workers"] for report in workloads for r in report["results"]})
    return {
        "kind": "scaling",
        "title": "scaling",
        "workers": workers,
        "transactions": workloads[0]["transactions"] if workloads else 0,
        "repeats": workloads[0]["repeats"] if workloads else 0,
        "machine": workloads[0]["machine"] if workloads else reports[0]["machine"],
        "rows": rows,
    }


def section(scaling: dict[str, Any], plotted: bool) -> list[str]:
    """BENCHMARKS.md lines: a row per workload, its rate on each worker count and the most
    workers' over the fewest's."""
    workers: list[int] = scaling["workers"]
    ratio = f"{workers[-1]}w/{workers[0]}w" if len(workers) > 1 else None
    columns = [f"{w} worker(s), tx/s" for w in workers] + ([ratio] if ratio else [])
    lines = [
        f"## Scaling: {' → '.join(str(w) for w in workers)} workers",
        "",
        f"Each workload's drain above on {' and '.join(str(w) for w in workers)} worker(s) "
        f"(medians of {scaling['repeats']} run(s) of {scaling['transactions']:,} transactions), "
        "with the plain-Python baseline over the same batches for reference. Every worker "
        "shares the machine's cores with the broker, the sequencer and the snapshot processes"
        + (
            f": {ratio} below 1 means the extra workers cost more than they gave." if ratio else "."
        ),
        "",
        "| workload | " + " | ".join([*columns, PLAIN]) + " |",
        "|" + "---|" * (len(columns) + 2),
    ]
    for row in scaling["rows"]:
        tps = [row["tps"].get(str(w)) for w in workers]
        cells = [cell(t) for t in tps]
        if ratio:
            cells.append("-" if tps[0] is None or tps[-1] is None else f"{tps[-1] / tps[0]:.2f}x")
        lines.append("| " + " | ".join([row["title"], *cells, cell(row["plain"])]) + " |")
    lines.append("")
    if plotted:
        lines += [f"![{scaling['title']}](bench/plots/{slug(scaling['title'])}.png)", ""]
    return lines


def plot(path: Path, scaling: dict[str, Any]) -> bool:
    """The PNG: a line per workload, tx/s against workers, and its plain baseline a star of the
    same colour to the right; untimed drains left out. False without matplotlib."""
    plt = pyplot()
    if plt is None:
        return False
    workers: list[int] = scaling["workers"]
    reference = len(workers)  # the x of the plain baselines, past the last worker count
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for i, row in enumerate(scaling["rows"]):
        points = [(x, row["tps"].get(str(w))) for x, w in enumerate(workers)]
        timed_points = [(x, t) for x, t in points if t is not None]
        if timed_points:
            xs, ys = zip(*timed_points, strict=True)
            ax.plot(xs, ys, marker="o", color=f"C{i}", label=row["title"])
        if row["plain"] is not None:
            ax.plot([reference], [row["plain"]], "*", markersize=10, color=f"C{i}")
    ax.set_xticks(range(len(workers) + 1), [*(str(w) for w in workers), PLAIN])
    ax.set_xlim(-0.3, reference + 0.3)
    ax.set_xlabel("workers")
    ax.set_ylabel("tx/s (median)")
    ax.set_yscale("log")  # the baselines run several times faster: every line readable
    ax.set_title("Scaling: drain throughput against workers")
    ax.legend(fontsize=8)
    save_figure(plt, fig, path)
    return True
